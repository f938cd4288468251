// SPDX-License-Identifier: Apache-2.0
#include "stored_values.h"

#include <cstring>

#include "kvcm/parallel_crcs.h"
#include "kvcodec/crc32c.h"

namespace kvcodec::remote {
namespace {

constexpr unsigned char kMagic[4] = {'K', 'V', 'R', 'B'};
constexpr uint16_t kVersion = 1;
constexpr size_t kCheckedHeaderBytes = 44; ///< The bytes the header checksum covers.

template <class T>
T readLe(unsigned char const* p) noexcept
{
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i)
    {
        v |= T(p[i]) << (8 * i);
    }
    return v;
}

} // namespace

int64_t unpackValue(LandedValue const& v, Identity const& identity) noexcept
{
    if (v.storedBytes == 0)
    {
        return kGetMiss;
    }
    unsigned char const* h = v.stored;
    if (v.storedBytes < kHeaderBytes || std::memcmp(h, kMagic, 4) != 0 || readLe<uint16_t>(h + 4) != kVersion
        || readLe<uint16_t>(h + 6) != kHeaderBytes)
    {
        return kGetCorrupt;
    }
    if (readLe<uint32_t>(h + kCheckedHeaderBytes) != crc32cFast(h, kCheckedHeaderBytes))
    {
        return kGetCorrupt;
    }
    uint64_t const payload = readLe<uint64_t>(h + 16);
    if (v.storedBytes - kHeaderBytes != payload)
    {
        return kGetCorrupt;
    }
    if (readLe<uint32_t>(h + 12) != crc32cFast(v.key.data(), v.key.size()))
    {
        return kGetCorrupt;
    }
    if (std::memcmp(h + 28, identity.data(), kIdentityBytes) != 0)
    {
        return kGetMismatch;
    }
    if (payload > v.outBytes)
    {
        return kGetTooSmall;
    }
    if (crc32cCopy(v.out, h + kHeaderBytes, payload) != readLe<uint32_t>(h + 24))
    {
        return kGetCorrupt;
    }
    return int64_t(payload);
}

void unpackValues(LandedValue const* values, size_t count, Identity const& identity, int64_t* results) noexcept
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < count; ++i)
    {
        bytes += values[i].storedBytes;
    }
    // One thread per MiB: a thread starts in tens of microseconds, a MiB is checked and copied in
    // about a hundred.
    kvcm::detail::parallelCrcs(count, bytes, [&](size_t i) { results[i] = unpackValue(values[i], identity); }, 20);
}

} // namespace kvcodec::remote

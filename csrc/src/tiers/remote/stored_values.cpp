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

template <class T>
void writeLe(unsigned char* p, T v) noexcept
{
    for (size_t i = 0; i < sizeof(T); ++i)
    {
        p[i] = static_cast<unsigned char>(v >> (8 * i));
    }
}

constexpr unsigned kBytesPerThreadShift = 20; ///< One thread per MiB of payloads.

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
    kvcm::detail::parallelCrcs(
        count, bytes, [&](size_t i) { results[i] = unpackValue(values[i], identity); }, kBytesPerThreadShift);
}

void packHeaders(ValueToStore const* values, size_t count, Identity const& identity, unsigned char* headers) noexcept
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < count; ++i)
    {
        bytes += values[i].payloadBytes;
    }
    auto pack = [&](size_t i) {
        ValueToStore const& v = values[i];
        unsigned char* h = headers + i * kHeaderBytes;
        std::memcpy(h, kMagic, 4);
        writeLe<uint16_t>(h + 4, kVersion);
        writeLe<uint16_t>(h + 6, uint16_t(kHeaderBytes));
        writeLe<uint32_t>(h + 8, 0);
        writeLe<uint32_t>(h + 12, crc32cFast(v.key.data(), v.key.size()));
        writeLe<uint64_t>(h + 16, v.payloadBytes);
        writeLe<uint32_t>(h + 24, crc32cFast(v.payload, v.payloadBytes));
        std::memcpy(h + 28, identity.data(), kIdentityBytes);
        writeLe<uint32_t>(h + kCheckedHeaderBytes, crc32cFast(h, kCheckedHeaderBytes));
    };
    kvcm::detail::parallelCrcs(count, bytes, pack, kBytesPerThreadShift);
}

} // namespace kvcodec::remote

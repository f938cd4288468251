// SPDX-License-Identifier: Apache-2.0
#include "daemon/values.h"

#include <cstring>

#include "daemon/wire.h"
#include "kvcm/parallel_crcs.h"
#include "kvcodec/crc32c.h"

namespace kvcodec::daemon {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'R', 'B'};
constexpr uint16_t kVersion = 1;
/// The batches below take a thread per MiB: a thread starts in tens of microseconds, a MiB is
/// checked and copied in about a hundred.
constexpr unsigned kBytesPerThreadShift = 20;

uint64_t totalBytes(std::vector<std::pair<void const*, size_t>> const& buffers) noexcept
{
    uint64_t n = 0;
    for (auto const& b : buffers)
        n += b.second;
    return n;
}

} // namespace

void packValueHeader(uint8_t* out, std::string_view key, uint64_t payloadBytes, uint32_t payloadCrc,
    IdentityHash const& identity) noexcept
{
    std::memcpy(out, kMagic, 4);
    storeAt(out, 4, kVersion);
    storeAt(out, 6, uint16_t(kValueHeaderBytes));
    storeAt(out, 8, uint32_t(0));
    storeAt(out, 12, crc32cFast(key.data(), key.size()));
    storeAt(out, 16, payloadBytes);
    storeAt(out, 24, payloadCrc);
    std::memcpy(out + 28, identity.data(), identity.size());
    storeAt(out, 44, crc32cFast(out, 44));
}

int64_t checkValueHeader(uint8_t const* value, uint64_t storedBytes, std::string_view key, IdentityHash const& identity,
    uint32_t* payloadCrc) noexcept
{
    if (storedBytes < kValueHeaderBytes || std::memcmp(value, kMagic, 4) != 0 || loadAt<uint16_t>(value, 4) != kVersion
        || loadAt<uint16_t>(value, 6) != kValueHeaderBytes || loadAt<uint32_t>(value, 44) != crc32cFast(value, 44))
        return kValueCorrupt;
    uint64_t const payloadBytes = loadAt<uint64_t>(value, 16);
    if (storedBytes != kValueHeaderBytes + payloadBytes
        || loadAt<uint32_t>(value, 12) != crc32cFast(key.data(), key.size()))
        return kValueCorrupt;
    if (std::memcmp(value + 28, identity.data(), identity.size()) != 0)
        return kValueMismatch;
    *payloadCrc = loadAt<uint32_t>(value, 24);
    return int64_t(payloadBytes);
}

std::vector<int64_t> unpackValues(std::vector<std::string_view> const& keys,
    std::vector<std::pair<void const*, size_t>> const& stored, std::vector<OutBuffer> const& outs,
    IdentityHash const& identity)
{
    std::vector<int64_t> codes(keys.size());
    auto unpack = [&](size_t i) {
        auto const [value, storedBytes] = stored[i];
        if (storedBytes == 0)
        {
            codes[i] = kValueMiss;
            return;
        }
        auto const* v = static_cast<uint8_t const*>(value);
        uint32_t payloadCrc = 0;
        int64_t const n = checkValueHeader(v, storedBytes, keys[i], identity, &payloadCrc);
        if (n < 0 || uint64_t(n) > outs[i].bytes)
            codes[i] = n < 0 ? n : kValueTooSmall;
        else
            codes[i] = crc32cCopy(outs[i].data, v + kValueHeaderBytes, size_t(n)) == payloadCrc ? n : kValueCorrupt;
    };
    kvcm::detail::parallelCrcs(keys.size(), totalBytes(stored), unpack, kBytesPerThreadShift);
    return codes;
}

void packValueHeaders(std::vector<std::string_view> const& keys,
    std::vector<std::pair<void const*, size_t>> const& payloads, IdentityHash const& identity,
    uint8_t* headers) noexcept
{
    auto pack = [&](size_t i) {
        auto const [payload, bytes] = payloads[i];
        packValueHeader(headers + i * kValueHeaderBytes, keys[i], bytes, crc32cFast(payload, bytes), identity);
    };
    kvcm::detail::parallelCrcs(keys.size(), totalBytes(payloads), pack, kBytesPerThreadShift);
}

} // namespace kvcodec::daemon

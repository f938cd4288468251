// SPDX-License-Identifier: Apache-2.0
#include "daemon/values.h"

#include <cstring>

#include "daemon/wire.h"
#include "kvcodec/crc32c.h"

namespace kvcodec::daemon {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'R', 'B'};
constexpr uint16_t kVersion = 1;

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

} // namespace kvcodec::daemon

// SPDX-License-Identifier: Apache-2.0
#include "daemon/values.h"

#include <cstring>

#include "kvcodec/crc32c.h"

namespace kvcodec::daemon {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'R', 'B'};
constexpr uint16_t kVersion = 1;

template <class T>
void put(uint8_t* out, size_t at, T v) noexcept
{
    std::memcpy(out + at, &v, sizeof v);
}
template <class T>
T get(uint8_t const* in, size_t at) noexcept
{
    T v;
    std::memcpy(&v, in + at, sizeof v);
    return v;
}

} // namespace

void packValueHeader(uint8_t* out, std::string_view key, uint64_t payloadBytes, uint32_t payloadCrc,
    IdentityHash const& identity) noexcept
{
    std::memcpy(out, kMagic, 4);
    put(out, 4, kVersion);
    put(out, 6, uint16_t(kValueHeaderBytes));
    put(out, 8, uint32_t(0));
    put(out, 12, crc32cFast(key.data(), key.size()));
    put(out, 16, payloadBytes);
    put(out, 24, payloadCrc);
    std::memcpy(out + 28, identity.data(), identity.size());
    put(out, 44, crc32cFast(out, 44));
}

int64_t checkValueHeader(uint8_t const* value, uint64_t storedBytes, std::string_view key, IdentityHash const& identity,
    uint32_t* payloadCrc) noexcept
{
    if (storedBytes < kValueHeaderBytes || std::memcmp(value, kMagic, 4) != 0 || get<uint16_t>(value, 4) != kVersion
        || get<uint16_t>(value, 6) != kValueHeaderBytes || get<uint32_t>(value, 44) != crc32cFast(value, 44))
        return kValueCorrupt;
    uint64_t const payloadBytes = get<uint64_t>(value, 16);
    if (storedBytes != kValueHeaderBytes + payloadBytes
        || get<uint32_t>(value, 12) != crc32cFast(key.data(), key.size()))
        return kValueCorrupt;
    if (std::memcmp(value + 28, identity.data(), identity.size()) != 0)
        return kValueMismatch;
    *payloadCrc = get<uint32_t>(value, 24);
    return int64_t(payloadBytes);
}

} // namespace kvcodec::daemon

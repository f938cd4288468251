// SPDX-License-Identifier: Apache-2.0
#include "tiers/disk/crc32c_fast.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace kvcodec::disk {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

struct Tables
{
    uint32_t t[8][256];

    Tables()
    {
        for (uint32_t i = 0; i < 256; ++i)
        {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k)
            {
                c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
            }
            t[0][i] = c;
        }
        for (uint32_t i = 0; i < 256; ++i)
        {
            for (int s = 1; s < 8; ++s)
            {
                t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
            }
        }
    }
};

Tables const& tables()
{
    static Tables const instance;
    return instance;
}

} // namespace

uint32_t crc32cSlicing8(void const* data, size_t bytes, uint32_t crc) noexcept
{
    auto const& t = tables().t;
    auto const* p = static_cast<unsigned char const*>(data);
    crc = ~crc;
    while (bytes >= 8)
    {
        uint64_t word;
        std::memcpy(&word, p, 8); // little-endian hosts only (x86-64, aarch64 LE)
        word ^= crc;
        crc = t[7][word & 0xFF] ^ t[6][(word >> 8) & 0xFF] ^ t[5][(word >> 16) & 0xFF] ^ t[4][(word >> 24) & 0xFF]
            ^ t[3][(word >> 32) & 0xFF] ^ t[2][(word >> 40) & 0xFF] ^ t[1][(word >> 48) & 0xFF] ^ t[0][word >> 56];
        p += 8;
        bytes -= 8;
    }
    while (bytes--)
    {
        crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFFu];
    }
    return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32cHardware(void const* data, size_t bytes, uint32_t crc) noexcept
{
    auto const* p = static_cast<unsigned char const*>(data);
    uint64_t c = ~crc;
    // One dependency chain (8 bytes per ~3 cycles, several GB/s) is far above what a disk
    // sustains, so the multi-stream variant with shift tables is not worth its complexity here.
    while (bytes >= 32)
    {
        uint64_t w0, w1, w2, w3;
        std::memcpy(&w0, p, 8);
        std::memcpy(&w1, p + 8, 8);
        std::memcpy(&w2, p + 16, 8);
        std::memcpy(&w3, p + 24, 8);
        c = _mm_crc32_u64(c, w0);
        c = _mm_crc32_u64(c, w1);
        c = _mm_crc32_u64(c, w2);
        c = _mm_crc32_u64(c, w3);
        p += 32;
        bytes -= 32;
    }
    while (bytes >= 8)
    {
        uint64_t w;
        std::memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        bytes -= 8;
    }
    auto c32 = uint32_t(c);
    while (bytes--)
    {
        c32 = _mm_crc32_u8(c32, *p++);
    }
    return ~c32;
}

bool crc32cHardwareAvailable() noexcept
{
    static bool const has = __builtin_cpu_supports("sse4.2");
    return has;
}
#else
uint32_t crc32cHardware(void const* data, size_t bytes, uint32_t crc) noexcept
{
    return crc32cSlicing8(data, bytes, crc);
}

bool crc32cHardwareAvailable() noexcept
{
    return false;
}
#endif

uint32_t crc32cFast(void const* data, size_t bytes, uint32_t crc) noexcept
{
    return crc32cHardwareAvailable() ? crc32cHardware(data, bytes, crc) : crc32cSlicing8(data, bytes, crc);
}

} // namespace kvcodec::disk

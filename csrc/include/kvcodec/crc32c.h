// SPDX-License-Identifier: Apache-2.0
//
// Fast CRC-32C on the host, header-only so that the SDK, its disk tier and separately compiled
// plugins share one implementation. Same function as the bitwise reference kvcodec::crc32c in
// codec.h (Castagnoli, reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF,
// chainable through `crc`).
//
// Dispatch: the SSE4.2 crc32 instruction on x86-64 (checked once at run time), the ARMv8 CRC32
// extension on AArch64 (checked once at run time on Linux), else slicing-by-8 tables. The
// hardware paths run three independent streams over 3 x 4 KiB blocks and join them with a
// carry-less shift, so one core reaches several GB/s on large buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && !defined(__CUDA_ARCH__)
#include <nmmintrin.h>
#define KVCODEC_CRC32C_X86 1
#elif defined(__aarch64__) && defined(__linux__) && !defined(__CUDA_ARCH__)
#include <arm_acle.h>
#include <sys/auxv.h>
#define KVCODEC_CRC32C_ARM 1
#endif

namespace kvcodec {
namespace crc32c_detail {

inline constexpr uint32_t kPoly = 0x82F63B78u;

struct Tables
{
    uint32_t t[8][256];
};

constexpr Tables makeTables() noexcept
{
    Tables tab{};
    for (uint32_t i = 0; i < 256; ++i)
    {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k)
        {
            c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
        }
        tab.t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
    {
        for (int s = 1; s < 8; ++s)
        {
            tab.t[s][i] = (tab.t[s - 1][i] >> 8) ^ tab.t[0][tab.t[s - 1][i] & 0xFFu];
        }
    }
    return tab;
}

inline constexpr Tables kTables = makeTables();

// Multiplication in GF(2)[x] modulo the reflected polynomial (bit 31 = x^0).
constexpr uint32_t mulMod(uint32_t a, uint32_t b) noexcept
{
    uint32_t product = 0;
    for (int i = 0; i < 32; ++i)
    {
        product ^= (0u - ((b >> 31) & 1u)) & a;
        a = (a >> 1) ^ (kPoly & (0u - (a & 1u)));
        b <<= 1;
    }
    return product;
}

// x^(8 * bytes) mod P in the reflected representation.
constexpr uint32_t shiftOp(uint64_t bytes) noexcept
{
    uint32_t result = 0x80000000u; // x^0
    uint32_t square = 0x00800000u; // x^8 (one byte)
    while (bytes != 0)
    {
        if (bytes & 1u)
        {
            result = mulMod(result, square);
        }
        square = mulMod(square, square);
        bytes >>= 1;
    }
    return result;
}

// Raw (un-inverted) CRC state of `crc` followed by `bytes` zero bytes.
inline constexpr size_t kBlock = 4096;
inline constexpr uint32_t kBlockShift = shiftOp(kBlock);
inline constexpr uint32_t kDoubleBlockShift = shiftOp(2 * kBlock);

inline uint32_t slicing8(unsigned char const* p, size_t bytes, uint32_t state) noexcept
{
    auto const& t = kTables.t;
    while (bytes >= 8)
    {
        uint64_t word;
        std::memcpy(&word, p, 8); // little-endian hosts only (x86-64, aarch64 LE)
        word ^= state;
        state = t[7][word & 0xFF] ^ t[6][(word >> 8) & 0xFF] ^ t[5][(word >> 16) & 0xFF] ^ t[4][(word >> 24) & 0xFF]
            ^ t[3][(word >> 32) & 0xFF] ^ t[2][(word >> 40) & 0xFF] ^ t[1][(word >> 48) & 0xFF] ^ t[0][word >> 56];
        p += 8;
        bytes -= 8;
    }
    while (bytes--)
    {
        state = (state >> 8) ^ t[0][(state ^ *p++) & 0xFFu];
    }
    return state;
}

#if defined(KVCODEC_CRC32C_X86)
#define KVCODEC_CRC32C_TARGET __attribute__((target("sse4.2")))
KVCODEC_CRC32C_TARGET inline uint64_t hw64(uint64_t c, uint64_t w) noexcept
{
    return _mm_crc32_u64(c, w);
}
KVCODEC_CRC32C_TARGET inline uint32_t hw8(uint32_t c, unsigned char b) noexcept
{
    return _mm_crc32_u8(c, b);
}
inline bool hardwareAvailable() noexcept
{
    static bool const has = __builtin_cpu_supports("sse4.2");
    return has;
}
#elif defined(KVCODEC_CRC32C_ARM)
#define KVCODEC_CRC32C_TARGET __attribute__((target("+crc")))
KVCODEC_CRC32C_TARGET inline uint64_t hw64(uint64_t c, uint64_t w) noexcept
{
    return __crc32cd(uint32_t(c), w);
}
KVCODEC_CRC32C_TARGET inline uint32_t hw8(uint32_t c, unsigned char b) noexcept
{
    return __crc32cb(c, b);
}
inline bool hardwareAvailable() noexcept
{
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
    static bool const has = (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
    return has;
}
#endif

#if defined(KVCODEC_CRC32C_TARGET)
KVCODEC_CRC32C_TARGET inline uint32_t hardware(unsigned char const* p, size_t bytes, uint32_t state) noexcept
{
    uint64_t c0 = state;
    // Three independent chains hide the instruction's latency (3 cycles, 1 per cycle issue).
    while (bytes >= 3 * kBlock)
    {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < kBlock; i += 8)
        {
            uint64_t w0, w1, w2;
            std::memcpy(&w0, p + i, 8);
            std::memcpy(&w1, p + kBlock + i, 8);
            std::memcpy(&w2, p + 2 * kBlock + i, 8);
            c0 = hw64(c0, w0);
            c1 = hw64(c1, w1);
            c2 = hw64(c2, w2);
        }
        // state(A||B||C) = shift(state(A), 2 blocks) ^ shift(state(B), 1 block) ^ state(C),
        // where B and C start from a zero state (raw, un-inverted CRCs are linear).
        c0 = mulMod(uint32_t(c0), kDoubleBlockShift) ^ mulMod(uint32_t(c1), kBlockShift) ^ uint32_t(c2);
        p += 3 * kBlock;
        bytes -= 3 * kBlock;
    }
    while (bytes >= 8)
    {
        uint64_t w;
        std::memcpy(&w, p, 8);
        c0 = hw64(c0, w);
        p += 8;
        bytes -= 8;
    }
    auto c32 = uint32_t(c0);
    while (bytes--)
    {
        c32 = hw8(c32, *p++);
    }
    return c32;
}
#endif

} // namespace crc32c_detail

/// CRC-32C by table lookup only (slicing-by-8); always available.
inline uint32_t crc32cSlicing8(void const* data, size_t bytes, uint32_t crc = 0) noexcept
{
    return ~crc32c_detail::slicing8(static_cast<unsigned char const*>(data), bytes, ~crc);
}

/// True when this CPU runs the hardware CRC-32C instruction that crc32cFast() uses.
inline bool crc32cHardwareAvailable() noexcept
{
#if defined(KVCODEC_CRC32C_TARGET)
    return crc32c_detail::hardwareAvailable();
#else
    return false;
#endif
}

/// CRC-32C with the CPU's CRC instruction; only valid when crc32cHardwareAvailable() is true
/// (falls back to slicing-by-8 where the target has no such instruction).
inline uint32_t crc32cHardware(void const* data, size_t bytes, uint32_t crc = 0) noexcept
{
    auto const* p = static_cast<unsigned char const*>(data);
#if defined(KVCODEC_CRC32C_TARGET)
    return ~crc32c_detail::hardware(p, bytes, ~crc);
#else
    return ~crc32c_detail::slicing8(p, bytes, ~crc);
#endif
}

/// CRC-32C with the CPU's CRC instruction when it has one, else slicing-by-8.
inline uint32_t crc32cFast(void const* data, size_t bytes, uint32_t crc = 0) noexcept
{
    auto const* p = static_cast<unsigned char const*>(data);
#if defined(KVCODEC_CRC32C_TARGET)
    if (crc32c_detail::hardwareAvailable())
    {
        return ~crc32c_detail::hardware(p, bytes, ~crc);
    }
#endif
    return ~crc32c_detail::slicing8(p, bytes, ~crc);
}

} // namespace kvcodec

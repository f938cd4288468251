// SPDX-License-Identifier: Apache-2.0
//
// nvfp4: the scalar arithmetic of blob format 1, shared by the CPU reference and the CUDA kernel.
// Every function here is host+device code built without FMA contraction and without fast-math
// (CMakeLists.txt), and uses only IEEE fp32 operations rounded to nearest even (divisions too), so
// both implementations produce the same bytes by construction. tests/nvfp4_reference.py is an
// independent numpy model of the same arithmetic; the tests hold the codec to it byte for byte.
//
// One 16-element block of a quantized buffer (n <= 16 elements x, converted exactly to fp32), with
// S the fp32 scale of its group (a head of the page or the whole page, codec.h):
//   S     = max(amax_group / 2688, 2^-126)          2688 = 6 * 448: e2m1 max times e4m3 max
//   t     = amax_block / (S * 6)                     <= 448 up to rounding: fits e4m3
//   sb    = e4m3_rne_satfinite(t)                    the stored block scale (e4m3fn code)
//   bs    = e4m3_value(sb) * S                       the block's effective scale
//   code  = sign(x) | e2m1_rne_satfinite(|x| / bs)   4 bits; 0 when bs == 0 or x is NaN
// amax is taken over finite elements only. Decoding: y = hot_rne_satfinite(e2m1_value(code) * bs).
#pragma once

#include <cstdint>
#include <cstring>

#include "kvcodec/quantization.h"

#if defined(__CUDACC__)
#define NVFP4_HD __host__ __device__ __forceinline__
#else
#define NVFP4_HD inline
#endif

namespace nvfp4_codec {

inline constexpr float kE2m1Max = 6.0f;
inline constexpr float kGlobalDivisor = 2688.0f;          ///< e2m1 max (6) * e4m3 max (448).
inline constexpr float kMinGlobalScale = 1.17549435e-38f; ///< 2^-126: S stays normal, 1/S finite.
inline constexpr uint32_t kBlockElems = 16;

using kvcodec::bitsFloat;
using kvcodec::floatBits;

NVFP4_HD float mulRn(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

NVFP4_HD float subRn(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

NVFP4_HD float divRn(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

/// Rounds a non-negative float below 2^22 to an integer, ties to even (adding and subtracting
/// 2^23 leaves exactly the rounded value under round-to-nearest-even).
NVFP4_HD float roundHalfEven(float v)
{
#if defined(__CUDA_ARCH__)
    return __fsub_rn(__fadd_rn(v, 8388608.0f), 8388608.0f);
#else
    float const t = v + 8388608.0f; // not folded: built without fast-math
    return t - 8388608.0f;
#endif
}

NVFP4_HD bool isFiniteBits(uint32_t u)
{
    return (u & 0x7F800000u) != 0x7F800000u;
}

/// Exact fp32 value of a bf16 (dtype 3) or fp16 (dtype 2) element.
NVFP4_HD float halfToFloat(uint16_t h, bool bf16)
{
    if (bf16)
    {
        return bitsFloat(uint32_t(h) << 16);
    }
    uint32_t const sign = uint32_t(h & 0x8000u) << 16;
    uint32_t const exp = (h >> 10) & 0x1Fu;
    uint32_t const mant = h & 0x3FFu;
    if (exp == 0x1F)
    {
        return bitsFloat(sign | 0x7F800000u | (mant << 13));
    }
    if (exp == 0)
    {
        float const v = float(mant) * 5.9604645e-8f; // mant * 2^-24, exact
        return sign ? -v : v;
    }
    return bitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// fp32 -> bf16 or fp16, round to nearest even, saturating to the largest finite value (a
/// decoded element is never infinite; NaN does not occur: decoded values are finite products).
NVFP4_HD uint16_t floatToHalfSat(float f, bool bf16)
{
    uint32_t const u = floatBits(f);
    uint32_t const a = u & 0x7FFFFFFFu;
    if (bf16)
    {
        uint16_t const sign = uint16_t((u >> 16) & 0x8000u);
        if (a >= 0x7F7F8000u) // rounds to infinity (or is infinite): the largest finite bf16
        {
            return uint16_t(sign | 0x7F7Fu);
        }
        return uint16_t(sign | ((a + 0x7FFFu + ((a >> 16) & 1u)) >> 16));
    }
    uint16_t const sign = uint16_t((u >> 16) & 0x8000u);
    if (a >= 0x477FF000u) // >= 65520 rounds to infinity: the largest finite fp16 (65504)
    {
        return uint16_t(sign | 0x7BFFu);
    }
    if (a < 0x38800000u) // below 2^-14: an fp16 subnormal, |f| / 2^-24 rounded (exact scaling)
    {
        return uint16_t(sign | uint32_t(roundHalfEven(mulRn(bitsFloat(a), 16777216.0f))));
    }
    uint32_t const r = (a + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    return uint16_t(sign | (r - (112u << 10)));
}

/// Non-negative finite fp32 -> e4m3fn code, round to nearest even, saturating at 448 (0x7E).
NVFP4_HD uint8_t e4m3Code(float t)
{
    uint32_t const a = floatBits(t) & 0x7FFFFFFFu;
    if (a >= 0x43E00000u) // >= 448
    {
        return 0x7E;
    }
    if (a < 0x3C800000u) // below 2^-6: subnormal, t / 2^-9 rounded; 8 is the smallest normal's code
    {
        return uint8_t(roundHalfEven(mulRn(bitsFloat(a), 512.0f)));
    }
    uint32_t const r = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
    uint32_t const code = r - (120u << 3);
    return uint8_t(code > 0x7Eu ? 0x7Eu : code);
}

/// Exact value of an e4m3fn code below 0x7F (the codec writes no other).
NVFP4_HD float e4m3Value(uint8_t c)
{
    uint32_t const exp = (c >> 3) & 0xFu;
    uint32_t const mant = c & 7u;
    // A subnormal is mant * 2^-9 = (2^-6 + mant * 2^-9) - 2^-6: exact, and no integer conversion.
    float const v = exp == 0 ? subRn(bitsFloat((121u << 23) | (mant << 20)), 0.015625f)
                             : bitsFloat(((exp + 120u) << 23) | (mant << 20));
    return (c & 0x80u) ? -v : v;
}

/// |v| -> e2m1 magnitude code (0..7 for 0, 0.5, 1, 1.5, 2, 3, 4, 6), round to nearest even,
/// saturating at 6. NaN gives 0.
NVFP4_HD uint32_t e2m1Magnitude(float v)
{
    // Ties go to the even code: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
    // A sum of comparisons, not branches: the CPU loop vectorizes, and NaN compares false (0).
    return uint32_t(v > 0.25f) + uint32_t(v >= 0.75f) + uint32_t(v > 1.25f) + uint32_t(v >= 1.75f) + uint32_t(v > 2.5f)
        + uint32_t(v >= 3.5f) + uint32_t(v > 5.0f);
}

/// Value of a 4-bit e2m1 code (bit 3 the sign).
NVFP4_HD float e2m1Value(uint32_t code)
{
    // Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 in units of 0.5: 0, 1, 2, 3, 4, 6, 8, 12.
    uint32_t const m = code & 7u;
    uint32_t const halves = m < 4 ? m : (m == 7 ? 12u : 2u * m - 4u);
    float const v = float(halves) * 0.5f;
    return (code & 8u) ? -v : v;
}

/// The group's fp32 scale S from the largest finite magnitude of the group.
NVFP4_HD float globalScale(float amaxGroup)
{
    float const s = divRn(amaxGroup, kGlobalDivisor);
    return s < kMinGlobalScale ? kMinGlobalScale : s;
}

/// The stored e4m3 block scale of a block whose largest finite magnitude is `amaxBlock`.
NVFP4_HD uint8_t blockScaleCode(float amaxBlock, float s)
{
    return e4m3Code(divRn(amaxBlock, mulRn(s, kE2m1Max)));
}

/// The block's effective scale bs = e4m3_value(sb) * S.
NVFP4_HD float blockScale(uint8_t code, float s)
{
    return mulRn(e4m3Value(code), s);
}

/// A positive double rounded down (toward zero) to fp32.
NVFP4_HD float toFloatDown(double x)
{
#if defined(__CUDA_ARCH__)
    return __double2float_rd(x);
#else
    float const f = float(x); // round to nearest; one step down when that went up
    return double(f) > x ? bitsFloat(floatBits(f) - 1u) : f;
#endif
}

/// A positive double rounded up to fp32.
NVFP4_HD float toFloatUp(double x)
{
#if defined(__CUDA_ARCH__)
    return __double2float_ru(x);
#else
    float const f = float(x);
    return double(f) < x ? bitsFloat(floatBits(f) + 1u) : f;
#endif
}

/// The smallest block scale e2m1ThresholdsFma() takes (2^-100).
inline constexpr float kMinFmaThresholdScale = 0x1p-100f;

#if defined(__CUDACC__)

/// e2m1Thresholds() of a block scale bs >= kMinFmaThresholdScale, in fp32: m * bs = c * bs +
/// delta * bs with delta * bs exact (that bound keeps it normal), so one fused multiply-add rounded
/// down (up) gives round_down(m * bs) (round_up) exactly, without fp64 products and conversions.
__device__ __forceinline__ void e2m1ThresholdsFma(float bs, float* t)
{
    float const d = __fmul_rn(bs, 0x1p-26f);
    auto below = [](float x) { return bitsFloat(floatBits(x) - 1u); };
    t[0] = __fmaf_rd(0.25f, bs, d);
    t[1] = below(__fmaf_ru(0.75f, bs, -2.0f * d));
    t[2] = __fmaf_rd(1.25f, bs, 4.0f * d);
    t[3] = below(__fmaf_ru(1.75f, bs, -4.0f * d));
    t[4] = __fmaf_rd(2.5f, bs, 8.0f * d);
    t[5] = below(__fmaf_ru(3.5f, bs, -8.0f * d));
    t[6] = __fmaf_rd(5.0f, bs, 16.0f * d);
}
#endif

/// The seven magnitude thresholds of a block: for a non-NaN magnitude a (fp32),
/// e2m1Magnitude(divRn(a, bs)) == number of i with a > t[i], exactly, with no division.
///
/// Why: q = a / bs rounded to nearest even exceeds a threshold c of e2m1Magnitude() exactly when
/// the real quotient passes the midpoint between c and its neighbour (c + ulp/2 for the strict
/// comparisons, c - ulp/2 inclusive for the others: c has an even last mantissa bit, so a tie goes
/// to c). That midpoint m has at most 25 significant bits and bs 24, so m * bs is exact in fp64,
/// and for fp32 a, a > m * bs is a > round_down(m * bs); a >= m * bs is a > the fp32 just below
/// round_up(m * bs). bs == 0 gives NaN thresholds (every comparison false: magnitude 0).
NVFP4_HD void e2m1Thresholds(float bs, float* t)
{
    if (bs == 0.0f)
    {
        for (int i = 0; i < 7; ++i)
        {
            t[i] = bitsFloat(0x7FC00000u);
        }
        return;
    }
#if defined(__CUDA_ARCH__)
    if (bs >= kMinFmaThresholdScale) // smaller scales take fp64 below
    {
        e2m1ThresholdsFma(bs, t);
        return;
    }
#endif
    double const b = bs;
    t[0] = toFloatDown((0.25 + 0x1p-26) * b);                          // > 0.25
    t[1] = bitsFloat(floatBits(toFloatUp((0.75 - 0x1p-25) * b)) - 1u); // >= 0.75
    t[2] = toFloatDown((1.25 + 0x1p-24) * b);                          // > 1.25
    t[3] = bitsFloat(floatBits(toFloatUp((1.75 - 0x1p-24) * b)) - 1u); // >= 1.75
    t[4] = toFloatDown((2.5 + 0x1p-23) * b);                           // > 2.5
    t[5] = bitsFloat(floatBits(toFloatUp((3.5 - 0x1p-23) * b)) - 1u);  // >= 3.5
    t[6] = toFloatDown((5.0 + 0x1p-22) * b);                           // > 5
}

/// The 4-bit code of one element (fp32 bits `u`) under a block's thresholds: sign and
/// e2m1Magnitude(divRn(|x|, bs)); 0 for NaN, the sign alone when bs == 0. A binary search over
/// the sorted thresholds (three comparisons).
NVFP4_HD uint32_t encodeElement(uint32_t u, float const* t)
{
    uint32_t const a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u)
    {
        return 0u; // NaN
    }
    float const f = bitsFloat(a);
    uint32_t const c4 = f > t[3] ? 4u : 0u;
    uint32_t const c2 = f > (c4 ? t[5] : t[1]) ? 2u : 0u;
    float const t1 = c4 ? (c2 ? t[6] : t[4]) : (c2 ? t[2] : t[0]);
    return ((u >> 28) & 8u) | c4 | c2 | (f > t1 ? 1u : 0u);
}

/// The decoded hot element of a code under the block's effective scale.
NVFP4_HD uint16_t decodeElement(uint32_t code, float bs, bool bf16)
{
    return floatToHalfSat(mulRn(e2m1Value(code), bs), bf16);
}

/// Largest finite magnitude of n elements (fp32 bits), as fp32. Non-negative finite floats order
/// like their bits, so the maximum is exact and independent of the order it is taken in.
NVFP4_HD float finiteAmax(uint32_t const* u, uint32_t n)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; ++i)
    {
        uint32_t const a = u[i] & 0x7FFFFFFFu;
        m = (isFiniteBits(a) && a > m) ? a : m;
    }
    return bitsFloat(m);
}

/// Encodes one block of n <= 16 elements (fp32 bits) under the group scale `s`: writes
/// (n + 1) / 2 code bytes (element i in byte i / 2, low nibble for even i) and returns the block
/// scale code.
NVFP4_HD uint8_t encodeBlock(uint32_t const* u, uint32_t n, float s, uint8_t* codes)
{
    uint8_t const sb = blockScaleCode(finiteAmax(u, n), s);
    float t[7];
    e2m1Thresholds(blockScale(sb, s), t);
    for (uint32_t i = 0; i < n; i += 2)
    {
        uint32_t const lo = encodeElement(u[i], t);
        uint32_t const hi = i + 1 < n ? encodeElement(u[i + 1], t) : 0u;
        codes[i / 2] = uint8_t(lo | (hi << 4));
    }
    return sb;
}

/// The decoded hot bits of the eight non-negative codes of a block (decodeElement()'s); a negative
/// code decodes to its positive twin with the sign bit set (rounding is symmetric, and -0 is 0x8000).
NVFP4_HD void decodeTable(uint8_t sb, float s, bool bf16, uint16_t* lut)
{
    float const bs = blockScale(sb, s);
    lut[0] = 0;
    for (uint32_t c = 1; c < 8; ++c)
    {
        lut[c] = decodeElement(c, bs, bf16);
    }
}

/// Decodes one block of n <= 16 elements into hot bf16/fp16 bits.
NVFP4_HD void decodeBlock(uint8_t const* codes, uint32_t n, uint8_t sb, float s, bool bf16, uint16_t* out)
{
    uint16_t lut[8];
    decodeTable(sb, s, bf16, lut);
    for (uint32_t i = 0; i < n; ++i)
    {
        uint32_t const code = (codes[i / 2] >> (4 * (i & 1u))) & 0xFu;
        out[i] = uint16_t(lut[code & 7u] | ((code & 8u) << 12));
    }
}

} // namespace nvfp4_codec

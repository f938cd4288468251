// SPDX-License-Identifier: Apache-2.0
//
// The fp8 codec's blob format (format version 1) and the scalar arithmetic that both
// implementations share. Everything here is host+device code: the CPU reference and the CUDA
// kernel call the same functions, so their blobs are bit-identical by construction (the one
// exception is fp32 -> fp8, where the GPU uses the cvt.rn.satfinite instruction and the CPU
// uses fp32ToFp8Sat below, which reproduces it; tests pin that equality). The CPU kernels
// (cpu.cpp) use branch-free twins of some of these functions, so that their loops
// vectorize; tests pin those to the functions here.
//
// Blob of one lifecycle (all offsets little-endian, from the blob start):
//
//   for each buffer b of the lifecycle, in LifeCycleDesc order:
//     quantized buffer (role K, V or K-and-V, dtype bf16/fp16/fp32, shaped, not excluded by parameters):
//       codes   : N bytes, one fp8 code per element, in the hot buffer's own element order
//                 ([token][head][dim]); then zero bytes up to a multiple of 16
//       scales  : S little-endian fp32 scales, one per scale block (see Granularity for the
//                 block and its index); then zero bytes up to a multiple of 16
//     lossless buffer (everything else):
//       bytes   : the buffer's hot bytes verbatim; then zero bytes up to a multiple of 16
//
//   A lifecycle that declares no buffers is stored as one lossless buffer per pool covering
//   the whole slot. Cold page bytes = the end of the last region (a multiple of 16).
//
// Quantizing one scale block of elements x (fp32 arithmetic, IEEE round-to-nearest-even):
//   amax = max |x| over the block's finite elements (0 if none)
//   s    = amax / Q, raised to 2^-126 if smaller (Q = 448 for e4m3, 57344 for e5m2)
//   r    = 1 / s
//   code = satfinite_rne_fp8(x * r)         for finite x: never NaN, never above Q
//   code = NaN code (sign of x)             for NaN x, and for +-Inf x with e4m3 (no infinity)
//   code = +-infinity code                  for +-Inf x with e5m2
// Decoding:  y = round_to_hot_dtype(fp8_value(code) * s); a NaN code decodes to the hot
// dtype's canonical quiet NaN with the code's sign.
#pragma once

#include <cstdint>
#include <cstring>

#include "kvcodec/quantization.h"

#if defined(__CUDACC__)
#define KVFP8_HD __host__ __device__ __forceinline__
#else
#define KVFP8_HD inline
#endif

namespace kvcodec::fp8 {

/// Blob format version (pinned by tests/vectors/fp8-v1).
inline constexpr uint32_t kFormatVersion = 1;

/// Alignment of every region inside a blob, so 16-byte vector accesses stay aligned.
inline constexpr uint64_t kRegionAlign = 16;

/// Smallest scale: keeps 1/s finite and every scaled finite element within the fp8 range.
inline constexpr float kMinScale = 1.17549435e-38f; // 2^-126

enum class Format : uint32_t
{
    kE4M3 = 0,
    kE5M2 = 1,
};

/// Scale granularity; the block and the index of its scale in the scales region.
enum class Granularity : uint32_t
{
    kPageHead = 0,  ///< One scale per head of the page: block = [all tokens][head h][all dims], index h.
    kTokenHead = 1, ///< One scale per (token, head): block = [token t][head h][all dims], index t*H + h.
    kPage = 2,      ///< One scale per buffer and page: block = the whole buffer, index 0.
};

/// Largest finite value of the format (the saturation limit Q).
KVFP8_HD float formatMax(Format f)
{
    return f == Format::kE4M3 ? 448.0f : 57344.0f;
}

KVFP8_HD uint64_t alignUp(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/// Rounds a non-negative float below 2^22 to the nearest integer, ties to even. Adding and
/// subtracting 2^23 leaves exactly the rounded integer under IEEE round-to-nearest-even.
KVFP8_HD float roundHalfEvenSmall(float v)
{
#if defined(__CUDA_ARCH__)
    return __fsub_rn(__fadd_rn(v, 8388608.0f), 8388608.0f);
#else
    float const t = v + 8388608.0f; // built without fast-math: not folded
    return t - 8388608.0f;
#endif
}

/// fp32 -> fp8, round to nearest even, saturating to the largest finite value (the software
/// twin of cvt.rn.satfinite.{e4m3,e5m2}x2.f32 for finite input). NaN -> 0x7F | sign;
/// infinity saturates (the codec overrides non-finite codes separately).
inline uint8_t fp32ToFp8Sat(float x, Format f)
{
    uint32_t const u = floatBits(x);
    uint8_t const sign = uint8_t((u >> 24) & 0x80u);
    uint32_t const a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u)
    {
        return uint8_t(sign | 0x7F);
    }
    bool const e4m3 = f == Format::kE4M3;
    uint32_t const mantBits = e4m3 ? 3 : 2;
    uint32_t const bias = e4m3 ? 7 : 15;
    uint8_t const maxCode = e4m3 ? 0x7E : 0x7B;
    // Smallest normal of the format: 2^(1 - bias).
    uint32_t const minNormalBits = (127u + 1u - bias) << 23;
    if (a < minNormalBits)
    {
        // Subnormal range: code = round(|x| / 2^(1 - bias - mantBits)); a carry into 2^mantBits
        // is exactly the smallest normal's code.
        float const scaled = bitsFloat(a) * bitsFloat((127u + bias - 1u + mantBits) << 23);
        return uint8_t(sign | uint32_t(roundHalfEvenSmall(scaled)));
    }
    uint32_t const shift = 23 - mantBits;
    uint32_t const rounded = (a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u)) >> shift;
    uint32_t const code = rounded - ((127u - bias) << mantBits);
    return uint8_t(sign | (code > maxCode ? maxCode : code));
}

/// Exact value of an fp8 code (NaN codes give a NaN, e5m2 infinity codes an infinity).
inline float fp8ToFp32(uint8_t c, Format f)
{
    bool const e4m3 = f == Format::kE4M3;
    uint32_t const mantBits = e4m3 ? 3 : 2;
    uint32_t const bias = e4m3 ? 7 : 15;
    uint32_t const exp = (c & 0x7Fu) >> mantBits;
    uint32_t const mant = c & ((1u << mantBits) - 1u);
    float v;
    if (e4m3 && (c & 0x7Fu) == 0x7Fu)
    {
        v = bitsFloat(0x7FC00000u);
    }
    else if (!e4m3 && exp == 31)
    {
        v = mant ? bitsFloat(0x7FC00000u) : bitsFloat(0x7F800000u);
    }
    else if (exp == 0)
    {
        // mant * 2^(1 - bias - mantBits): both factors exact.
        v = float(mant) * bitsFloat((127u + 1u - bias - mantBits) << 23);
    }
    else
    {
        v = bitsFloat(((exp + 127u - bias) << 23) | (mant << (23 - mantBits)));
    }
    return (c & 0x80u) ? -v : v;
}

/// True for the NaN codes of the format.
KVFP8_HD bool fp8IsNan(uint32_t c, Format f)
{
    return f == Format::kE4M3 ? (c & 0x7Fu) == 0x7Fu : (c & 0x7Fu) > 0x7Cu;
}

/// The code a non-finite element (given its fp32 bits) is stored as.
KVFP8_HD uint32_t nonFiniteCode(uint32_t bits, Format f)
{
    uint32_t const sign = (bits >> 24) & 0x80u;
    bool const isInf = (bits & 0x7FFFFFFFu) == 0x7F800000u;
    return sign | ((f == Format::kE5M2 && isInf) ? 0x7Cu : 0x7Fu);
}

KVFP8_HD bool isFiniteBits(uint32_t bits)
{
    return (bits & 0x7F800000u) != 0x7F800000u;
}

/// fp32 -> bf16 bits, round to nearest even (finite and infinite input; NaN handled by callers).
KVFP8_HD uint16_t fp32ToBf16(float x)
{
    uint32_t const u = floatBits(x);
    return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/// fp32 -> fp16 bits, round to nearest even, overflow to infinity (NaN handled by callers).
KVFP8_HD uint16_t fp32ToFp16(float x)
{
    uint32_t const u = floatBits(x);
    uint16_t const sign = uint16_t((u >> 16) & 0x8000u);
    uint32_t const a = u & 0x7FFFFFFFu;
    if (a >= 0x477FF000u) // >= 65520: rounds to infinity
    {
        return uint16_t(sign | 0x7C00u);
    }
    if (a < 0x38800000u) // below 2^-14: subnormal half, step 2^-24
    {
        float const scaled = bitsFloat(a) * 16777216.0f;
        return uint16_t(sign | uint32_t(roundHalfEvenSmall(scaled)));
    }
    uint32_t const rounded = (a + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    return uint16_t(sign | (rounded - (112u << 10)));
}

/// bf16 / fp16 bits -> fp32 (exact).
KVFP8_HD float bf16ToFp32(uint16_t h)
{
    return bitsFloat(uint32_t(h) << 16);
}

inline float fp16ToFp32(uint16_t h)
{
    uint32_t const sign = uint32_t(h & 0x8000u) << 16;
    uint32_t const exp = (h >> 10) & 0x1Fu;
    uint32_t const mant = h & 0x3FFu;
    if (exp == 0)
    {
        float const v = float(mant) * 5.9604644775390625e-08f; // mant * 2^-24, exact
        return sign ? -v : v;
    }
    if (exp == 31)
    {
        return bitsFloat(sign | 0x7F800000u | (mant << 13));
    }
    return bitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// Canonical quiet NaN bits of each hot dtype, with a sign.
KVFP8_HD uint16_t bf16Nan(uint32_t negative)
{
    return uint16_t(negative ? 0xFFC0u : 0x7FC0u);
}
KVFP8_HD uint16_t fp16Nan(uint32_t negative)
{
    return uint16_t(negative ? 0xFE00u : 0x7E00u);
}
KVFP8_HD uint32_t fp32Nan(uint32_t negative)
{
    return negative ? 0xFFC00000u : 0x7FC00000u;
}

/// The scale of a block from its finite amax, and its reciprocal, as both implementations
/// compute them (IEEE division, round to nearest even).
struct BlockScale
{
    float scale;
    float reciprocal;
};

KVFP8_HD BlockScale blockScale(float amax, Format f)
{
#if defined(__CUDA_ARCH__)
    float s = __fdiv_rn(amax, formatMax(f));
    s = s >= kMinScale ? s : kMinScale;
    return {s, __frcp_rn(s)};
#else
    float s = amax / formatMax(f);
    s = s >= kMinScale ? s : kMinScale;
    return {s, 1.0f / s};
#endif
}

} // namespace kvcodec::fp8

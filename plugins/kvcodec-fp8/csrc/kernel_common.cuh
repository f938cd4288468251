// SPDX-License-Identifier: Apache-2.0
//
// Device code shared by the fp8 kernels (kernel.cu, kernel_tile.cu): the element accesses, the
// fp8 conversions, the scale and code stores of one tile of a warp unit. Internal to the kernel
// sources (an unnamed namespace: every kernel source has its own copy).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernel.h"

namespace kvcodec::fp8 {
namespace {

constexpr int kThreads = int(kBlockThreads);
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr uint32_t kFull = 0xFFFFFFFFu;

constexpr int kBf16 = int(DataType::kBFloat16);
constexpr int kFp16 = int(DataType::kFloat16);
constexpr int kFp32 = int(DataType::kFloat32);

template <int DT>
constexpr int elemBytes()
{
    return DT == kFp32 ? 4 : 2;
}

// Elements per lane access, the 32-bit words they occupy and the accesses a lane caches.
template <int DT, bool VEC, int LB>
struct Access
{
    static constexpr int kElems = VEC ? 16 : 1;
    static constexpr int kWords = VEC ? 16 * elemBytes<DT>() / 4 : 1;
    // LB bytes per lane stay in registers between the two encode passes (128 for v1: a
    // 16-token x 128-dim bf16 block over one warp).
    static constexpr int kCached = int(cachedAccesses(LB, elemBytes<DT>(), VEC));
};

// fp32 bits of element i of a raw access.
template <int DT>
__device__ __forceinline__ uint32_t elemBits(uint32_t const* w, int i)
{
    if constexpr (DT == kFp32)
    {
        return w[i];
    }
    else
    {
        uint32_t const h = (w[i >> 1] >> ((i & 1) * 16)) & 0xFFFFu;
        if constexpr (DT == kBf16)
        {
            return h << 16;
        }
        else
        {
            __half_raw r;
            r.x = static_cast<unsigned short>(h);
            return __float_as_uint(__half2float(__half(r)));
        }
    }
}

// Element bits assembled byte by byte (little-endian): the element path of a buffer whose hot
// elements are not aligned to their size in every slot (BufferPlan::hotAligned == 0).
template <int DT>
__device__ __forceinline__ uint32_t loadBytes(char const* p)
{
    uint32_t u = 0;
#pragma unroll
    for (int i = 0; i < elemBytes<DT>(); ++i)
    {
        u |= uint32_t(static_cast<unsigned char>(p[i])) << (8 * i);
    }
    return u;
}

template <int DT>
__device__ __forceinline__ void storeBytes(char* p, uint32_t u)
{
#pragma unroll
    for (int i = 0; i < elemBytes<DT>(); ++i)
    {
        p[i] = static_cast<char>((u >> (8 * i)) & 0xFFu);
    }
}

// `aligned`: the element path may use one 2- or 4-byte access (the vector path always may).
template <int DT, bool VEC, int LB = 128>
__device__ __forceinline__ void loadRaw(char const* p, uint32_t* w, bool aligned)
{
    if constexpr (VEC)
    {
        auto const* s = reinterpret_cast<uint4 const*>(p);
#pragma unroll
        for (int q = 0; q < Access<DT, VEC, LB>::kWords / 4; ++q)
        {
            uint4 const v = s[q];
            w[4 * q] = v.x, w[4 * q + 1] = v.y, w[4 * q + 2] = v.z, w[4 * q + 3] = v.w;
        }
    }
    else if (!aligned)
    {
        w[0] = loadBytes<DT>(p);
    }
    else if constexpr (DT == kFp32)
    {
        w[0] = *reinterpret_cast<uint32_t const*>(p);
    }
    else
    {
        w[0] = *reinterpret_cast<uint16_t const*>(p);
    }
}

template <int DT, bool VEC, int LB = 128>
__device__ __forceinline__ void storeRaw(char* p, uint32_t const* w, bool aligned)
{
    if constexpr (VEC)
    {
        auto* d = reinterpret_cast<uint4*>(p);
#pragma unroll
        for (int q = 0; q < Access<DT, VEC, LB>::kWords / 4; ++q)
        {
            d[q] = make_uint4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
        }
    }
    else if (!aligned)
    {
        storeBytes<DT>(p, w[0]);
    }
    else if constexpr (DT == kFp32)
    {
        *reinterpret_cast<uint32_t*>(p) = w[0];
    }
    else
    {
        *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(w[0]);
    }
}

// Largest |x| over the finite elements of an access, as fp32 bits (an unsigned max of
// non-negative float bits is the float max).
template <int DT, bool VEC>
__device__ __forceinline__ uint32_t amaxBits(uint32_t const* w)
{
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < Access<DT, VEC, 128>::kElems; ++i)
    {
        uint32_t const a = elemBits<DT>(w, i) & 0x7FFFFFFFu;
        m = max(m, a < 0x7F800000u ? a : 0u);
    }
    return m;
}

// finite_check=block: the largest magnitude of an access in the hot dtype's own bits, NaN and
// Inf included (they compare above every finite value). Two 16-bit elements per instruction.
template <int DT, bool VEC>
__device__ __forceinline__ uint32_t rawMaxBits(uint32_t const* w)
{
    constexpr int kWords = Access<DT, VEC, 128>::kWords;
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < kWords; ++i)
    {
        if constexpr (DT == kFp32)
        {
            m = max(m, w[i] & 0x7FFFFFFFu);
        }
        else
        {
            m = __vmaxu2(m, w[i] & 0x7FFF7FFFu);
        }
    }
    if constexpr (DT != kFp32)
    {
        m = max(m & 0xFFFFu, m >> 16);
    }
    return m;
}

// True when rawMaxBits found a NaN or an infinity.
template <int DT>
__device__ __forceinline__ bool rawNonFinite(uint32_t m)
{
    return DT == kFp32 ? m >= 0x7F800000u : (DT == kBf16 ? m >= 0x7F80u : m >= 0x7C00u);
}

// fp32 bits of the finite magnitude rawMaxBits found: equal to amaxBits' result.
template <int DT>
__device__ __forceinline__ uint32_t rawToAmaxBits(uint32_t m)
{
    uint32_t const w = m;
    return elemBits<DT>(&w, 0);
}

template <int FMT>
__device__ __forceinline__ uint32_t cvtPair(float lo, float hi)
{
    constexpr __nv_fp8_interpretation_t kind = FMT == int(Format::kE4M3) ? __NV_E4M3 : __NV_E5M2;
    return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, kind);
}

// Codes of one access (4 codes per word, element order).
// CHECK false: the caller knows every element is finite (finite_check=block).
template <int DT, int FMT, bool VEC, bool CHECK = true>
__device__ __forceinline__ void quantize(uint32_t const* w, float r, uint32_t* codes)
{
    constexpr int n = Access<DT, VEC, 128>::kElems;
    if constexpr (n == 1)
    {
        uint32_t const b = elemBits<DT>(w, 0);
        uint32_t c = cvtPair<FMT>(__fmul_rn(__uint_as_float(b), r), 0.0f) & 0xFFu;
        codes[0] = (!CHECK || isFiniteBits(b)) ? c : nonFiniteCode(b, Format(FMT));
    }
    else
    {
#pragma unroll
        for (int q = 0; q < n / 4; ++q)
        {
            uint32_t word = 0;
#pragma unroll
            for (int h = 0; h < 2; ++h)
            {
                uint32_t const b0 = elemBits<DT>(w, 4 * q + 2 * h);
                uint32_t const b1 = elemBits<DT>(w, 4 * q + 2 * h + 1);
                uint32_t pair = cvtPair<FMT>(__fmul_rn(__uint_as_float(b0), r), __fmul_rn(__uint_as_float(b1), r));
                uint32_t c0 = pair & 0xFFu;
                uint32_t c1 = pair >> 8;
                if constexpr (CHECK)
                {
                    c0 = isFiniteBits(b0) ? c0 : nonFiniteCode(b0, Format(FMT));
                    c1 = isFiniteBits(b1) ? c1 : nonFiniteCode(b1, Format(FMT));
                }
                word |= (c0 | (c1 << 8)) << (16 * h);
            }
            codes[q] = word;
        }
    }
}

// Hot dtype bits of a decoded value (NaN codes become the canonical NaN).
template <int DT, int FMT, bool CHECK = true>
__device__ __forceinline__ uint32_t decodeValue(uint32_t code, float v, float s)
{
    bool const nan = CHECK && fp8IsNan(code, Format(FMT));
    uint32_t const neg = code & 0x80u;
    float const y = __fmul_rn(v, s);
    if constexpr (DT == kBf16)
    {
        return nan ? bf16Nan(neg) : fp32ToBf16(y);
    }
    else if constexpr (DT == kFp16)
    {
        return nan ? fp16Nan(neg) : fp32ToFp16(y);
    }
    else
    {
        return nan ? fp32Nan(neg) : __float_as_uint(y);
    }
}

template <int FMT>
__device__ __forceinline__ float2 codesToFloat2(uint32_t pair)
{
    constexpr __nv_fp8_interpretation_t kind = FMT == int(Format::kE4M3) ? __NV_E4M3 : __NV_E5M2;
    __half2_raw const h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), kind);
    return __half22float2(__half2(h));
}

// Hot words of one access from its codes.
// CHECK false: the caller knows no code of the access is a NaN code.
template <int DT, int FMT, bool VEC, bool CHECK = true>
__device__ __forceinline__ void dequantize(uint32_t const* codes, float s, uint32_t* w)
{
    constexpr int n = Access<DT, VEC, 128>::kElems;
    if constexpr (n == 1)
    {
        uint32_t const c = codes[0] & 0xFFu;
        w[0] = decodeValue<DT, FMT, CHECK>(c, codesToFloat2<FMT>(c).x, s);
    }
    else
    {
#pragma unroll
        for (int p = 0; p < n / 2; ++p)
        {
            uint32_t const pair = (codes[p >> 1] >> (16 * (p & 1))) & 0xFFFFu;
            float2 const f = codesToFloat2<FMT>(pair);
            uint32_t const y0 = decodeValue<DT, FMT, CHECK>(pair & 0xFFu, f.x, s);
            uint32_t const y1 = decodeValue<DT, FMT, CHECK>(pair >> 8, f.y, s);
            if constexpr (DT == kFp32)
            {
                w[2 * p] = y0, w[2 * p + 1] = y1;
            }
            else
            {
                w[p] = y0 | (y1 << 16);
            }
        }
    }
}

struct Tile
{
    char* hot;      // the page's buffer in the hot slot
    char* cold;     // the page's blob
    uint64_t block; // scale block index
    bool active;
    uint32_t sub;   // lane inside the block's group
    uint32_t lanes; // lanes of the group
};

// Element offset (inside the buffer) of access k of a block.
template <int N>
__device__ __forceinline__ uint64_t elemOffset(BufferPlan const& b, uint64_t block, uint32_t k)
{
    uint32_t const e = k * N;
    uint32_t const rowElems = static_cast<uint32_t>(b.rowElems);
    uint32_t const row = e / rowElems;
    return uint64_t(row) * b.rowStride + block * b.blockStride + (e - row * rowElems);
}

__device__ __forceinline__ void storeScale(char* p, float s, bool aligned)
{
    if (aligned)
    {
        *reinterpret_cast<float*>(p) = s;
        return;
    }
    uint32_t const u = __float_as_uint(s);
#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        p[i] = static_cast<char>((u >> (8 * i)) & 0xFFu);
    }
}

__device__ __forceinline__ float loadScale(char const* p, bool aligned)
{
    if (aligned)
    {
        return *reinterpret_cast<float const*>(p);
    }
    uint32_t u = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        u |= uint32_t(static_cast<unsigned char>(p[i])) << (8 * i);
    }
    return __uint_as_float(u);
}

__device__ __forceinline__ void storeCodes(char* p, uint32_t const* codes, int n)
{
    if (n == 16)
    {
        *reinterpret_cast<uint4*>(p) = make_uint4(codes[0], codes[1], codes[2], codes[3]);
    }
    else
    {
        *p = static_cast<char>(codes[0]);
    }
}

// Zero padding of a quantized buffer's regions, so blobs are fully determined by the hot data.
__device__ __forceinline__ void zeroPadding(BufferPlan const& b, char* cold, uint32_t sub, uint32_t lanes)
{
    for (uint64_t p = b.dataEnd + sub; p < b.scaleOffset; p += lanes)
    {
        cold[p] = 0;
    }
    for (uint64_t p = b.scaleEnd + sub; p < b.regionEnd; p += lanes)
    {
        cold[p] = 0;
    }
}

} // namespace
} // namespace kvcodec::fp8

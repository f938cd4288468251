// SPDX-License-Identifier: Apache-2.0
//
// The fp8 codec's CUDA kernel: one launch per encode/decode call covers every (page, buffer).
//
// Work is cut into warp units: a lossless buffer into kCopyUnitBytes pieces, a quantized buffer
// into groups of scale blocks, each block handled by `groupLanes` lanes of one warp (the amax
// is reduced with shuffles, no shared memory). Lanes move 16 elements at a time (two or four
// 16-byte hot loads, one 16-byte code store) when the buffer allows it, one element otherwise
// (one 2- or 4-byte access, or its bytes when the slot size or offset leaves it unaligned).
// Encode keeps up to 128 bytes of hot data per lane in registers between the amax and the
// quantize pass; larger blocks are read twice (the second read is served by L1/L2).
#include "fp8_kernel.h"

#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

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
    char* hot;         // the page's buffer in the hot slot
    char* cold;        // the page's blob
    uint64_t block;    // scale block index
    bool active;
    uint32_t sub;      // lane inside the block's group
    uint32_t lanes;    // lanes of the group
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

// The original (v1) encode of one tile, kept as it was: the default until the variants are measured.
template <int DT, int FMT, bool VEC>
__device__ void encodeTileV1(BufferPlan const& b, Tile const& t, bool alignedCold)
{
    using A = Access<DT, VEC, 128>;
    constexpr int N = A::kElems;
    constexpr int E = elemBytes<DT>();
    uint32_t const nv = static_cast<uint32_t>(b.blockElems / N);
    bool const cached = nv <= uint32_t(A::kCached) * t.lanes;
    uint32_t cache[A::kCached][A::kWords];
    uint32_t amax = 0;
    if (t.active)
    {
        if (cached)
        {
#pragma unroll
            for (int c = 0; c < A::kCached; ++c)
            {
                uint32_t const k = t.sub + c * t.lanes;
                if (k < nv)
                {
                    loadRaw<DT, VEC>(t.hot + elemOffset<N>(b, t.block, k) * E, cache[c], b.hotAligned != 0);
                }
            }
#pragma unroll
            for (int c = 0; c < A::kCached; ++c)
            {
                if (t.sub + c * t.lanes < nv)
                {
                    amax = max(amax, amaxBits<DT, VEC>(cache[c]));
                }
            }
        }
        else
        {
            for (uint32_t k = t.sub; k < nv; k += t.lanes)
            {
                uint32_t w[A::kWords];
                loadRaw<DT, VEC>(t.hot + elemOffset<N>(b, t.block, k) * E, w, b.hotAligned != 0);
                amax = max(amax, amaxBits<DT, VEC>(w));
            }
        }
    }
    for (uint32_t o = t.lanes / 2; o >= 1; o /= 2)
    {
        amax = max(amax, __shfl_xor_sync(kFull, amax, o));
    }
    if (!t.active)
    {
        return;
    }
    BlockScale const bs = blockScale(__uint_as_float(amax), Format(FMT));
    if (t.sub == 0)
    {
        storeScale(t.cold + b.scaleOffset + 4 * t.block, bs.scale, alignedCold);
    }
    char* codesBase = t.cold + b.dataOffset;
    if (cached)
    {
#pragma unroll
        for (int c = 0; c < A::kCached; ++c)
        {
            uint32_t const k = t.sub + c * t.lanes;
            if (k < nv)
            {
                uint32_t codes[N == 16 ? 4 : 1];
                quantize<DT, FMT, VEC>(cache[c], bs.reciprocal, codes);
                storeCodes(codesBase + elemOffset<N>(b, t.block, k), codes, N);
            }
        }
    }
    else
    {
        for (uint32_t k = t.sub; k < nv; k += t.lanes)
        {
            uint32_t w[A::kWords];
            uint64_t const off = elemOffset<N>(b, t.block, k);
            loadRaw<DT, VEC>(t.hot + off * E, w, b.hotAligned != 0);
            uint32_t codes[N == 16 ? 4 : 1];
            quantize<DT, FMT, VEC>(w, bs.reciprocal, codes);
            storeCodes(codesBase + off, codes, N);
        }
    }
    if (t.block == 0)
    {
        // Zero padding, so blobs are fully determined by the hot data.
        for (uint64_t p = b.dataEnd + t.sub; p < b.scaleOffset; p += t.lanes)
        {
            t.cold[p] = 0;
        }
        for (uint64_t p = b.scaleEnd + t.sub; p < b.regionEnd; p += t.lanes)
        {
            t.cold[p] = 0;
        }
    }
}

// Reduces a group's per-lane maximum (groups are aligned power-of-two lane ranges).
__device__ __forceinline__ uint32_t groupMax(uint32_t m, uint32_t lanes)
{
    for (uint32_t o = lanes / 2; o >= 1; o /= 2)
    {
        m = max(m, __shfl_xor_sync(kFull, m, o));
    }
    return m;
}

// Quantizes and stores one cached access (the finite fast path when `unchecked`).
template <int DT, int FMT, bool VEC, int LB>
__device__ __forceinline__ void quantizeStore(uint32_t const* w, float r, char* dst, bool unchecked)
{
    constexpr int N = Access<DT, VEC, LB>::kElems;
    uint32_t codes[N == 16 ? 4 : 1];
    if (unchecked)
    {
        quantize<DT, FMT, VEC, false>(w, r, codes);
    }
    else
    {
        quantize<DT, FMT, VEC, true>(w, r, codes);
    }
    storeCodes(dst, codes, N);
}

// Loads the lane's accesses k0, k0 + lanes, ..., k0 + (C - 1) * lanes of the tile's block that
// lie below nv into `cache`, all issued before any is used.
template <int DT, bool VEC, int LB, int C>
__device__ __forceinline__ void loadBatch(BufferPlan const& b, Tile const& t, uint32_t k0, uint32_t nv,
    uint32_t (&cache)[C][Access<DT, VEC, LB>::kWords])
{
    constexpr int N = Access<DT, VEC, LB>::kElems;
#pragma unroll
    for (int c = 0; c < C; ++c)
    {
        uint32_t const k = k0 + c * t.lanes;
        if (k < nv)
        {
            loadRaw<DT, VEC, LB>(t.hot + elemOffset<N>(b, t.block, k) * elemBytes<DT>(), cache[c], b.hotAligned != 0);
        }
    }
}

// Encode of one tile: a scale block spread over `lanes` lanes. LB: hot bytes a lane caches;
// BATCH: blocks larger than the cache are streamed LB bytes per lane at a time (else one access).
// `fast` (finite_check=block): one raw maximum per access, the exact finite amax and the
// per-element NaN/Inf handling only for warps that hold a non-finite element.
template <int DT, int FMT, bool VEC, int LB, bool BATCH>
__device__ void encodeTile(BufferPlan const& b, Tile const& t, bool alignedCold, bool fast)
{
    using A = Access<DT, VEC, LB>;
    constexpr int N = A::kElems;
    constexpr int E = elemBytes<DT>();
    constexpr int C = A::kCached;
    fast = BATCH && fast; // v1 has no fast path
    uint32_t const nv = static_cast<uint32_t>(b.blockElems / N);
    uint32_t const step = uint32_t(C) * t.lanes;
    bool const cached = nv <= step;
    uint32_t cache[C][A::kWords];
    // The first pass: the exact finite amax (fp32 bits) or, when `exact` is false, the raw
    // maximum in the hot dtype's bits.
    auto firstPass = [&](bool exact) {
        uint32_t m = 0;
        if (!t.active)
        {
            return m;
        }
        if (cached || BATCH)
        {
            for (uint32_t k0 = t.sub; k0 < nv; k0 += step)
            {
                loadBatch<DT, VEC, LB, C>(b, t, k0, nv, cache);
#pragma unroll
                for (int c = 0; c < C; ++c)
                {
                    if (k0 + c * t.lanes < nv)
                    {
                        m = max(m, exact ? amaxBits<DT, VEC>(cache[c]) : rawMaxBits<DT, VEC>(cache[c]));
                    }
                }
            }
        }
        else
        {
            for (uint32_t k = t.sub; k < nv; k += t.lanes)
            {
                uint32_t w[A::kWords];
                loadRaw<DT, VEC, LB>(t.hot + elemOffset<N>(b, t.block, k) * E, w, b.hotAligned != 0);
                m = max(m, exact ? amaxBits<DT, VEC>(w) : rawMaxBits<DT, VEC>(w));
            }
        }
        return m;
    };
    bool unchecked = false;
    uint32_t amax = groupMax(firstPass(!fast), t.lanes);
    if (fast)
    {
        // Warp-uniform: a warp holding a NaN or Inf takes the exact path for all its lanes.
        if (__any_sync(kFull, t.active && rawNonFinite<DT>(amax)))
        {
            amax = groupMax(firstPass(true), t.lanes);
        }
        else
        {
            amax = rawToAmaxBits<DT>(amax);
            unchecked = true;
        }
    }
    if (!t.active)
    {
        return;
    }
    BlockScale const bs = blockScale(__uint_as_float(amax), Format(FMT));
    if (t.sub == 0)
    {
        storeScale(t.cold + b.scaleOffset + 4 * t.block, bs.scale, alignedCold);
    }
    char* codesBase = t.cold + b.dataOffset;
    if (cached)
    {
#pragma unroll
        for (int c = 0; c < C; ++c)
        {
            uint32_t const k = t.sub + c * t.lanes;
            if (k < nv)
            {
                quantizeStore<DT, FMT, VEC, LB>(cache[c], bs.reciprocal, codesBase + elemOffset<N>(b, t.block, k), unchecked);
            }
        }
    }
    else if (BATCH)
    {
        for (uint32_t k0 = t.sub; k0 < nv; k0 += step)
        {
            loadBatch<DT, VEC, LB, C>(b, t, k0, nv, cache);
#pragma unroll
            for (int c = 0; c < C; ++c)
            {
                uint32_t const k = k0 + c * t.lanes;
                if (k < nv)
                {
                    quantizeStore<DT, FMT, VEC, LB>(cache[c], bs.reciprocal, codesBase + elemOffset<N>(b, t.block, k), unchecked);
                }
            }
        }
    }
    else
    {
        for (uint32_t k = t.sub; k < nv; k += t.lanes)
        {
            uint32_t w[A::kWords];
            uint64_t const off = elemOffset<N>(b, t.block, k);
            loadRaw<DT, VEC, LB>(t.hot + off * E, w, b.hotAligned != 0);
            quantizeStore<DT, FMT, VEC, LB>(w, bs.reciprocal, codesBase + off, unchecked);
        }
    }
    if (t.block == 0)
    {
        zeroPadding(b, t.cold, t.sub, t.lanes);
    }
}

// Encode of a unit of several rounds (small_blocks=deep): round s covers the blocks
// t.block + s * 32 / lanes, and each lane holds at most one access of each, so all rounds'
// loads are in flight before the first reduction.
template <int DT, int FMT, bool VEC, int LB>
__device__ void encodeRounds(BufferPlan const& b, Tile const& t, bool alignedCold, bool fast)
{
    using A = Access<DT, VEC, LB>;
    constexpr int N = A::kElems;
    constexpr int E = elemBytes<DT>();
    constexpr int C = A::kCached;
    uint32_t const perRound = 32 / t.lanes;
    uint32_t const nv = static_cast<uint32_t>(b.blockElems / N);
    uint32_t cache[C][A::kWords];
    uint32_t m[C];
    bool act[C];
#pragma unroll
    for (int s = 0; s < C; ++s)
    {
        uint64_t const block = t.block + uint64_t(s) * perRound;
        act[s] = uint32_t(s) < b.rounds && block < b.numBlocks && t.sub < nv;
        if (act[s])
        {
            loadRaw<DT, VEC, LB>(t.hot + elemOffset<N>(b, block, t.sub) * E, cache[s], b.hotAligned != 0);
        }
    }
    bool nonFinite = false;
#pragma unroll
    for (int s = 0; s < C; ++s)
    {
        m[s] = !act[s] ? 0u : (fast ? rawMaxBits<DT, VEC>(cache[s]) : amaxBits<DT, VEC>(cache[s]));
        m[s] = groupMax(m[s], t.lanes);
        nonFinite = nonFinite || (fast && act[s] && rawNonFinite<DT>(m[s]));
    }
    bool unchecked = false;
    if (fast)
    {
        bool const exact = __any_sync(kFull, nonFinite);
#pragma unroll
        for (int s = 0; s < C; ++s)
        {
            m[s] = exact ? groupMax(act[s] ? amaxBits<DT, VEC>(cache[s]) : 0u, t.lanes) : rawToAmaxBits<DT>(m[s]);
        }
        unchecked = !exact;
    }
#pragma unroll
    for (int s = 0; s < C; ++s)
    {
        if (!act[s])
        {
            continue;
        }
        uint64_t const block = t.block + uint64_t(s) * perRound;
        BlockScale const bs = blockScale(__uint_as_float(m[s]), Format(FMT));
        if (t.sub == 0)
        {
            storeScale(t.cold + b.scaleOffset + 4 * block, bs.scale, alignedCold);
        }
        quantizeStore<DT, FMT, VEC, LB>(cache[s], bs.reciprocal, t.cold + b.dataOffset + elemOffset<N>(b, block, t.sub),
            unchecked);
        if (block == 0)
        {
            zeroPadding(b, t.cold, t.sub, t.lanes);
        }
    }
}

// True when a word of four codes holds a NaN code (e4m3: low 7 bits all ones; e5m2: above
// 0x7C); the carry of the add lands in bit 7 of the byte and never crosses into the next one.
template <int FMT>
__device__ __forceinline__ bool nanCodeIn(uint32_t w)
{
    constexpr uint32_t kAdd = FMT == int(Format::kE4M3) ? 0x01010101u : 0x03030303u;
    return (((w & 0x7F7F7F7Fu) + kAdd) & 0x80808080u) != 0;
}

template <int DT, int FMT, bool VEC>
__device__ __forceinline__ void dequantizeAccess(uint32_t const* codes, float s, uint32_t* w, bool fast)
{
    constexpr int kCodeWords = VEC ? 4 : 1;
    bool nan = !fast;
#pragma unroll
    for (int i = 0; i < kCodeWords; ++i)
    {
        nan = nan || nanCodeIn<FMT>(codes[i]);
    }
    if (nan)
    {
        dequantize<DT, FMT, VEC, true>(codes, s, w);
    }
    else
    {
        dequantize<DT, FMT, VEC, false>(codes, s, w);
    }
}

__device__ __forceinline__ void loadCodes(char const* p, uint32_t* codes, bool vec16)
{
    if (vec16)
    {
        uint4 const v = *reinterpret_cast<uint4 const*>(p);
        codes[0] = v.x, codes[1] = v.y, codes[2] = v.z, codes[3] = v.w;
    }
    else
    {
        codes[0] = static_cast<unsigned char>(*p);
    }
}

// Decode of one tile; code loads of kBatch accesses per lane are in flight before the first
// store (4 for v1, the lane cache's accesses for the other variants).
template <int DT, int FMT, bool VEC, int LB, bool BATCH>
__device__ void decodeTile(BufferPlan const& b, Tile const& t, bool alignedCold, bool fast)
{
    using A = Access<DT, VEC, LB>;
    constexpr int N = A::kElems;
    constexpr int E = elemBytes<DT>();
    constexpr int kBatch = BATCH ? A::kCached : 4;
    fast = BATCH && fast; // v1 has no fast path
    if (!t.active)
    {
        return;
    }
    uint32_t const nv = static_cast<uint32_t>(b.blockElems / N);
    float const s = loadScale(t.cold + b.scaleOffset + 4 * t.block, alignedCold);
    char const* codesBase = t.cold + b.dataOffset;
    for (uint32_t k0 = t.sub; k0 < nv; k0 += kBatch * t.lanes)
    {
        uint32_t codes[kBatch][N == 16 ? 4 : 1];
#pragma unroll
        for (int u = 0; u < kBatch; ++u)
        {
            uint32_t const k = k0 + u * t.lanes;
            if (k < nv)
            {
                loadCodes(codesBase + elemOffset<N>(b, t.block, k), codes[u], N == 16);
            }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u)
        {
            uint32_t const k = k0 + u * t.lanes;
            if (k < nv)
            {
                uint32_t w[A::kWords];
                dequantizeAccess<DT, FMT, VEC>(codes[u], s, w, fast);
                storeRaw<DT, VEC, LB>(t.hot + elemOffset<N>(b, t.block, k) * E, w, b.hotAligned != 0);
            }
        }
    }
}

// Decode of a unit of several rounds (see encodeRounds): scales and codes of every round are
// loaded before the first store.
template <int DT, int FMT, bool VEC, int LB>
__device__ void decodeRounds(BufferPlan const& b, Tile const& t, bool alignedCold, bool fast)
{
    using A = Access<DT, VEC, LB>;
    constexpr int N = A::kElems;
    constexpr int E = elemBytes<DT>();
    constexpr int C = A::kCached;
    uint32_t const perRound = 32 / t.lanes;
    uint32_t const nv = static_cast<uint32_t>(b.blockElems / N);
    uint32_t codes[C][N == 16 ? 4 : 1];
    float scale[C];
#pragma unroll
    for (int s = 0; s < C; ++s)
    {
        uint64_t const block = t.block + uint64_t(s) * perRound;
        if (uint32_t(s) < b.rounds && block < b.numBlocks && t.sub < nv)
        {
            scale[s] = loadScale(t.cold + b.scaleOffset + 4 * block, alignedCold);
            loadCodes(t.cold + b.dataOffset + elemOffset<N>(b, block, t.sub), codes[s], N == 16);
        }
    }
#pragma unroll
    for (int s = 0; s < C; ++s)
    {
        uint64_t const block = t.block + uint64_t(s) * perRound;
        if (uint32_t(s) < b.rounds && block < b.numBlocks && t.sub < nv)
        {
            uint32_t w[A::kWords];
            dequantizeAccess<DT, FMT, VEC>(codes[s], scale[s], w, fast);
            storeRaw<DT, VEC, LB>(t.hot + elemOffset<N>(b, block, t.sub) * E, w, b.hotAligned != 0);
        }
    }
}

template <int DT, int FMT, bool ENC, bool VEC, int LB, bool BATCH>
__device__ __forceinline__ void tileOf(BufferPlan const& b, Tile const& t, bool alignedCold, bool fast)
{
    if constexpr (!BATCH)
    {
        // v1: rounds are always 1 and `fast` always false (the plan and the parameters see to it).
        if constexpr (ENC)
        {
            encodeTileV1<DT, FMT, VEC>(b, t, alignedCold);
        }
        else
        {
            decodeTile<DT, FMT, VEC, LB, false>(b, t, alignedCold, false);
        }
    }
    else if (b.rounds > 1 && VEC)
    {
        // One access per lane and round: every round's loads go out before the first reduction.
        if constexpr (ENC)
        {
            encodeRounds<DT, FMT, VEC, LB>(b, t, alignedCold, fast);
        }
        else
        {
            decodeRounds<DT, FMT, VEC, LB>(b, t, alignedCold, fast);
        }
    }
    else
    {
        // One round after the other (also the element path of a deep unit, whose blocks may
        // need several accesses per lane).
        Tile r = t;
        for (uint32_t s = 0; s < b.rounds; ++s)
        {
            r.block = t.block + uint64_t(s) * (32 / t.lanes);
            r.active = r.block < b.numBlocks;
            if constexpr (ENC)
            {
                encodeTile<DT, FMT, VEC, LB, BATCH>(b, r, alignedCold, fast);
            }
            else
            {
                decodeTile<DT, FMT, VEC, LB, BATCH>(b, r, alignedCold, fast);
            }
        }
    }
}

template <int DT, int FMT, bool ENC, int LB, bool BATCH>
__device__ void quantizedUnit(BufferPlan const& b, Tile const& t, bool vec, bool alignedCold, bool fast)
{
    vec ? tileOf<DT, FMT, ENC, true, LB, BATCH>(b, t, alignedCold, fast)
        : tileOf<DT, FMT, ENC, false, LB, BATCH>(b, t, alignedCold, fast);
}

template <int FMT, bool ENC, int LB, bool BATCH>
__device__ void quantizedUnitFmt(BufferPlan const& b, Tile const& t, bool vec, bool alignedCold, bool fast)
{
    switch (b.dtype)
    {
    case kBf16: quantizedUnit<kBf16, FMT, ENC, LB, BATCH>(b, t, vec, alignedCold, fast); break;
    case kFp16: quantizedUnit<kFp16, FMT, ENC, LB, BATCH>(b, t, vec, alignedCold, fast); break;
    default: quantizedUnit<kFp32, FMT, ENC, LB, BATCH>(b, t, vec, alignedCold, fast); break;
    }
}

// One lossless piece: the warp copies up to kCopyUnitBytes with the widest aligned access.
__device__ void copyUnit(BufferPlan const& b, char* hot, char* cold, uint64_t unit, uint32_t lane, bool encode)
{
    uint64_t const off = unit * kCopyUnitBytes;
    uint64_t const len = min(kCopyUnitBytes, b.bytes - off);
    char* h = hot + off;
    char* c = cold + b.dataOffset + off;
    char* dst = encode ? c : h;
    char const* src = encode ? h : c;
    if (((reinterpret_cast<uint64_t>(dst) | reinterpret_cast<uint64_t>(src) | len) & 15) == 0)
    {
        auto* d = reinterpret_cast<uint4*>(dst);
        auto const* s = reinterpret_cast<uint4 const*>(src);
        constexpr uint32_t kWordsPerUnit = kCopyUnitBytes / 16;
        uint4 v[kWordsPerUnit / 32];
#pragma unroll
        for (uint32_t i = 0; i < kWordsPerUnit / 32; ++i)
        {
            uint64_t const k = lane + 32 * i;
            if (k < len / 16)
            {
                v[i] = s[k];
            }
        }
#pragma unroll
        for (uint32_t i = 0; i < kWordsPerUnit / 32; ++i)
        {
            uint64_t const k = lane + 32 * i;
            if (k < len / 16)
            {
                d[k] = v[i];
            }
        }
    }
    else
    {
        for (uint64_t k = lane; k < len; k += 32)
        {
            dst[k] = src[k];
        }
    }
    if (encode && unit == 0)
    {
        for (uint64_t p = b.dataEnd + lane; p < b.regionEnd; p += 32)
        {
            cold[p] = 0;
        }
    }
}

// Where work unit `w` of a call lies: its buffer, the page's hot slot and blob, and the unit's
// index inside the buffer. False when the page's pair is skipped (an index out of range). Every
// value depends on `w` only, so the result is uniform over whoever shares `w`.
struct UnitRef
{
    BufferPlan const* b;
    char* hot;
    char* cold;
    uint64_t unit;
};

template <bool ENC>
__device__ __forceinline__ bool locateUnit(KernelArgs const& a, uint64_t w, UnitRef& u)
{
    uint64_t const page = w / a.unitsPerPage;
    uint64_t const r = w - page * a.unitsPerPage;
    // The buffer owning unit r: the last whose firstUnit <= r.
    uint32_t lo = 0, hi = a.numBuffers - 1;
    while (lo < hi)
    {
        uint32_t const mid = (lo + hi + 1) / 2;
        if (a.buffers[mid].firstUnit <= r) lo = mid;
        else hi = mid - 1;
    }
    BufferPlan const& b = a.buffers[lo];
    // One aligned 64-bit load fetches both indices.
    long long const packed = __ldg(reinterpret_cast<long long const*>(a.pairs) + page);
    int32_t const dstIdx = static_cast<int32_t>(packed & 0xffffffffll);
    int32_t const srcIdx = static_cast<int32_t>(packed >> 32);
    int32_t const hotIdx = ENC ? srcIdx : dstIdx;
    int32_t const coldIdx = ENC ? dstIdx : srcIdx;
    if (hotIdx < 0 || uint64_t(hotIdx) >= a.numHotSlots || coldIdx < 0)
    {
        return false;
    }
    u.b = &b;
    u.hot = reinterpret_cast<char*>(b.poolBase + uint64_t(hotIdx) * b.slotBytes + b.hotOffset);
    u.cold = reinterpret_cast<char*>(a.blob + uint64_t(coldIdx) * a.coldPageBytes);
    u.unit = r - b.firstUnit;
    return true;
}

// One warp unit `unit` of a buffer (the whole warp calls it).
template <bool ENC, int LB, bool BATCH>
__device__ __forceinline__ void warpUnit(KernelArgs const& a, BufferPlan const& b, char* hot, char* cold, uint64_t unit,
    uint32_t lane)
{
    if (!b.quantized)
    {
        copyUnit(b, hot, cold, unit, lane, ENC);
        return;
    }
    uint32_t const group = lane / b.groupLanes;
    Tile t;
    t.hot = hot;
    t.cold = cold;
    t.block = unit * (32 / b.groupLanes) * (BATCH ? b.rounds : 1u) + group;
    t.active = t.block < b.numBlocks;
    t.sub = lane % b.groupLanes;
    t.lanes = b.groupLanes;
    bool const vec = b.vector && !a.scalarOnly;
    bool const fast = BATCH && a.blockFinite != 0;
    if (a.format == uint32_t(Format::kE4M3))
    {
        quantizedUnitFmt<int(Format::kE4M3), ENC, LB, BATCH>(b, t, vec, !a.scalarOnly, fast);
    }
    else
    {
        quantizedUnitFmt<int(Format::kE5M2), ENC, LB, BATCH>(b, t, vec, !a.scalarOnly, fast);
    }
}

// Encode and decode are separate instantiations so each gets its own register budget; so is
// every kernel variant (kKernelVariants[V]).
template <bool ENC, int V>
__global__ void __launch_bounds__(kThreads, kKernelVariants[V].blocksPerSm) fp8Kernel(KernelArgs a)
{
    constexpr int LB = kKernelVariants[V].laneBytes;
    constexpr bool BATCH = kKernelVariants[V].tunable;
    uint32_t const lane = threadIdx.x & 31;
    uint64_t const total = a.numPairs * a.unitsPerPage;
    uint64_t const stride = uint64_t(gridDim.x) * kWarpsPerBlock;
    for (uint64_t w = uint64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; w < total; w += stride)
    {
        UnitRef u;
        if (!locateUnit<ENC>(a, w, u))
        {
            continue; // warp-uniform
        }
        warpUnit<ENC, LB, BATCH>(a, *u.b, u.hot, u.cold, u.unit, lane);
    }
}

// ---------------------------------------------------------------------------------------------
// The tile variant: one thread block per tile, a run of whole scale blocks of one (page,
// buffer). The tile is laid out as `rows` rows of `nb * rowElems` contiguous elements (page_head:
// the page's token rows, the tile's heads side by side; token_head and page: one row), and
// block j of the tile is columns [j * rowElems, (j + 1) * rowElems) of every row, so its hot
// bytes, its codes and its scales are each a few long contiguous runs.
// ---------------------------------------------------------------------------------------------

// Chunks of 16 code pieces a decoding thread loads before its first store.
constexpr int kTileDecodeBatch = 4;

// 16 bytes global -> shared without passing through registers (sm_80 and later), so a thread
// keeps many loads in flight; completed by copyAsyncWait.
__device__ __forceinline__ void copyAsync16(void* dst, void const* src)
{
#if __CUDA_ARCH__ >= 800
    uint32_t const d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    uint64_t g;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(g) : "l"(src));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(g) : "memory");
#else
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<uint4 const*>(src);
#endif
}

__device__ __forceinline__ void copyAsyncWait()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// Largest power of two (<= 32) dividing n: groups of that many consecutive lanes, starting at a
// multiple of 32, never straddle a multiple of n.
__device__ __forceinline__ uint32_t alignedLanes(uint32_t n)
{
    uint32_t const low = n & (0u - n);
    return low == 0 || low > 32 ? 32u : low;
}

// Finite amax (fp32 bits) of a 16-byte chunk of hot elements: one raw maximum, and the exact
// per-element pass only for a chunk that holds a NaN or an infinity (which then sets *flag).
template <int DT>
__device__ __forceinline__ uint32_t chunkAmax(uint4 v, uint32_t* flag)
{
    uint32_t const w[4] = {v.x, v.y, v.z, v.w};
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        m = DT == kFp32 ? max(m, w[i] & 0x7FFFFFFFu) : __vmaxu2(m, w[i] & 0x7FFF7FFFu);
    }
    if constexpr (DT != kFp32)
    {
        m = max(m & 0xFFFFu, m >> 16);
    }
    if (!rawNonFinite<DT>(m))
    {
        return rawToAmaxBits<DT>(m);
    }
    atomicOr(flag, 1u);
    uint32_t exact = 0;
#pragma unroll
    for (int i = 0; i < 16 / elemBytes<DT>(); ++i)
    {
        uint32_t const a = elemBits<DT>(w, i) & 0x7FFFFFFFu;
        exact = max(exact, a < 0x7F800000u ? a : 0u);
    }
    return exact;
}

// Encode of one tile of `nb` blocks starting at block `first`: the hot bytes are copied into
// shared memory once (16-byte pieces, all in flight together), each block's amax is reduced
// from there, and the codes are written in blob order, 16 per thread and store, so a warp
// writes 512 contiguous bytes per instruction; the tile's scales are one contiguous run.
template <int DT, int FMT>
__device__ void encodeTileCta(BufferPlan const& b, char const* hot, char* cold, uint64_t first, uint32_t nb, char* smem)
{
    constexpr uint32_t E = elemBytes<DT>();
    uint32_t const tid = threadIdx.x;
    uint32_t const lane = tid & 31;
    uint32_t const rowElems = static_cast<uint32_t>(b.rowElems);
    uint32_t const rows = static_cast<uint32_t>(b.blockElems / b.rowElems);
    uint32_t const segElems = nb * rowElems;
    uint32_t const segBytes = segElems * E;
    uint32_t const segChunks = segBytes / 16;
    uint32_t const chunks = rows * segChunks;
    uint64_t const segStart = first * b.blockStride;
    uint32_t* amax = reinterpret_cast<uint32_t*>(smem + uint64_t(rows) * segBytes);
    uint32_t* flag = amax + nb;

    char const* src = hot + segStart * E;
    for (uint32_t q = tid; q < chunks; q += kThreads)
    {
        uint32_t const row = q / segChunks;
        copyAsync16(smem + 16ull * q, src + (uint64_t(row) * b.rowStride) * E + 16ull * (q - row * segChunks));
    }
    for (uint32_t j = tid; j < nb; j += kThreads)
    {
        amax[j] = 0;
        flag[j] = 0;
    }
    copyAsyncWait();
    __syncthreads();

    // Block amax, block by block (q runs over each block's chunks in turn) so that aligned
    // groups of lanes share a block and reduce with shuffles before one shared atomic.
    uint32_t const bwChunks = rowElems * E / 16;
    uint32_t const perBlock = rows * bwChunks;
    uint32_t const groupLanes = alignedLanes(perBlock);
    for (uint32_t base = tid & ~31u; base < chunks; base += kThreads)
    {
        uint32_t const q = base + lane;
        uint32_t m = 0, j = 0;
        if (q < chunks)
        {
            j = q / perBlock;
            uint32_t const within = q - j * perBlock;
            uint32_t const row = within / bwChunks;
            uint4 const v = *reinterpret_cast<uint4 const*>(
                smem + uint64_t(row) * segBytes + 16ull * (j * bwChunks + within - row * bwChunks));
            m = chunkAmax<DT>(v, &flag[j]);
        }
        m = groupMax(m, groupLanes);
        if (q < chunks && (lane & (groupLanes - 1)) == 0)
        {
            atomicMax(&amax[j], m);
        }
    }
    __syncthreads();

    for (uint32_t j = tid; j < nb; j += kThreads)
    {
        BlockScale const bs = blockScale(__uint_as_float(amax[j]), Format(FMT));
        *reinterpret_cast<float*>(cold + b.scaleOffset + 4 * (first + j)) = bs.scale;
        amax[j] = __float_as_uint(bs.reciprocal);
    }
    if (first == 0)
    {
        zeroPadding(b, cold, tid, kThreads);
    }
    __syncthreads();

    using A = Access<DT, true, 128>;
    uint32_t const segPieces = segElems / 16;
    uint32_t const pieces = rows * segPieces;
    char* codes = cold + b.dataOffset + segStart;
    for (uint32_t p = tid; p < pieces; p += kThreads)
    {
        uint32_t const row = p / segPieces;
        uint32_t const col = 16 * (p - row * segPieces);
        uint32_t const j = col / rowElems;
        uint32_t w[A::kWords];
        auto const* s = reinterpret_cast<uint4 const*>(smem + uint64_t(row) * segBytes + col * E);
#pragma unroll
        for (int k = 0; k < A::kWords / 4; ++k)
        {
            uint4 const v = s[k];
            w[4 * k] = v.x, w[4 * k + 1] = v.y, w[4 * k + 2] = v.z, w[4 * k + 3] = v.w;
        }
        float const r = __uint_as_float(amax[j]);
        uint32_t c[4];
        if (flag[j])
        {
            quantize<DT, FMT, true, true>(w, r, c);
        }
        else
        {
            quantize<DT, FMT, true, false>(w, r, c);
        }
        *reinterpret_cast<uint4*>(codes + uint64_t(row) * b.rowStride + col) = make_uint4(c[0], c[1], c[2], c[3]);
    }
}

// Decode of one tile: its scales into shared memory, then 16 codes per thread and load (a warp
// reads 512 contiguous blob bytes per instruction), kTileDecodeBatch loads in flight per thread,
// and 16-byte stores of the hot elements in the same order.
template <int DT, int FMT>
__device__ void decodeTileCta(BufferPlan const& b, char* hot, char const* cold, uint64_t first, uint32_t nb, char* smem)
{
    constexpr uint32_t E = elemBytes<DT>();
    using A = Access<DT, true, 128>;
    uint32_t const tid = threadIdx.x;
    uint32_t const rowElems = static_cast<uint32_t>(b.rowElems);
    uint32_t const rows = static_cast<uint32_t>(b.blockElems / b.rowElems);
    uint32_t const segPieces = nb * rowElems / 16;
    uint32_t const pieces = rows * segPieces;
    uint64_t const segStart = first * b.blockStride;
    float* scale = reinterpret_cast<float*>(smem);
    for (uint32_t j = tid; j < nb; j += kThreads)
    {
        scale[j] = *reinterpret_cast<float const*>(cold + b.scaleOffset + 4 * (first + j));
    }
    __syncthreads();
    char const* codes = cold + b.dataOffset + segStart;
    char* dst = hot + segStart * E;
    for (uint32_t p0 = tid; p0 < pieces; p0 += kThreads * kTileDecodeBatch)
    {
        uint32_t c[kTileDecodeBatch][4];
        uint32_t off[kTileDecodeBatch];
        uint32_t blk[kTileDecodeBatch];
#pragma unroll
        for (int u = 0; u < kTileDecodeBatch; ++u)
        {
            uint32_t const p = p0 + u * kThreads;
            if (p < pieces)
            {
                uint32_t const row = p / segPieces;
                uint32_t const col = 16 * (p - row * segPieces);
                blk[u] = col / rowElems;
                off[u] = row * static_cast<uint32_t>(b.rowStride) + col;
                loadCodes(codes + off[u], c[u], true);
            }
        }
#pragma unroll
        for (int u = 0; u < kTileDecodeBatch; ++u)
        {
            if (p0 + u * kThreads < pieces)
            {
                uint32_t w[A::kWords];
                dequantizeAccess<DT, FMT, true>(c[u], scale[blk[u]], w, true);
                storeRaw<DT, true>(dst + uint64_t(off[u]) * E, w, true);
            }
        }
    }
}

template <bool ENC, int FMT>
__device__ __forceinline__ void tileCtaFmt(BufferPlan const& b, char* hot, char* cold, uint64_t first, uint32_t nb,
    char* smem)
{
    switch (b.dtype)
    {
    case kBf16:
        ENC ? encodeTileCta<kBf16, FMT>(b, hot, cold, first, nb, smem) : decodeTileCta<kBf16, FMT>(b, hot, cold, first, nb, smem);
        break;
    case kFp16:
        ENC ? encodeTileCta<kFp16, FMT>(b, hot, cold, first, nb, smem) : decodeTileCta<kFp16, FMT>(b, hot, cold, first, nb, smem);
        break;
    default:
        ENC ? encodeTileCta<kFp32, FMT>(b, hot, cold, first, nb, smem) : decodeTileCta<kFp32, FMT>(b, hot, cold, first, nb, smem);
        break;
    }
}

// A tile whose blob is not 16-byte aligned (the cold base is not): its blocks are handed to the
// warps as the warp units would take them, on the element path with byte-wise scales.
template <bool ENC, int FMT, int LB>
__device__ void tileByWarps(BufferPlan const& b, char* hot, char* cold, uint64_t first, uint32_t nb, bool fast)
{
    uint32_t const lane = threadIdx.x & 31;
    uint32_t const perWarp = 32 / b.groupLanes;
    for (uint32_t g = (threadIdx.x / 32) * perWarp; g < nb; g += kWarpsPerBlock * perWarp) // warp-uniform
    {
        Tile t;
        t.hot = hot;
        t.cold = cold;
        t.active = g + lane / b.groupLanes < nb;
        t.block = first + g + lane / b.groupLanes;
        t.sub = lane % b.groupLanes;
        t.lanes = b.groupLanes;
        switch (b.dtype)
        {
        case kBf16:
            ENC ? encodeTile<kBf16, FMT, false, LB, true>(b, t, false, fast)
                : decodeTile<kBf16, FMT, false, LB, true>(b, t, false, fast);
            break;
        case kFp16:
            ENC ? encodeTile<kFp16, FMT, false, LB, true>(b, t, false, fast)
                : decodeTile<kFp16, FMT, false, LB, true>(b, t, false, fast);
            break;
        default:
            ENC ? encodeTile<kFp32, FMT, false, LB, true>(b, t, false, fast)
                : decodeTile<kFp32, FMT, false, LB, true>(b, t, false, fast);
            break;
        }
    }
}

// Work units are thread blocks: a tile of a tiled buffer, or kWarpsPerCta warp units of any
// other buffer (one per warp, as the b4 variant runs them). Every branch below depends on the
// unit only, so the whole thread block takes it and reaches each __syncthreads.
template <bool ENC>
__global__ void __launch_bounds__(kThreads, kKernelVariants[kTileVariant].blocksPerSm) fp8TileKernel(KernelArgs a)
{
    constexpr int LB = kKernelVariants[kTileVariant].laneBytes;
    extern __shared__ uint4 tileShared[];
    char* smem = reinterpret_cast<char*>(tileShared);
    uint32_t const lane = threadIdx.x & 31;
    uint64_t const total = a.numPairs * a.unitsPerPage;
    bool const fast = a.blockFinite != 0;
    for (uint64_t w = blockIdx.x; w < total; w += gridDim.x)
    {
        UnitRef u;
        if (!locateUnit<ENC>(a, w, u))
        {
            continue;
        }
        BufferPlan const& b = *u.b;
        if (b.tileBlocks == 0)
        {
            uint64_t const unit = u.unit * kWarpsPerCta + threadIdx.x / 32;
            if (unit < b.warpUnits)
            {
                warpUnit<ENC, LB, true>(a, b, u.hot, u.cold, unit, lane);
            }
            continue;
        }
        uint64_t const first = u.unit * b.tileBlocks;
        uint32_t const nb = static_cast<uint32_t>(min(b.tileBlocks, b.numBlocks - first));
        bool const e4m3 = a.format == uint32_t(Format::kE4M3);
        if (a.scalarOnly)
        {
            e4m3 ? tileByWarps<ENC, int(Format::kE4M3), LB>(b, u.hot, u.cold, first, nb, fast)
                 : tileByWarps<ENC, int(Format::kE5M2), LB>(b, u.hot, u.cold, first, nb, fast);
            continue;
        }
        e4m3 ? tileCtaFmt<ENC, int(Format::kE4M3)>(b, u.hot, u.cold, first, nb, smem)
             : tileCtaFmt<ENC, int(Format::kE5M2)>(b, u.hot, u.cold, first, nb, smem);
        __syncthreads(); // the next tile reuses the shared memory
    }
}

// Resident blocks per SM of a variant (both directions), computed once.
template <int V>
int residentBlocks()
{
    static int const blocks = [] {
        int e = 0, d = 0;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&e, fp8Kernel<true, V>, kThreads, 0);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&d, fp8Kernel<false, V>, kThreads, 0);
        return std::max(std::min(e, d), 1);
    }();
    return blocks;
}

template <int V>
cudaError_t preloadVariant()
{
    cudaFuncAttributes attributes{};
    cudaError_t st = cudaFuncGetAttributes(&attributes, fp8Kernel<true, V>);
    return st != cudaSuccess ? st : cudaFuncGetAttributes(&attributes, fp8Kernel<false, V>);
}

template <int V>
void launchVariant(KernelArgs const& args, uint64_t total, int numSms, cudaStream_t stream)
{
    uint64_t const wanted = (total + kWarpsPerBlock - 1) / kWarpsPerBlock;
    uint64_t const blocks = std::min<uint64_t>(wanted, uint64_t(std::max(numSms, 1)) * residentBlocks<V>());
    if (args.encode)
    {
        fp8Kernel<true, V><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
    }
    else
    {
        fp8Kernel<false, V><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
    }
}

void launchTile(KernelArgs const& args, uint64_t total, int numSms, cudaStream_t stream)
{
    uint64_t const blocks = std::min<uint64_t>(total, uint64_t(std::max(numSms, 1)) * std::max(args.tileResident, 1u));
    if (args.encode)
    {
        fp8TileKernel<true><<<static_cast<unsigned>(blocks), kThreads, args.tileSmem, stream>>>(args);
    }
    else
    {
        fp8TileKernel<false><<<static_cast<unsigned>(blocks), kThreads, args.tileSmem, stream>>>(args);
    }
}

cudaError_t preloadTile()
{
    cudaFuncAttributes attributes{};
    cudaError_t st = cudaFuncGetAttributes(&attributes, fp8TileKernel<true>);
    return st != cudaSuccess ? st : cudaFuncGetAttributes(&attributes, fp8TileKernel<false>);
}

static_assert(kNumKernelVariants == 4, "preloadFp8 and launchFp8 list every variant");

} // namespace

cudaError_t prepareTileKernel(bool encode, uint64_t budget, uint32_t smem, int* residentPerSm) noexcept
{
    auto const kernel = encode ? fp8TileKernel<true> : fp8TileKernel<false>;
    cudaError_t st = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(budget));
    if (st == cudaSuccess)
    {
        st = cudaOccupancyMaxActiveBlocksPerMultiprocessor(residentPerSm, kernel, kThreads, smem);
    }
    return st;
}

cudaError_t preloadFp8() noexcept
{
    cudaError_t const st[] = {preloadVariant<0>(), preloadVariant<1>(), preloadVariant<2>(), preloadTile()};
    for (cudaError_t e : st)
    {
        if (e != cudaSuccess)
        {
            return e;
        }
    }
    return cudaSuccess;
}

cudaError_t launchFp8(KernelArgs const& args, int numSms, cudaStream_t stream) noexcept
{
    uint64_t const total = args.numPairs * args.unitsPerPage;
    if (total == 0)
    {
        return cudaSuccess;
    }
    switch (args.variant)
    {
    case 0: launchVariant<0>(args, total, numSms, stream); break;
    case 1: launchVariant<1>(args, total, numSms, stream); break;
    case 2: launchVariant<2>(args, total, numSms, stream); break;
    case kTileVariant: launchTile(args, total, numSms, stream); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

} // namespace kvcodec::fp8

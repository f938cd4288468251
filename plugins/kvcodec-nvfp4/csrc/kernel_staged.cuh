// SPDX-License-Identifier: Apache-2.0
//
// nvfp4: the staged encoder of the CUDA kernel (included by kernel.cu).
//
// A work item is a whole quantized buffer of a page (BufferPlan::staged: rows of whole 16-element
// blocks, aligned, at most kMaxStagedBytes). Its hot bytes are copied into shared memory with
// asynchronous 16-byte copies while the thread block encodes the previous item (two stages), so
// loads and arithmetic overlap and no register holds a block across a barrier. Encoding takes two
// passes over the staged buffer (the groups' largest magnitudes, then the codes), builds the
// blob's regions in shared memory exactly as they lie in the blob, padding included, and writes
// them with contiguous 16-byte stores.
//
// The element codes of a block come from packed 16-bit comparisons (two elements per
// instruction): for a non-NaN magnitude a and an fp32 threshold t, a > t exactly when a > t
// rounded toward zero to the hot type (no value of the hot type lies between the two), so the
// seven thresholds of e2m1Thresholds() rounded that way give encodeElement()'s codes. A block
// holding a NaN or an infinity takes the per-element functions of format.h.

#pragma once

#include "kernel_common.cuh"

namespace nvfp4_codec {
namespace {

/// The 32 hot bytes of block k of the stage, read in an order that keeps a warp's 16-byte shared
/// loads free of bank conflicts: lanes 4-7 of each group of eight take the block's second half
/// first (`first`, that half's index); w[0..3] is the half read first, w[4..7] the other.
__device__ __forceinline__ uint32_t stagedBlock(uint8_t const* stage, uint32_t k, uint32_t (&w)[8])
{
    uint32_t const first = (threadIdx.x >> 2) & 1u;
    uint4 const* p = reinterpret_cast<uint4 const*>(stage + 32ull * k);
    uint4 const a = p[first];
    uint4 const b = p[first ^ 1u];
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    return first;
}

/// The largest magnitude of a block as raw half bits (a NaN or an infinity included: see
/// finiteBlockAmax()).
__device__ __forceinline__ uint32_t rawBlockMax(uint32_t const (&w)[8])
{
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i)
    {
        m = __vmaxu2(m, w[i] & 0x7FFF7FFFu);
    }
    return max(m & 0xFFFFu, m >> 16);
}

/// finiteAmax() of a block with a NaN or an infinity, as raw half bits.
__device__ __forceinline__ uint32_t finiteBlockAmax(uint32_t const (&w)[8], uint32_t expMask)
{
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i)
    {
        uint32_t const h = (w[i / 2] >> (16 * (i & 1))) & 0x7FFFu;
        m = ((h & expMask) != expMask && h > m) ? h : m;
    }
    return m;
}

/// Packed "x > y" of two hot-type lanes: 0xFFFF where true.
template <bool kBf16>
__device__ __forceinline__ uint32_t gtMask(uint32_t x, uint32_t y)
{
    if constexpr (kBf16)
    {
        return __hgt2_mask(*reinterpret_cast<__nv_bfloat162 const*>(&x), *reinterpret_cast<__nv_bfloat162 const*>(&y));
    }
    else
    {
        return __hgt2_mask(*reinterpret_cast<__half2 const*>(&x), *reinterpret_cast<__half2 const*>(&y));
    }
}

/// encodeElement()'s binary search over the packed thresholds T, one lane per element of the
/// magnitudes `a`: the masks of the code's bits 2 (m4), 1 (m2) and 0 (m1).
template <bool kBf16>
__device__ __forceinline__ void searchPair(uint32_t a, uint32_t const (&T)[7], uint32_t& m4, uint32_t& m2, uint32_t& m1)
{
    m4 = gtMask<kBf16>(a, T[3]);
    m2 = gtMask<kBf16>(a, (T[5] & m4) | (T[1] & ~m4));
    uint32_t const t1 = (((T[6] & m2) | (T[4] & ~m2)) & m4) | (((T[2] & m2) | (T[0] & ~m2)) & ~m4);
    m1 = gtMask<kBf16>(a, t1);
}

/// Two elements' codes (bits 0-3 and 16-19) of the hot word w under the packed thresholds T.
template <bool kBf16>
__device__ __forceinline__ uint32_t encodePair(uint32_t w, uint32_t const (&T)[7])
{
    uint32_t m4, m2, m1;
    searchPair<kBf16>(w & 0x7FFF7FFFu, T, m4, m2, m1);
    return (m4 & 0x00040004u) | (m2 & 0x00020002u) | (m1 & 0x00010001u) | ((w >> 12) & 0x00080008u);
}

/// The 8 code bytes of a finite block under the block's effective scale bs, from its hot words
/// as stagedBlock() read them (the half `first` in w[0..3]).
template <bool kBf16>
__device__ __forceinline__ uint2 encodeFinite(uint32_t const (&w)[8], uint32_t first, float bs)
{
    float t[7];
    e2m1Thresholds(bs, t);
    uint32_t T[7];
#pragma unroll
    for (int i = 0; i < 7; ++i)
    {
        // t rounded toward zero to the hot type (t is positive or NaN), in both lanes.
        uint32_t const h = kBf16 ? floatBits(t[i]) >> 16 : uint32_t(__half_as_ushort(__float2half_rz(t[i])));
        T[i] = h | (h << 16);
    }
    uint32_t out[2];
#pragma unroll
    for (int q = 0; q < 2; ++q)
    {
        uint32_t b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
        {
            uint32_t const c = encodePair<kBf16>(w[4 * q + i], T);
            b[i] = c | (c >> 12); // byte 0: element 2i in the low nibble, 2i + 1 in the high one
        }
        out[q] = __byte_perm(__byte_perm(b[0], b[1], 0x0040u), __byte_perm(b[2], b[3], 0x0040u), 0x5410u);
    }
    return first ? make_uint2(out[1], out[0]) : make_uint2(out[0], out[1]);
}

/// encodeBlock() of a block with a NaN or an infinity, from its 16 hot elements (in block order):
/// its 8 code bytes and (z) its block scale code.
__device__ __noinline__ uint3 encodeSpecial(uint4 lo, uint4 hi, float s, bool bf16)
{
    uint32_t const w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    uint32_t u[kBlockElems];
#pragma unroll
    for (uint32_t i = 0; i < kBlockElems; ++i)
    {
        u[i] = floatBits(halfToFloat(uint16_t(w[i / 2] >> (16 * (i & 1u))), bf16));
    }
    uint8_t codes[kBlockElems / 2];
    uint8_t const sb = encodeBlock(u, kBlockElems, s, codes);
    uint2 v;
    memcpy(&v, codes, sizeof(v));
    return make_uint3(v.x, v.y, sb);
}

/// Encodes the staged hot buffer of one page into `region` (shared memory laid out as the blob's
/// regions from b.dataOffset on), padding included.
template <bool kBf16>
__device__ void encodeStaged(
    BufferPlan const& b, uint8_t const* stage, uint8_t* region, uint32_t* groupMax, float* groupScale)
{
    GroupMap const groupMap(b);
    uint32_t const expMask = kBf16 ? 0x7F80u : 0x7C00u;
    uint32_t const nBlocks = b.tokens * b.heads * b.blocksPerRow;
    uint32_t const scalesAt = uint32_t(b.blockScaleOffset - b.dataOffset);
    uint32_t const globalsAt = uint32_t(b.globalScaleOffset - b.dataOffset);
    uint32_t const end = uint32_t(b.regionEnd - b.dataOffset);
    for (uint32_t g = threadIdx.x; g < b.groups; g += blockDim.x)
    {
        groupMax[g] = 0;
    }
    // The padding: after the codes, the block scales and the global scales (each under 16 bytes).
    for (uint32_t i = threadIdx.x; i < 48; i += blockDim.x)
    {
        uint32_t const from = i < 16 ? 8 * nBlocks : (i < 32 ? scalesAt + nBlocks : globalsAt + 4 * b.groups);
        uint32_t const to = i < 16 ? scalesAt : (i < 32 ? globalsAt : end);
        if (from + i % 16 < to)
        {
            region[from + i % 16] = 0;
        }
    }
    __syncthreads();
    for (uint32_t k = threadIdx.x; k < nBlocks; k += blockDim.x)
    {
        uint32_t w[8];
        (void)stagedBlock(stage, k, w);
        uint32_t const m = rawBlockMax(w);
        atomicMax(&groupMax[groupMap.of(k)], m >= expMask ? finiteBlockAmax(w, expMask) : m);
    }
    __syncthreads();
    for (uint32_t g = threadIdx.x; g < b.groups; g += blockDim.x)
    {
        float const s = globalScale(halfToFloat(uint16_t(groupMax[g]), kBf16));
        groupScale[g] = s;
        memcpy(region + globalsAt + 4 * g, &s, 4);
    }
    __syncthreads();
    for (uint32_t k = threadIdx.x; k < nBlocks; k += blockDim.x)
    {
        uint32_t w[8];
        uint32_t const first = stagedBlock(stage, k, w);
        uint32_t const m = rawBlockMax(w); // again: cheaper than keeping it in shared memory
        float const s = groupScale[groupMap.of(k)];
        uint8_t sb;
        uint2 codes;
        if (m >= expMask)
        {
            uint4 const x = make_uint4(w[0], w[1], w[2], w[3]);
            uint4 const y = make_uint4(w[4], w[5], w[6], w[7]);
            uint3 const c = encodeSpecial(first ? y : x, first ? x : y, s, kBf16);
            codes = make_uint2(c.x, c.y);
            sb = uint8_t(c.z);
        }
        else
        {
            sb = blockScaleCode(halfToFloat(uint16_t(m), kBf16), s);
            codes = encodeFinite<kBf16>(w, first, blockScale(sb, s));
        }
        reinterpret_cast<uint2*>(region)[k] = codes;
        region[scalesAt + k] = sb;
    }
    __syncthreads();
}

} // namespace
} // namespace nvfp4_codec

// SPDX-License-Identifier: Apache-2.0
//
// nvfp4: the warp kernels (included by kernel.cu). They take lifecycles whose buffers are all
// quantized whole buffers with an fp32 scale per (page, head), when the blobs lie in device
// memory (plan.cpp, codec.cpp). A work item is one group, the blocks under one fp32 scale, and one
// warp takes it alone: its lanes load the group's blocks straight into registers, the group's
// largest magnitude is one warp reduction, and codes, block scales and the group's scale are
// stored from registers (decoding: loaded into registers, decoded and stored). No shared memory
// and no barrier between warps, so a warp waiting for its loads never holds up another; blobs in
// pinned host memory keep the other kernels, whose contiguous 16-byte stores the link needs.
#pragma once

#include "kernel_staged.cuh"

namespace nvfp4_codec {
namespace {

constexpr int kWarpThreads = 256;
constexpr uint32_t kLaneBlocks = 4; ///< Blocks a lane holds: a group of up to 128 blocks is read once.
#ifndef NVFP4_WARP_BLOCKS_PER_SM
#define NVFP4_WARP_BLOCKS_PER_SM 3
#endif

/// The buffer's padding in the blob (after the codes, the block scales and the group scales; each
/// under 16 bytes), by one warp.
__device__ __forceinline__ void zeroPadding(BufferPlan const& b, uint8_t* blob)
{
    uint32_t const lane = threadIdx.x & 31u;
    uint32_t const nBlocks = b.tokens * b.heads * b.blocksPerRow;
    uint64_t const from = lane < 16 ? b.dataOffset + 8ull * nBlocks : b.blockScaleOffset + nBlocks;
    uint64_t const to = lane < 16 ? b.blockScaleOffset : b.globalScaleOffset;
    if (from + lane % 16 < to)
    {
        blob[from + lane % 16] = 0;
    }
    uint64_t const tail = b.globalScaleOffset + 4ull * b.groups + lane;
    if (lane < 16 && tail < b.regionEnd)
    {
        blob[tail] = 0;
    }
}

/// Index within the buffer of block k of group g (rows of the group: k / blocksPerRow-th token's).
__device__ __forceinline__ uint32_t warpBlockIndex(BufferPlan const& b, uint32_t g, uint32_t k)
{
    uint32_t const rowInGroup = divide(k, b.rowDiv);
    uint32_t const j = k - rowInGroup * b.blocksPerRow;
    return (rowInGroup * b.heads + g) * b.blocksPerRow + j;
}

/// Loads this lane's blocks of the chunk starting at group block c0 and returns their largest
/// finite magnitude (raw half bits; 0 past the group's end).
template <bool kBf16>
__device__ __forceinline__ uint32_t loadLaneBlocks(
    BufferPlan const& b, uint32_t g, uint8_t const* hot, uint32_t c0, uint32_t n, uint32_t (&w)[kLaneBlocks][8])
{
    uint32_t const expMask = kBf16 ? 0x7F80u : 0x7C00u;
    uint32_t const lane = threadIdx.x & 31u;
    uint32_t m = 0;
#pragma unroll
    for (uint32_t i = 0; i < kLaneBlocks; ++i)
    {
        uint32_t const k = c0 + lane + 32 * i;
        if (k < n)
        {
            uint4 const* p = reinterpret_cast<uint4 const*>(hot + 32ull * warpBlockIndex(b, g, k));
            uint4 const x = p[0];
            uint4 const y = p[1];
            w[i][0] = x.x, w[i][1] = x.y, w[i][2] = x.z, w[i][3] = x.w;
            w[i][4] = y.x, w[i][5] = y.y, w[i][6] = y.z, w[i][7] = y.w;
        }
    }
#pragma unroll
    for (uint32_t i = 0; i < kLaneBlocks; ++i)
    {
        if (c0 + lane + 32 * i < n)
        {
            uint32_t const r = rawBlockMax(w[i]);
            m = max(m, r >= expMask ? finiteBlockAmax(w[i], expMask) : r);
        }
    }
    return m;
}

template <bool kBf16>
__device__ void encodeGroupWarp(BufferPlan const& b, uint32_t g, uint8_t const* hot, uint8_t* blob)
{
    uint32_t const expMask = kBf16 ? 0x7F80u : 0x7C00u;
    uint32_t const lane = threadIdx.x & 31u;
    uint32_t const n = b.tokens * b.blocksPerRow;
    uint32_t w[kLaneBlocks][8];
    uint32_t m = 0;
    for (uint32_t c0 = 0; c0 < n; c0 += 32 * kLaneBlocks)
    {
        m = max(m, loadLaneBlocks<kBf16>(b, g, hot, c0, n, w));
    }
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    float const s = globalScale(halfToFloat(uint16_t(m), kBf16));
    if (lane == 0)
    {
        reinterpret_cast<float*>(blob + b.globalScaleOffset)[g] = s;
    }
    for (uint32_t c0 = 0; c0 < n; c0 += 32 * kLaneBlocks)
    {
        if (n > 32 * kLaneBlocks) // else the registers still hold the group
        {
            (void)loadLaneBlocks<kBf16>(b, g, hot, c0, n, w);
        }
#pragma unroll
        for (uint32_t i = 0; i < kLaneBlocks; ++i)
        {
            uint32_t const k = c0 + lane + 32 * i;
            if (k < n)
            {
                uint32_t const idx = warpBlockIndex(b, g, k);
                uint32_t const r = rawBlockMax(w[i]);
                uint8_t sb;
                uint2 codes;
                if (r >= expMask)
                {
                    uint3 const c = encodeSpecial(make_uint4(w[i][0], w[i][1], w[i][2], w[i][3]),
                        make_uint4(w[i][4], w[i][5], w[i][6], w[i][7]), s, kBf16);
                    codes = make_uint2(c.x, c.y);
                    sb = uint8_t(c.z);
                }
                else
                {
                    sb = blockScaleCode(halfToFloat(uint16_t(r), kBf16), s);
                    codes = encodeFinite<kBf16>(w[i], 0, blockScale(sb, s));
                }
                reinterpret_cast<uint2*>(blob + b.dataOffset)[idx] = codes;
                blob[b.blockScaleOffset + idx] = sb;
            }
        }
    }
    if (g == 0)
    {
        zeroPadding(b, blob);
    }
}

__device__ void decodeGroupWarp(BufferPlan const& b, uint32_t g, uint8_t* hot, uint8_t const* blob)
{
    bool const bf16 = b.bf16 != 0;
    uint32_t const lane = threadIdx.x & 31u;
    uint32_t const n = b.tokens * b.blocksPerRow;
    float const s = reinterpret_cast<float const*>(blob + b.globalScaleOffset)[g];
    for (uint32_t c0 = 0; c0 < n; c0 += 32 * kLaneBlocks)
    {
        uint2 codes[kLaneBlocks];
        uint32_t sb[kLaneBlocks];
        uint32_t idx[kLaneBlocks];
#pragma unroll
        for (uint32_t i = 0; i < kLaneBlocks; ++i)
        {
            uint32_t const k = c0 + lane + 32 * i;
            if (k < n)
            {
                idx[i] = warpBlockIndex(b, g, k);
                codes[i] = reinterpret_cast<uint2 const*>(blob + b.dataOffset)[idx[i]];
                sb[i] = blob[b.blockScaleOffset + idx[i]];
            }
        }
#pragma unroll
        for (uint32_t i = 0; i < kLaneBlocks; ++i)
        {
            if (c0 + lane + 32 * i < n)
            {
                uint4 out[2];
                decodeWords(codes[i], uint8_t(sb[i]), s, bf16, out);
                uint4* p = reinterpret_cast<uint4*>(hot + 32ull * idx[i]);
                p[0] = out[0];
                p[1] = out[1];
            }
        }
    }
}

// One warp per work item (a group; the plan's items are its groups).
template <bool kEncode>
__global__ void __launch_bounds__(kWarpThreads, NVFP4_WARP_BLOCKS_PER_SM)
    nvfp4Warp(__grid_constant__ KernelArgs const a)
{
    uint64_t const total = a.numPairs * a.itemsPerPage;
    uint64_t const warps = uint64_t(gridDim.x) * (kWarpThreads / 32);
    for (uint64_t item = uint64_t(blockIdx.x) * (kWarpThreads / 32) + threadIdx.x / 32; item < total; item += warps)
    {
        Item it;
        if (!resolveItem<kEncode>(a, item, it))
        {
            continue;
        }
        BufferPlan const& b = *it.b;
        if constexpr (kEncode)
        {
            if (b.bf16)
            {
                encodeGroupWarp<true>(b, uint32_t(it.sub), it.hot, it.blob);
            }
            else
            {
                encodeGroupWarp<false>(b, uint32_t(it.sub), it.hot, it.blob);
            }
        }
        else
        {
            decodeGroupWarp(b, uint32_t(it.sub), it.hot, it.blob);
        }
    }
}

} // namespace
} // namespace nvfp4_codec

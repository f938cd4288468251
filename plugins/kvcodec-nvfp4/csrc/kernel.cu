// SPDX-License-Identifier: Apache-2.0
//
// nvfp4: the CUDA kernel. One launch covers every (page, work item) of a call; a thread block
// takes one work item at a time (grid-stride).
//
// The fast path (BufferPlan::wholeBuffer: rows of whole 16-element blocks, aligned hot bytes) takes
// a whole quantized buffer of a page per work item, 2048 blocks at a time: each of 512 threads loads
// 4 blocks (32 contiguous bytes each; consecutive threads take consecutive blocks) into registers,
// the groups' largest magnitudes are gathered in shared memory, and the codes and block scales are
// staged in shared memory and written out as contiguous 16-byte stores (which is what lets a blob
// in pinned host memory be written at the link's speed). A buffer of at most 2048 blocks is read
// once; a larger one twice. Decoding stages the blob's regions in shared memory the same way and
// writes 32 contiguous hot bytes per block, its eight outputs converted by the hardware (bit for
// bit decodeTable()'s). Encoding and decoding are separate kernels with their own register
// budgets. Other shapes take one work item per fp32 scale and
// read and write in place (the generic path). The arithmetic is format.h's, shared with the CPU
// reference: the blobs are identical.
#include "codec.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "format.h"
#include "kvcodec/kernels.cuh"

namespace nvfp4_codec {
namespace {

constexpr int kThreads = 512;
constexpr uint32_t kResident = 4;                       ///< Blocks a thread holds (fast path).
constexpr uint32_t kChunkBlocks = kThreads * kResident; ///< Blocks of a buffer per fast-path round.

// Resident thread blocks per SM (the launch bounds, and so the register budget) of each direction's
// kernel; tuned on the H200, overridable at build time (-DNVFP4_ENCODE_BLOCKS_PER_SM=...).
#ifndef NVFP4_ENCODE_BLOCKS_PER_SM
#define NVFP4_ENCODE_BLOCKS_PER_SM 2
#endif
#ifndef NVFP4_DECODE_BLOCKS_PER_SM
#define NVFP4_DECODE_BLOCKS_PER_SM 3
#endif
constexpr int kEncodeBlocksPerSm = NVFP4_ENCODE_BLOCKS_PER_SM;
constexpr int kDecodeBlocksPerSm = NVFP4_DECODE_BLOCKS_PER_SM;

/// Shared memory of a thread block.
struct Staging
{
    uint32_t groupMax[kMaxWholeBufferGroups]; ///< Largest magnitude per group, as hot half bits.
    float groupScale[kMaxWholeBufferGroups];  ///< The groups' fp32 scales S.
    alignas(16) uint8_t codes[kChunkBlocks * kBlockElems / 2];
    alignas(16) uint8_t scales[kChunkBlocks];
    uint32_t warpMax[kThreads / 32]; ///< The generic path's block-wide maximum.
};

__device__ __forceinline__ bool aligned(void const* p, uintptr_t a)
{
    return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0;
}

// n <= 16 hot elements at `src` as fp32 bits: two 16-byte loads when whole and aligned.
__device__ __forceinline__ void loadBlock(uint8_t const* src, uint32_t n, bool bf16, uint32_t* u)
{
    if (n == kBlockElems && aligned(src, 16))
    {
        uint4 const v[2] = {reinterpret_cast<uint4 const*>(src)[0], reinterpret_cast<uint4 const*>(src)[1]};
        uint32_t const* w = reinterpret_cast<uint32_t const*>(v);
#pragma unroll
        for (uint32_t i = 0; i < kBlockElems; ++i)
        {
            u[i] = floatBits(halfToFloat(uint16_t(w[i / 2] >> (16 * (i & 1u))), bf16));
        }
        return;
    }
    bool const two = aligned(src, 2);
    for (uint32_t i = 0; i < n; ++i)
    {
        uint16_t const h
            = two ? reinterpret_cast<uint16_t const*>(src)[i] : uint16_t(src[2 * i] | (src[2 * i + 1] << 8));
        u[i] = floatBits(halfToFloat(h, bf16));
    }
}

__device__ __forceinline__ void storeBlock(uint8_t* dst, uint32_t n, uint16_t const* out)
{
    if (n == kBlockElems && aligned(dst, 16))
    {
        uint4 v[2];
        uint32_t* w = reinterpret_cast<uint32_t*>(v);
#pragma unroll
        for (uint32_t i = 0; i < kBlockElems / 2; ++i)
        {
            w[i] = uint32_t(out[2 * i]) | (uint32_t(out[2 * i + 1]) << 16);
        }
        reinterpret_cast<uint4*>(dst)[0] = v[0];
        reinterpret_cast<uint4*>(dst)[1] = v[1];
        return;
    }
    bool const two = aligned(dst, 2);
    for (uint32_t i = 0; i < n; ++i)
    {
        if (two)
        {
            reinterpret_cast<uint16_t*>(dst)[i] = out[i];
        }
        else
        {
            dst[2 * i] = uint8_t(out[i]);
            dst[2 * i + 1] = uint8_t(out[i] >> 8);
        }
    }
}

__device__ __forceinline__ void copyBytes(uint8_t* dst, uint8_t const* src, uint64_t n)
{
    if (aligned(dst, 16) && aligned(src, 16) && n % 16 == 0)
    {
        for (uint64_t i = threadIdx.x; i < n / 16; i += blockDim.x)
        {
            reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<uint4 const*>(src)[i];
        }
        return;
    }
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x)
    {
        dst[i] = src[i];
    }
}

__device__ __forceinline__ void zeroBytes(uint8_t* blob, uint64_t begin, uint64_t end)
{
    for (uint64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    {
        blob[i] = 0;
    }
}

// The largest of every thread's `v` (fp32 bits of non-negative values order like the floats).
__device__ float blockMax(uint32_t v, uint32_t* shared)
{
#pragma unroll
    for (int d = 16; d > 0; d /= 2)
    {
        v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, d));
    }
    if ((threadIdx.x & 31u) == 0)
    {
        shared[threadIdx.x / 32] = v;
    }
    __syncthreads();
    uint32_t m = 0;
    for (uint32_t w = 0; w < blockDim.x / 32; ++w)
    {
        m = max(m, shared[w]);
    }
    __syncthreads(); // `shared` is reused by the next work item
    return bitsFloat(m);
}

// Loads block k of group g into u (as fp32 bits), with its row and block column: returns its
// element count.
__device__ __forceinline__ uint32_t loadGroupBlock(
    BufferPlan const& b, uint64_t g, uint64_t k, uint8_t const* hot, bool bf16, uint32_t* u, uint64_t& row, uint32_t& j)
{
    blockPosition(b, g, k, row, j);
    uint32_t const n = min(kBlockElems, b.headDim - kBlockElems * j);
    loadBlock(hot + 2 * (row * b.headDim + kBlockElems * j), n, bf16, u);
    return n;
}

__device__ void encodeGroup(BufferPlan const& b, uint64_t g, uint8_t const* hot, uint8_t* blob, uint32_t* shared)
{
    bool const bf16 = b.bf16 != 0;
    uint32_t u[kBlockElems];
    uint32_t local = 0;
    for (uint64_t k = threadIdx.x; k < b.blocksPerGroup; k += blockDim.x)
    {
        uint64_t row;
        uint32_t j;
        uint32_t const n = loadGroupBlock(b, g, k, hot, bf16, u, row, j);
        local = max(local, floatBits(finiteAmax(u, n)));
    }
    float const s = globalScale(blockMax(local, shared));
    if (threadIdx.x == 0)
    {
        uint32_t const bits = floatBits(s);
        uint8_t* dst = blob + b.globalScaleOffset + 4 * g;
        for (int i = 0; i < 4; ++i)
        {
            dst[i] = uint8_t(bits >> (8 * i));
        }
    }
    for (uint64_t k = threadIdx.x; k < b.blocksPerGroup; k += blockDim.x)
    {
        uint64_t row;
        uint32_t j;
        uint32_t const n = loadGroupBlock(b, g, k, hot, bf16, u, row, j);
        uint8_t codes[kBlockElems / 2];
        uint8_t const sb = encodeBlock(u, n, s, codes);
        uint8_t* dst = blob + b.dataOffset + row * b.rowCodeBytes + kBlockElems / 2 * j;
        if (n == kBlockElems && aligned(dst, 8))
        {
            uint2 v;
            memcpy(&v, codes, sizeof(v));
            *reinterpret_cast<uint2*>(dst) = v;
        }
        else
        {
            for (uint32_t i = 0; i < (n + 1) / 2; ++i)
            {
                dst[i] = codes[i];
            }
        }
        blob[b.blockScaleOffset + row * b.blocksPerRow + j] = sb;
    }
    if (g == 0) // the buffer's padding, once
    {
        uint64_t const rows = uint64_t(b.tokens) * b.heads;
        zeroBytes(blob, b.dataEnd, b.blockScaleOffset);
        zeroBytes(blob, b.blockScaleOffset + rows * b.blocksPerRow, b.globalScaleOffset);
        zeroBytes(blob, b.globalScaleOffset + 4 * uint64_t(b.groups), b.regionEnd);
    }
}

__device__ void decodeGroup(BufferPlan const& b, uint64_t g, uint8_t* hot, uint8_t const* blob)
{
    uint8_t const* sp = blob + b.globalScaleOffset + 4 * g;
    float const s
        = bitsFloat(uint32_t(sp[0]) | (uint32_t(sp[1]) << 8) | (uint32_t(sp[2]) << 16) | (uint32_t(sp[3]) << 24));
    bool const bf16 = b.bf16 != 0;
    for (uint64_t k = threadIdx.x; k < b.blocksPerGroup; k += blockDim.x)
    {
        uint64_t row;
        uint32_t j;
        blockPosition(b, g, k, row, j);
        uint32_t const n = min(kBlockElems, b.headDim - kBlockElems * j);
        uint8_t const* src = blob + b.dataOffset + row * b.rowCodeBytes + kBlockElems / 2 * j;
        uint8_t codes[kBlockElems / 2];
        if (n == kBlockElems && aligned(src, 8))
        {
            uint2 const v = *reinterpret_cast<uint2 const*>(src);
            memcpy(codes, &v, sizeof(v));
        }
        else
        {
            for (uint32_t i = 0; i < (n + 1) / 2; ++i)
            {
                codes[i] = src[i];
            }
        }
        uint16_t out[kBlockElems];
        decodeBlock(codes, n, blob[b.blockScaleOffset + row * b.blocksPerRow + j], s, bf16, out);
        storeBlock(hot + 2 * (row * b.headDim + kBlockElems * j), n, out);
    }
}

// ---- The fast path: a whole buffer per work item ----------------------------------------------

// Bytes [0, n) of shared `src` to `dst`, then zeros up to `total` (the region's padding): 16-byte
// stores when `dst` and `total` allow.
__device__ void writeOut(uint8_t* dst, uint8_t const* src, uint32_t n, uint32_t total)
{
    if (aligned(dst, 16) && total % 16 == 0)
    {
        for (uint32_t i = threadIdx.x; i < total / 16; i += blockDim.x)
        {
            uint4 w;
            if (16 * i + 16 <= n)
            {
                w = reinterpret_cast<uint4 const*>(src)[i];
            }
            else
            {
                uint8_t tmp[16];
                for (uint32_t k = 0; k < 16; ++k)
                {
                    tmp[k] = 16 * i + k < n ? src[16 * i + k] : 0;
                }
                memcpy(&w, tmp, sizeof(w));
            }
            reinterpret_cast<uint4*>(dst)[i] = w;
        }
        return;
    }
    for (uint32_t i = threadIdx.x; i < total; i += blockDim.x)
    {
        dst[i] = i < n ? src[i] : 0;
    }
}

// Bytes [0, n) of `src` into shared `dst`: 16-byte loads when `src` allows.
__device__ void readIn(uint8_t* dst, uint8_t const* src, uint32_t n)
{
    uint32_t whole = 0;
    if (aligned(src, 16))
    {
        whole = n / 16;
        for (uint32_t i = threadIdx.x; i < whole; i += blockDim.x)
        {
            reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<uint4 const*>(src)[i];
        }
    }
    for (uint32_t i = 16 * whole + threadIdx.x; i < n; i += blockDim.x)
    {
        dst[i] = src[i];
    }
}

// The group (index of its fp32 scale) of block k of a whole buffer.
__device__ __forceinline__ uint32_t groupOf(BufferPlan const& b, uint32_t k)
{
    return b.groups == 1 ? 0u : (k / b.blocksPerRow) % b.heads;
}

// Loads this thread's blocks of the round starting at block c0 (block c0 + threadIdx.x + m *
// kThreads) and their largest finite magnitudes as hot half bits (0 past the buffer's end).
__device__ __forceinline__ void loadRound(uint8_t const* hot, uint32_t c0, uint32_t nBlocks, uint32_t expMask,
    uint4 (&v)[kResident][2], uint32_t (&amax)[kResident])
{
#pragma unroll
    for (uint32_t m = 0; m < kResident; ++m)
    {
        uint32_t const k = c0 + threadIdx.x + m * kThreads;
        amax[m] = 0;
        if (k < nBlocks)
        {
            uint4 const* p = reinterpret_cast<uint4 const*>(hot + 32ull * k);
            v[m][0] = p[0];
            v[m][1] = p[1];
            uint32_t const* w = reinterpret_cast<uint32_t const*>(v[m]);
#pragma unroll
            for (uint32_t i = 0; i < kBlockElems; ++i)
            {
                uint32_t const h = (w[i / 2] >> (16 * (i & 1u))) & 0x7FFFu;
                amax[m] = ((h & expMask) != expMask && h > amax[m]) ? h : amax[m];
            }
        }
    }
}

// The 8 code bytes and the block scale of one whole block (hot words `v`) under the group scale s.
__device__ __forceinline__ uint2 encodeWords(uint4 const (&v)[2], float amax, float s, bool bf16, uint8_t& sb)
{
    sb = blockScaleCode(amax, s);
    float t[7];
    e2m1Thresholds(blockScale(sb, s), t);
    uint32_t const* w = reinterpret_cast<uint32_t const*>(v);
    uint32_t out[2] = {0, 0};
#pragma unroll
    for (uint32_t i = 0; i < kBlockElems / 2; ++i)
    {
        uint32_t const lo = encodeElement(floatBits(halfToFloat(uint16_t(w[i]), bf16)), t);
        uint32_t const hi = encodeElement(floatBits(halfToFloat(uint16_t(w[i] >> 16), bf16)), t);
        out[i / 4] |= (lo | (hi << 4)) << (8 * (i & 3u));
    }
    return make_uint2(out[0], out[1]);
}

// One whole block's 32 hot bytes from its 8 code bytes: decodeTable()'s values picked two at a
// time with byte permutes, the sign bits set on top (decodeBlock()'s result, without branches).
// floatToHalfSat() of a non-negative finite v with one hardware conversion: clamping to the largest
// finite value first gives the same bits as saturating after rounding (both round to nearest even).
__device__ __forceinline__ uint16_t toHotSat(float v, bool bf16)
{
    if (bf16)
    {
        return __bfloat16_as_ushort(__float2bfloat16_rn(fminf(v, bitsFloat(0x7F7F0000u))));
    }
    return __half_as_ushort(__float2half_rn(fminf(v, 65504.0f)));
}

__device__ __forceinline__ void decodeWords(uint2 codes, uint8_t sb, float s, bool bf16, uint4 (&out)[2])
{
    // decodeTable(): the hot bits of the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 times the block scale.
    float const bs = blockScale(sb, s);
    uint16_t lut[8];
    lut[0] = 0;
#pragma unroll
    for (uint32_t c = 1; c < 8; ++c)
    {
        lut[c] = toHotSat(mulRn(e2m1Value(c), bs), bf16);
    }
    uint32_t const r0 = lut[0] | (uint32_t(lut[1]) << 16);
    uint32_t const r1 = lut[2] | (uint32_t(lut[3]) << 16);
    uint32_t const r2 = lut[4] | (uint32_t(lut[5]) << 16);
    uint32_t const r3 = lut[6] | (uint32_t(lut[7]) << 16);
    uint32_t* o = reinterpret_cast<uint32_t*>(out);
#pragma unroll
    for (uint32_t i = 0; i < kBlockElems / 2; ++i)
    {
        uint32_t const c = ((i < 4 ? codes.x : codes.y) >> (8 * (i & 3u))) & 0xFFu;
        // Bytes 2a, 2a+1 (element 2i) and 2b, 2b+1 (element 2i+1) of the 8-byte table halves,
        // a and b the low two magnitude bits; the third magnitude bit picks the half.
        uint32_t const y = (c & 3u) | ((c << 4) & 0x300u);
        uint32_t const sel = y * 0x22u + 0x1010u;
        uint32_t const lo = __byte_perm(r0, r1, sel);
        uint32_t const hi = __byte_perm(r2, r3, sel);
        uint32_t const pick = (((c >> 2) & 1u) | (((c >> 6) & 1u) << 16)) * 0xFFFFu;
        o[i] = (hi & pick) | (lo & ~pick) | ((c & 8u) << 12) | ((c & 0x80u) << 24);
    }
}

__device__ void encodeWhole(BufferPlan const& b, uint8_t const* hot, uint8_t* blob, Staging& st)
{
    bool const bf16 = b.bf16 != 0;
    uint32_t const expMask = bf16 ? 0x7F80u : 0x7C00u;
    uint32_t const nBlocks = b.tokens * b.heads * b.blocksPerRow;
    for (uint32_t g = threadIdx.x; g < b.groups; g += blockDim.x)
    {
        st.groupMax[g] = 0;
    }
    __syncthreads();
    uint4 v[kResident][2];
    uint32_t amax[kResident];
    for (uint32_t c0 = 0; c0 < nBlocks; c0 += kChunkBlocks) // the groups' largest magnitudes
    {
        loadRound(hot, c0, nBlocks, expMask, v, amax);
        uint32_t run = 0;
        uint32_t runGroup = groupOf(b, c0 + threadIdx.x);
#pragma unroll
        for (uint32_t m = 0; m < kResident; ++m)
        {
            uint32_t const g = groupOf(b, c0 + threadIdx.x + m * kThreads);
            if (g != runGroup)
            {
                atomicMax(&st.groupMax[runGroup], run);
                runGroup = g;
                run = 0;
            }
            run = max(run, amax[m]);
        }
        if (b.groups == 1)
        {
            run = __reduce_max_sync(0xFFFFFFFFu, run);
        }
        if (b.groups != 1 || (threadIdx.x & 31u) == 0)
        {
            atomicMax(&st.groupMax[runGroup], run);
        }
    }
    __syncthreads();
    for (uint32_t g = threadIdx.x; g < b.groups; g += blockDim.x)
    {
        st.groupScale[g] = globalScale(halfToFloat(uint16_t(st.groupMax[g]), bf16));
    }
    __syncthreads();
    for (uint32_t c0 = 0; c0 < nBlocks; c0 += kChunkBlocks)
    {
        if (nBlocks > kChunkBlocks) // else the registers still hold the buffer
        {
            loadRound(hot, c0, nBlocks, expMask, v, amax);
        }
#pragma unroll
        for (uint32_t m = 0; m < kResident; ++m)
        {
            uint32_t const k = c0 + threadIdx.x + m * kThreads;
            if (k < nBlocks)
            {
                uint8_t sb;
                uint2 const codes
                    = encodeWords(v[m], halfToFloat(uint16_t(amax[m]), bf16), st.groupScale[groupOf(b, k)], bf16, sb);
                reinterpret_cast<uint2*>(st.codes)[k - c0] = codes;
                st.scales[k - c0] = sb;
            }
        }
        __syncthreads();
        uint32_t const n = min(kChunkBlocks, nBlocks - c0);
        bool const last = c0 + n == nBlocks; // the last round also writes the regions' padding
        uint64_t const codesAt = b.dataOffset + 8ull * c0;
        uint64_t const scalesAt = b.blockScaleOffset + c0;
        writeOut(blob + codesAt, st.codes, 8 * n, last ? uint32_t(b.blockScaleOffset - codesAt) : 8 * n);
        writeOut(blob + scalesAt, st.scales, n, last ? uint32_t(b.globalScaleOffset - scalesAt) : n);
        __syncthreads();
    }
    writeOut(blob + b.globalScaleOffset, reinterpret_cast<uint8_t const*>(st.groupScale), 4 * b.groups,
        uint32_t(b.regionEnd - b.globalScaleOffset));
    __syncthreads(); // `st` is reused by the next work item
}

__device__ void decodeWhole(BufferPlan const& b, uint8_t* hot, uint8_t const* blob, Staging& st)
{
    bool const bf16 = b.bf16 != 0;
    uint32_t const nBlocks = b.tokens * b.heads * b.blocksPerRow;
    readIn(reinterpret_cast<uint8_t*>(st.groupScale), blob + b.globalScaleOffset, 4 * b.groups);
    for (uint32_t c0 = 0; c0 < nBlocks; c0 += kChunkBlocks)
    {
        uint32_t const n = min(kChunkBlocks, nBlocks - c0);
        readIn(st.codes, blob + b.dataOffset + 8ull * c0, 8 * n);
        readIn(st.scales, blob + b.blockScaleOffset + c0, n);
        __syncthreads();
#pragma unroll
        for (uint32_t m = 0; m < kResident; ++m)
        {
            uint32_t const k = c0 + threadIdx.x + m * kThreads;
            if (k < nBlocks)
            {
                uint4 out[2];
                decodeWords(reinterpret_cast<uint2 const*>(st.codes)[k - c0], st.scales[k - c0],
                    st.groupScale[groupOf(b, k)], bf16, out);
                uint4* p = reinterpret_cast<uint4*>(hot + 32ull * k);
                p[0] = out[0];
                p[1] = out[1];
            }
        }
        __syncthreads();
    }
}

// One kernel per direction, so that decoding (no hot blocks held in registers) is not held to the
// encoder's register budget.
template <bool kEncode>
__global__ void __launch_bounds__(kThreads, kEncode ? kEncodeBlocksPerSm : kDecodeBlocksPerSm)
    nvfp4Kernel(__grid_constant__ KernelArgs const a)
{
    __shared__ Staging st;
    uint64_t const total = a.numPairs * a.itemsPerPage;
    for (uint64_t item = blockIdx.x; item < total; item += gridDim.x)
    {
        uint64_t const page = item / a.itemsPerPage;
        uint64_t const r = item - page * a.itemsPerPage;
        kvcodec::PageIndexPair const pair = a.pairs[page];
        int32_t const hotIdx = kEncode ? pair.src : pair.dst;
        int32_t const coldIdx = kEncode ? pair.dst : pair.src;
        if (hotIdx < 0 || uint64_t(hotIdx) >= a.numHotSlots || coldIdx < 0)
        {
            continue; // Out-of-range pairs are skipped (uniformly per thread block): never write outside the pools.
        }
        uint32_t bi = 0;
        while (bi + 1 < a.numBuffers && r >= a.buffers[bi + 1].firstItem)
        {
            ++bi;
        }
        BufferPlan const& b = a.buffers[bi];
        uint64_t const sub = r - b.firstItem;
        uint8_t* hot = reinterpret_cast<uint8_t*>(b.poolBase + uint64_t(hotIdx) * b.slotBytes + b.hotOffset);
        uint8_t* blob = reinterpret_cast<uint8_t*>(a.blob + uint64_t(coldIdx) * a.coldPageBytes);
        if (b.quantized && b.wholeBuffer)
        {
            if constexpr (kEncode)
            {
                encodeWhole(b, hot, blob, st);
            }
            else
            {
                decodeWhole(b, hot, blob, st);
            }
            continue;
        }
        if (b.quantized)
        {
            if constexpr (kEncode)
            {
                encodeGroup(b, sub, hot, blob, st.warpMax);
            }
            else
            {
                decodeGroup(b, sub, hot, blob);
            }
            continue;
        }
        uint64_t const begin = sub * kCopyChunkBytes;
        uint64_t const n = min(kCopyChunkBytes, b.bytes - min(begin, b.bytes));
        if constexpr (kEncode)
        {
            copyBytes(blob + b.dataOffset + begin, hot + begin, n);
            if (sub + 1 == b.items)
            {
                zeroBytes(blob, b.dataEnd, b.regionEnd);
            }
        }
        else
        {
            copyBytes(hot + begin, blob + b.dataOffset + begin, n);
        }
    }
}

} // namespace

cudaError_t preloadKernel() noexcept
{
    return kvcodec::preloadKernels(nvfp4Kernel<true>, nvfp4Kernel<false>);
}

cudaError_t launchKernel(KernelArgs const& args, int numSms, cudaStream_t stream) noexcept
{
    uint64_t const total = args.numPairs * args.itemsPerPage;
    if (total == 0)
    {
        return cudaSuccess;
    }
    // As many thread blocks as are resident at once (the kernels' launch bounds): each takes work
    // items grid-stride, so no partial wave waits on the last.
    unsigned const blocks = kvcodec::gridBlocks(total, numSms, args.encode ? kEncodeBlocksPerSm : kDecodeBlocksPerSm);
    if (args.encode)
    {
        nvfp4Kernel<true><<<blocks, kThreads, 0, stream>>>(args);
    }
    else
    {
        nvfp4Kernel<false><<<blocks, kThreads, 0, stream>>>(args);
    }
    return cudaGetLastError();
}

} // namespace nvfp4_codec

// SPDX-License-Identifier: Apache-2.0
//
// nvfp4: the CUDA kernels. One launch covers every (page, work item) of a call; a thread block
// takes one work item at a time (grid-stride).
//
// Whole buffers (BufferPlan::wholeBuffer: rows of whole 16-element blocks, aligned hot bytes) are
// one work item each. Encoding them:
//  - the staged encoder (kernel_staged.cuh) when every whole buffer of the lifecycle fits its
//    stages in shared memory (kMaxStagedBytes): the next item's hot bytes are copied in while this
//    one is encoded, and the element codes come from packed comparisons;
//  - else the register path below: 2048 blocks at a time, each of 512 threads holding 4 blocks
//    (32 contiguous bytes each; consecutive threads take consecutive blocks), the groups' largest
//    magnitudes gathered in shared memory; a buffer of at most 2048 blocks is read once, a larger
//    one twice.
// Both build the codes and block scales in shared memory and write them as contiguous 16-byte
// stores (which is what lets a blob in pinned host memory be written at the link's speed).
// Decoding stages the blob's regions in shared memory the same way, decodes each block (each
// element's e2m1 value times the block scale in fp32, then the hardware conversion; byte permutes
// over a table of decodeTable()'s values for extreme scales: decodeWords()), and writes a warp's 32
// blocks as contiguous 16-byte stores through shared memory. Other shapes take one work
// item per fp32 scale and read and write in place (the generic path, kernel_common.cuh).
// Lifecycles of whole buffers with a scale per head whose blobs lie in device memory take the warp
// kernels instead, a warp per group (kernel_warp.cuh; encoding groups of at most
// kMaxWarpStagedGroupBytes, the warp-staged encoder of kernel_warp_staged.cuh). The
// arithmetic is format.h's, shared with the CPU reference: the blobs are identical.
#include "codec.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "format.h"
#include "kernel_common.cuh"
#include "kernel_staged.cuh"
#include "kernel_warp.cuh"
#include "kernel_warp_staged.cuh"
#include "kvcodec/kernels.cuh"

namespace nvfp4_codec {
namespace {

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

__device__ void encodeWhole(BufferPlan const& b, uint8_t const* hot, uint8_t* blob, Staging& st)
{
    GroupMap const groupMap(b);
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
        uint32_t runGroup = groupMap.of(c0 + threadIdx.x);
#pragma unroll
        for (uint32_t m = 0; m < kResident; ++m)
        {
            uint32_t const g = groupMap.of(c0 + threadIdx.x + m * kThreads);
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
                    = encodeWords(v[m], halfToFloat(uint16_t(amax[m]), bf16), st.groupScale[groupMap.of(k)], bf16, sb);
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

// Stores the 32 hot bytes each lane decoded (the warp's 32 consecutive blocks from `dst`) as
// 16-byte stores that each cover 512 contiguous bytes, through the warp's own 1 KiB of `scratch`
// (a lane's two stores would otherwise each half-fill 32 sectors).
__device__ __forceinline__ void storeWarpBlocks(uint8_t* dst, uint4 const (&out)[2], uint4* scratch)
{
    uint32_t const lane = threadIdx.x & 31u;
    uint32_t const first = (lane >> 2) & 1u; // lanes 4-7 of eight first: no bank conflicts
    scratch[2 * lane + first] = first ? out[1] : out[0];
    scratch[2 * lane + (first ^ 1u)] = first ? out[0] : out[1];
    __syncwarp();
    uint4* d = reinterpret_cast<uint4*>(dst);
    d[lane] = scratch[lane];
    d[32 + lane] = scratch[32 + lane];
    __syncwarp();
}

__device__ void decodeWhole(BufferPlan const& b, uint8_t* hot, uint8_t const* blob, Staging& st)
{
    GroupMap const groupMap(b);
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
            uint32_t const warpFirst = k - (threadIdx.x & 31u);
            if (k < nBlocks)
            {
                uint4 out[2];
                decodeWords(reinterpret_cast<uint2 const*>(st.codes)[k - c0], st.scales[k - c0],
                    st.groupScale[groupMap.of(k)], bf16, out);
                if (warpFirst + 32 <= nBlocks) // the whole warp holds blocks
                {
                    storeWarpBlocks(hot + 32ull * warpFirst, out, st.scratch[threadIdx.x / 32]);
                }
                else
                {
                    uint4* p = reinterpret_cast<uint4*>(hot + 32ull * k);
                    p[0] = out[0];
                    p[1] = out[1];
                }
            }
        }
        __syncthreads();
    }
}

// Resolves work item `item` into `it` (false: past the end or out of range) and, when it is a
// staged one, starts the asynchronous copy of its hot buffer into `stage`; commits a copy group
// in every case (the waits count groups).
__device__ __forceinline__ bool stageItem(KernelArgs const& a, uint64_t item, uint64_t total, uint8_t* stage, Item& it)
{
    bool const valid = item < total && resolveItem<true>(a, item, it);
    if (valid && it.b->staged)
    {
        uint32_t const n = uint32_t(it.b->bytes / 16);
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
        {
            kvcodec::copyAsync16(stage + 16 * i, it.hot + 16 * i);
        }
    }
    kvcodec::copyAsyncCommit();
    return valid;
}

// Thread blocks of the staged encoder per multiprocessor it is built for (the launch bounds), its
// threads, and its stages: 2 (the next work item's buffer copied in while this one is encoded;
// shared memory holds two of the lifecycle's largest buffers) or 1. Tuned on Hopper; overridable
// at build time like the register path's.
#ifndef NVFP4_STAGED_BLOCKS_PER_SM
#define NVFP4_STAGED_BLOCKS_PER_SM 2
#endif
#ifndef NVFP4_STAGES
#define NVFP4_STAGES 2
#endif
#ifndef NVFP4_STAGED_THREADS
#define NVFP4_STAGED_THREADS 256
#endif
constexpr uint32_t kStages = NVFP4_STAGES;
constexpr int kStagedThreads = NVFP4_STAGED_THREADS; ///< Fewer than kThreads: registers for the packed encoder.

// The staged encoder (kernel_staged.cuh): every whole buffer of the lifecycle is staged through
// shared memory, the next work item's buffer copied in while this one is encoded.
__global__ void __launch_bounds__(kStagedThreads, NVFP4_STAGED_BLOCKS_PER_SM)
    nvfp4Staged(__grid_constant__ KernelArgs const a)
{
    extern __shared__ __align__(16) uint8_t dynamic[];
    __shared__ uint32_t groupMax[kMaxWholeBufferGroups];
    __shared__ float groupScale[kMaxWholeBufferGroups];
    __shared__ uint32_t warpMax[kStagedThreads / 32];
    uint32_t const stageBytes = a.staged.hotBytes;
    uint8_t* const region = dynamic + kStages * stageBytes;
    uint64_t const total = a.numPairs * a.itemsPerPage;
    Item next;
    bool nextValid = kStages == 2 && stageItem(a, blockIdx.x, total, dynamic, next);
    uint32_t cur = 0;
    for (uint64_t item = blockIdx.x; item < total; item += gridDim.x, cur ^= (kStages - 1))
    {
        uint8_t* const stage = dynamic + cur * stageBytes;
        Item it = next;
        bool const valid = kStages == 2 ? nextValid : stageItem(a, item, total, stage, it);
        if (kStages == 2)
        {
            nextValid = stageItem(a, item + gridDim.x, total, dynamic + (cur ^ 1u) * stageBytes, next);
        }
        if (valid && !it.b->staged)
        {
            unstagedItem<true>(it, warpMax);
        }
        else if (valid)
        {
            if (kStages == 2)
            {
                kvcodec::copyAsyncWaitPrior<1>();
            }
            else
            {
                kvcodec::copyAsyncWaitAll();
            }
            __syncthreads();
            BufferPlan const& b = *it.b;
            if (b.bf16)
            {
                encodeStaged<true>(b, stage, region, groupMax, groupScale);
            }
            else
            {
                encodeStaged<false>(b, stage, region, groupMax, groupScale);
            }
            uint32_t const n = uint32_t(b.regionEnd - b.dataOffset);
            writeOut(it.blob + b.dataOffset, region, n, n);
            __syncthreads(); // the stage and the region are reused
        }
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
        Item it;
        if (!resolveItem<kEncode>(a, item, it))
        {
            continue;
        }
        if (it.b->quantized && it.b->wholeBuffer)
        {
            if constexpr (kEncode)
            {
                encodeWhole(*it.b, it.hot, it.blob, st);
            }
            else
            {
                decodeWhole(*it.b, it.hot, it.blob, st);
            }
            continue;
        }
        unstagedItem<kEncode>(it, st.warpMax);
    }
}

} // namespace

cudaError_t preloadKernel() noexcept
{
    cudaError_t const status = kvcodec::preloadKernels(
        nvfp4Kernel<true>, nvfp4Kernel<false>, nvfp4Staged, nvfp4Warp<true>, nvfp4Warp<false>, nvfp4WarpStaged);
    if (status != cudaSuccess)
    {
        return status;
    }
    return cudaFuncSetAttribute(
        nvfp4WarpStaged, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kWarpStagedSharedBytes));
}

uint32_t stagedStages() noexcept
{
    return kStages;
}

cudaError_t stagedOccupancy(uint32_t sharedBytes, int& blocksPerSm) noexcept
{
    auto const kernel = nvfp4Staged;
    blocksPerSm = 0;
    cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sharedBytes));
    if (status == cudaErrorInvalidValue)
    {
        (void)cudaGetLastError(); // more than a multiprocessor has: the register path
        return cudaSuccess;
    }
    if (status != cudaSuccess)
    {
        return status;
    }
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocksPerSm, kernel, kStagedThreads, sharedBytes);
}

cudaError_t launchKernel(KernelArgs const& call, int numSms, cudaStream_t stream) noexcept
{
    uint64_t const total = call.numPairs * call.itemsPerPage;
    if (total == 0)
    {
        return cudaSuccess;
    }
    KernelArgs args = call;
    args.itemsDiv = args.itemsPerPage < (uint64_t(1) << 31) ? fastDiv(uint32_t(args.itemsPerPage)) : FastDiv{};
    // As many thread blocks as are resident at once (the kernels' launch bounds): each takes work
    // items grid-stride, so no partial wave waits on the last.
    if (args.warpPath)
    {
        constexpr uint64_t warpsPerBlock = kWarpThreads / 32;
        unsigned const blocks
            = kvcodec::gridBlocks((total + warpsPerBlock - 1) / warpsPerBlock, numSms, NVFP4_WARP_BLOCKS_PER_SM);
        if (args.encode && args.warpStaged)
        {
            unsigned const stagedBlocks = kvcodec::gridBlocks(
                (total + warpsPerBlock - 1) / warpsPerBlock, numSms, NVFP4_WARP_STAGED_BLOCKS_PER_SM);
            nvfp4WarpStaged<<<stagedBlocks, kWarpThreads, kWarpStagedSharedBytes, stream>>>(args);
        }
        else if (args.encode)
        {
            nvfp4Warp<true><<<blocks, kWarpThreads, 0, stream>>>(args);
        }
        else
        {
            nvfp4Warp<false><<<blocks, kWarpThreads, 0, stream>>>(args);
        }
    }
    else if (args.encode && args.stagedBlocksPerSm > 0)
    {
        unsigned const blocks = kvcodec::gridBlocks(total, numSms, uint64_t(args.stagedBlocksPerSm));
        nvfp4Staged<<<blocks, kStagedThreads, args.staged.sharedBytes(), stream>>>(args);
    }
    else if (args.encode)
    {
        nvfp4Kernel<true><<<kvcodec::gridBlocks(total, numSms, kEncodeBlocksPerSm), kThreads, 0, stream>>>(args);
    }
    else
    {
        nvfp4Kernel<false><<<kvcodec::gridBlocks(total, numSms, kDecodeBlocksPerSm), kThreads, 0, stream>>>(args);
    }
    return cudaGetLastError();
}

} // namespace nvfp4_codec

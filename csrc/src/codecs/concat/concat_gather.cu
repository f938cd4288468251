// SPDX-License-Identifier: Apache-2.0
#include "concat_gather.h"

#include "kvcodec/kernels.cuh"
#include <algorithm>

namespace kvcodec::concat {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

// Copies `len` bytes with the whole block, using the widest word that src, dst and len allow.
// Loads are issued kUnroll at a time so enough bytes are in flight to saturate PCIe when one
// side is mapped host memory.
template <typename Word>
__device__ __forceinline__ void blockCopy(char* dst, char const* src, uint64_t len)
{
    auto* d = reinterpret_cast<Word*>(dst);
    auto const* s = reinterpret_cast<Word const*>(src);
    uint64_t const words = len / sizeof(Word);
    uint64_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * kThreads < words; i += kUnroll * kThreads)
    {
        Word v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
        {
            v[u] = s[i + u * kThreads];
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
        {
            d[i + u * kThreads] = v[u];
        }
    }
    for (; i < words; i += kThreads)
    {
        d[i] = s[i];
    }
}

__device__ __forceinline__ void copyPiece(char* dst, char const* src, uint64_t len)
{
    uint64_t const mis = reinterpret_cast<uint64_t>(dst) | reinterpret_cast<uint64_t>(src) | len;
    if ((mis & 15) == 0)
    {
        blockCopy<uint4>(dst, src, len);
    }
    else if ((mis & 7) == 0)
    {
        blockCopy<uint2>(dst, src, len);
    }
    else if ((mis & 3) == 0)
    {
        blockCopy<uint32_t>(dst, src, len);
    }
    else
    {
        blockCopy<unsigned char>(dst, src, len);
    }
}

__global__ void __launch_bounds__(kThreads) gatherKernel(GatherArgs a)
{
    uint64_t const total = a.numPairs * a.chunksPerPage;
    for (uint64_t w = blockIdx.x; w < total; w += gridDim.x)
    {
        uint64_t const page = w / a.chunksPerPage;
        uint64_t const r = w - page * a.chunksPerPage;
        GatherPool const pool = a.pools[poolOfChunk(a.pools, a.numPools, r)];
        // One aligned 64-bit load fetches both indices.
        long long const packed = __ldg(reinterpret_cast<long long const*>(a.pairs) + page);
        int32_t const dstIdx = static_cast<int32_t>(packed & 0xffffffffll);
        int32_t const srcIdx = static_cast<int32_t>(packed >> 32);
        int32_t const hotIdx = a.encode ? srcIdx : dstIdx;
        int32_t const coldIdx = a.encode ? dstIdx : srcIdx;
        if (hotIdx < 0 || uint64_t(hotIdx) >= a.numHotSlots || coldIdx < 0)
        {
            continue;
        }
        uint64_t const off = (r - pool.firstChunk) * a.chunkBytes;
        uint64_t const len = min(a.chunkBytes, pool.slotBytes - off);
        char* hot = reinterpret_cast<char*>(pool.base + uint64_t(hotIdx) * pool.slotBytes + off);
        char* cold = reinterpret_cast<char*>(a.blob + uint64_t(coldIdx) * a.pageBytes + pool.blobOffset + off);
        if (a.encode)
        {
            copyPiece(cold, hot, len);
        }
        else
        {
            copyPiece(hot, cold, len);
        }
    }
}

} // namespace

cudaError_t preloadGather() noexcept
{
    return preloadKernels(gatherKernel);
}

cudaError_t launchGather(GatherArgs const& args, int numSms, cudaStream_t stream) noexcept
{
    uint64_t const total = args.numPairs * args.chunksPerPage;
    if (total == 0)
    {
        return cudaSuccess;
    }
    gatherKernel<<<gridBlocks(total, numSms, 32), kThreads, 0, stream>>>(args);
    return cudaGetLastError();
}

} // namespace kvcodec::concat

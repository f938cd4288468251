// SPDX-License-Identifier: Apache-2.0
//
// nvfp4: the CUDA kernel. One launch covers every (page, work item) of a call; a thread block
// takes one work item at a time (grid-stride): a quantized buffer's group under one fp32 scale
// (a head of the page, or the page) or an 8 KiB chunk of a lossless buffer. Consecutive threads
// take consecutive 16-element blocks (32 contiguous hot bytes each, 8 contiguous code bytes), so a
// warp reads and writes contiguous spans. Encoding a group takes two passes over its hot bytes:
// the group's largest magnitude (a block-wide max), then the codes (the second pass mostly hits
// L1/L2). The arithmetic is format.h's, shared with the CPU reference: the blobs are identical.
#include "codec.h"

#include <algorithm>

#include "format.h"

namespace nvfp4_codec {
namespace {

constexpr int kThreads = 128;

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

__device__ void encodeGroup(BufferPlan const& b, uint64_t g, uint8_t const* hot, uint8_t* blob, uint32_t* shared)
{
    bool const bf16 = b.bf16 != 0;
    uint32_t u[kBlockElems];
    uint32_t local = 0;
    for (uint64_t k = threadIdx.x; k < b.blocksPerGroup; k += blockDim.x)
    {
        uint64_t row;
        uint32_t j;
        blockPosition(b, g, k, row, j);
        uint32_t const n = min(kBlockElems, b.headDim - kBlockElems * j);
        loadBlock(hot + 2 * (row * b.headDim + kBlockElems * j), n, bf16, u);
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
        blockPosition(b, g, k, row, j);
        uint32_t const n = min(kBlockElems, b.headDim - kBlockElems * j);
        loadBlock(hot + 2 * (row * b.headDim + kBlockElems * j), n, bf16, u);
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

__global__ void __launch_bounds__(kThreads) nvfp4Kernel(__grid_constant__ KernelArgs const a)
{
    __shared__ uint32_t shared[kThreads / 32];
    uint64_t const total = a.numPairs * a.itemsPerPage;
    for (uint64_t item = blockIdx.x; item < total; item += gridDim.x)
    {
        uint64_t const page = item / a.itemsPerPage;
        uint64_t const r = item - page * a.itemsPerPage;
        kvcodec::PageIndexPair const pair = a.pairs[page];
        int32_t const hotIdx = a.encode ? pair.src : pair.dst;
        int32_t const coldIdx = a.encode ? pair.dst : pair.src;
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
        if (b.quantized)
        {
            if (a.encode)
            {
                encodeGroup(b, sub, hot, blob, shared);
            }
            else
            {
                decodeGroup(b, sub, hot, blob);
            }
            continue;
        }
        uint64_t const begin = sub * kCopyChunkBytes;
        uint64_t const n = min(kCopyChunkBytes, b.bytes - min(begin, b.bytes));
        if (a.encode)
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
    cudaFuncAttributes attributes{};
    return cudaFuncGetAttributes(&attributes, nvfp4Kernel);
}

cudaError_t launchKernel(KernelArgs const& args, int numSms, cudaStream_t stream) noexcept
{
    uint64_t const total = args.numPairs * args.itemsPerPage;
    if (total == 0)
    {
        return cudaSuccess;
    }
    uint64_t const blocks = std::min<uint64_t>(total, uint64_t(std::max(numSms, 1)) * 16);
    nvfp4Kernel<<<unsigned(blocks), kThreads, 0, stream>>>(args);
    return cudaGetLastError();
}

} // namespace nvfp4_codec

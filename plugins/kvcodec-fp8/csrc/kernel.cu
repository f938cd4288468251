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
//
// This file holds the warp kernel (variants v1, b2, b4) and the launch of every variant; the
// tile variant is in kernel_tile.cu, the device code they share in kernel_common.cuh and
// kernel_warp.cuh.
#include "kernel.h"

#include <algorithm>

#include "kernel_warp.cuh"
#include "kvcodec/kernels.cuh"

namespace kvcodec::fp8 {
namespace {

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
void launchVariant(KernelArgs const& args, uint64_t total, int numSms, cudaStream_t stream)
{
    unsigned const blocks = gridBlocks((total + kWarpsPerBlock - 1) / kWarpsPerBlock, numSms, residentBlocks<V>());
    if (args.encode)
    {
        fp8Kernel<true, V><<<blocks, kThreads, 0, stream>>>(args);
    }
    else
    {
        fp8Kernel<false, V><<<blocks, kThreads, 0, stream>>>(args);
    }
}

static_assert(kNumKernelVariants == 4, "preloadFp8 and launchFp8 list every variant");

} // namespace

cudaError_t preloadFp8() noexcept
{
    cudaError_t const st = preloadKernels(fp8Kernel<true, 0>, fp8Kernel<false, 0>, fp8Kernel<true, 1>,
        fp8Kernel<false, 1>, fp8Kernel<true, 2>, fp8Kernel<false, 2>);
    return st != cudaSuccess ? st : preloadTileKernel();
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
    case kTileVariant: launchTileKernel(args, total, numSms, stream); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

} // namespace kvcodec::fp8

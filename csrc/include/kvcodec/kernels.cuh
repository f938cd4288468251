// SPDX-License-Identifier: Apache-2.0
//
// Launch helpers for a codec's CUDA kernels (include from .cu files only): loading kernels ahead
// of the first call, sizing a grid-stride grid, and finding a chunk's pool. Header-only; nothing here crosses the plugin
// ABI.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

namespace kvcodec {

/// Loads the modules of `kernels` now (cudaFuncGetAttributes on each), so that the first encode or
/// decode does not pay for it inside a caller's timed or captured region. Returns the first error.
template <class... Kernels>
cudaError_t preloadKernels(Kernels... kernels) noexcept
{
    cudaFuncAttributes attributes{};
    cudaError_t status = cudaSuccess;
    ((status = status == cudaSuccess ? cudaFuncGetAttributes(&attributes, kernels) : status), ...);
    return status;
}

/// Thread blocks of a grid-stride launch over `work` items: one per item, at most `blocksPerSm`
/// per multiprocessor of a device with `numSms` of them (0 counts as 1), at least 1.
inline unsigned gridBlocks(uint64_t work, int numSms, uint64_t blocksPerSm) noexcept
{
    uint64_t const limit = uint64_t(std::max(numSms, 1)) * std::max<uint64_t>(blocksPerSm, 1);
    return unsigned(std::max<uint64_t>(std::min(work, limit), 1));
}

/// The pool that chunk `chunk` of a page lies in, for a pool table in page order whose entries
/// have a `firstChunk` member (ascending, the first 0: ChunkedPool, see chunkedPools() in
/// codec_base.h). A linear search: pages span few pools.
template <class Pool>
__device__ __forceinline__ uint32_t poolOfChunk(Pool const* pools, uint32_t numPools, uint64_t chunk)
{
    uint32_t p = 0;
    while (p + 1 < numPools && chunk >= pools[p + 1].firstChunk)
    {
        ++p;
    }
    return p;
}

} // namespace kvcodec

// SPDX-License-Identifier: Apache-2.0
//
// Launch helpers for a codec's CUDA kernels (include from .cu files only): loading kernels ahead
// of the first call, sizing a grid-stride grid, finding a chunk's pool, and asynchronous copies
// into shared memory. Header-only; nothing here crosses the plugin
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

/// 16 bytes global -> shared memory without passing through registers (sm_80 and later; a plain
/// copy before), so a thread keeps many loads in flight. `src` and `dst` 16-byte aligned; the copy
/// lands after copyAsyncCommit() and a wait below.
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

/// Closes a group of this thread's copyAsync16() calls (copyAsyncWaitPrior() counts groups).
__device__ __forceinline__ void copyAsyncCommit()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/// Waits for every copyAsync16() of this thread (committed or not).
__device__ __forceinline__ void copyAsyncWaitAll()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

/// Waits until at most `Pending` of this thread's committed groups, the latest, are in flight.
template <int Pending>
__device__ __forceinline__ void copyAsyncWaitPrior()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
#endif
}

} // namespace kvcodec

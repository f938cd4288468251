// SPDX-License-Identifier: Apache-2.0
//
// CUDA driver entry points fetched at run time through the runtime's
// cudaGetDriverEntryPointByVersion, so nothing links libcuda and the package imports on
// machines without a driver.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <string>

namespace kvcodec::runtime {

struct DriverApi
{
    /// cuMemcpyBatchAsync with the CUDA 13.0 signature (no failIdx), or null.
    PFN_cuMemcpyBatchAsync_v13000 memcpyBatchAsyncV13 = nullptr;
    /// cuMemcpyBatchAsync with the CUDA 12.8 signature (with failIdx), or null.
    PFN_cuMemcpyBatchAsync_v12080 memcpyBatchAsyncV12 = nullptr;
    PFN_cuMemcpyAsync_v4000 memcpyAsync = nullptr;
    PFN_cuPointerGetAttribute_v4000 pointerGetAttribute = nullptr;
    PFN_cuGetErrorString_v6000 getErrorString = nullptr;
    /// cuStreamWaitValue32 (stream memory operations; used by the test-only StreamBlocker).
    PFN_cuStreamWaitValue32_v11070 streamWaitValue32 = nullptr;
    int driverVersion = 0; ///< cudaDriverGetVersion, 0 when no driver is present.

    [[nodiscard]] bool hasMemcpyBatch() const noexcept
    {
        return memcpyBatchAsyncV13 != nullptr || memcpyBatchAsyncV12 != nullptr;
    }
};

/// Entry points of the installed driver, resolved once (thread-safe). Members are null where the
/// driver lacks them or no driver is installed.
DriverApi const& driverApi() noexcept;

/// "CUDA_ERROR_X: description" for a driver result.
std::string driverErrorText(CUresult result);

} // namespace kvcodec::runtime

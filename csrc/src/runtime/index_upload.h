// SPDX-License-Identifier: Apache-2.0
//
// Pre-12.8 fallback of the device index upload: the pageable host array travels in kernel
// parameters, which CUDA consumes during the launch, so the caller may reuse the host array as
// soon as the launches return (the same guarantee as cuMemcpyBatchAsync with
// CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL).
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace kvcodec::runtime {

/// Launches ceil(bytes / segment) small kernels on `stream`, each carrying one segment of
/// `hostSrc` by value and writing it to `dst`. `bytes` must be a multiple of 8.
cudaError_t uploadThroughKernelParams(void* dst, void const* hostSrc, size_t bytes, cudaStream_t stream) noexcept;

} // namespace kvcodec::runtime

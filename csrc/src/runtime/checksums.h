// SPDX-License-Identifier: Apache-2.0
//
// CRC-32C of many equally spaced blobs on the device (the shared host level's check of blobs
// staged into device memory before a decode reads them).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace kvcodec::runtime {

/// Enqueues on `stream` one block per blob: crcs[i] = CRC-32C of the lengths[i] bytes at
/// base + i * stride. `base`, `lengths` and `crcs` must be device-accessible. Returns the launch
/// status.
cudaError_t launchStridedCrcs(void const* base, uint64_t stride, uint32_t const* lengths, size_t count, uint32_t* crcs,
    cudaStream_t stream) noexcept;

} // namespace kvcodec::runtime

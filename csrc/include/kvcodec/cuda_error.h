// SPDX-License-Identifier: Apache-2.0
//
// The one text for a CUDA runtime status, used by the SDK and its codecs alike.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

namespace kvcodec {

/// "cudaErrorName: description" for a CUDA runtime status.
inline std::string cudaErrorText(cudaError_t status)
{
    return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

} // namespace kvcodec

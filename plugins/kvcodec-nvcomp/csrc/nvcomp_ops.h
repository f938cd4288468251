// SPDX-License-Identifier: Apache-2.0
//
// One interface over nvCOMP's batched C API of each algorithm (the functions have the same
// shape; only the option structs and names differ).
#pragma once

#include <memory>

#include <nvcomp.h>
#include <nvcomp/ans.h>
#include <nvcomp/gdeflate.h>
#include <nvcomp/lz4.h>
#include <nvcomp/zstd.h>

#include "format.h"

namespace kvcodec::nvcomp_plugin {

class NvcompOps
{
public:
    virtual ~NvcompOps() = default;
    virtual nvcompStatus_t maxCompressedChunk(size_t chunk, size_t* out) const = 0;
    virtual nvcompStatus_t compressAlignment(nvcompAlignmentRequirements_t* out) const = 0;
    virtual nvcompStatus_t decompressAlignment(nvcompAlignmentRequirements_t* out) const = 0;
    virtual nvcompStatus_t compressTemp(size_t n, size_t chunk, size_t total, size_t* temp, cudaStream_t s) const = 0;
    virtual nvcompStatus_t decompressTemp(size_t n, size_t chunk, size_t total, size_t* temp, cudaStream_t s) const = 0;
    virtual nvcompStatus_t compress(void const* const* in, size_t const* inBytes, size_t maxChunk, size_t n, void* temp,
        size_t tempBytes, void* const* out, size_t* outBytes, nvcompStatus_t* statuses, cudaStream_t s) const = 0;
    virtual nvcompStatus_t decompress(void const* const* in, size_t const* inBytes, size_t const* capacity,
        size_t* actual, size_t n, void* temp, size_t tempBytes, void* const* out, nvcompStatus_t* statuses,
        cudaStream_t s) const = 0;
};

/// nvCOMP's batched API for `algorithm` with element width `elementBytes` (1, 2 or 4).
std::unique_ptr<NvcompOps> makeNvcompOps(Algorithm algorithm, uint32_t elementBytes);

} // namespace kvcodec::nvcomp_plugin

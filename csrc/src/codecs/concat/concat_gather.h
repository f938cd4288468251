// SPDX-License-Identifier: Apache-2.0
//
// The SM copy path of the concat codec: one kernel gathers (encode) or scatters (decode) every
// (page, hot pool) piece of a call. Used where pieces are too small for the copy engines to
// reach the link's bandwidth.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kvcodec/codec_base.h"

namespace kvcodec::concat {

/// One hot pool as the kernel sees it (blob offset, first chunk of the page's chunk sequence).
using GatherPool = ChunkedPool;

struct GatherArgs
{
    GatherPool const* pools; ///< Device array of numPools entries.
    uint32_t numPools;
    uint32_t encode;     ///< 1: hot -> blob, 0: blob -> hot.
    uint64_t chunkBytes; ///< Work unit of one thread block.
    uint64_t chunksPerPage;
    uint64_t pageBytes;         ///< Cold-page bytes (sum of slotBytes).
    uint64_t numHotSlots;       ///< Hot indices outside [0, numHotSlots) are skipped.
    PageIndexPair const* pairs; ///< Device array.
    uint64_t numPairs;
    uint64_t blob; ///< Cold base pointer (GPU-accessible).
};

/// Loads the gather kernel now. With lazy module loading (the CUDA default) the first launch
/// loads the module, which can wait for work already queued on the device; a codec call must
/// never wait, so the CUDA codec loads its kernel at configure time.
cudaError_t preloadGather() noexcept;

/// Enqueues the gather kernel on `stream`; returns the launch status.
cudaError_t launchGather(GatherArgs const& args, int numSms, cudaStream_t stream) noexcept;

} // namespace kvcodec::concat

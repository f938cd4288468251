// SPDX-License-Identifier: Apache-2.0
//
// Workspace sizing of the CUDA implementation, kept on the host side so that it can be checked
// without a device (kvcodec_nvcomp._ext.workspace_plan). Every staging area is sized from the
// layout's real chunks, never from chunk_bytes alone, and a batch holds at most
// kMaxBatchChunks chunks and at most the nvCOMP temp budget below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codec.h"
#include "kernels.h" // kDummyRawBytes, kStagingAlign
#include "nvcomp_ops.h"

namespace kvcodec::nvcomp_plugin {

/// nvCOMP temp memory a batch may always use: tiny chunks (whose temp cost is per chunk, not per
/// byte) get fewer pages per batch rather than gigabytes of temp memory.
inline constexpr uint64_t kTempBudgetFloor = 256ull << 20;

struct WorkspacePlan
{
    uint64_t maxChunkBytes = 0;       ///< Largest real chunk of the layout: nvCOMP's max chunk size.
    uint64_t decodeMaxChunkBytes = 0; ///< The same, at least kDummyRawBytes (dummy chunks).
    uint64_t maxChunks = 0;           ///< Chunks of the largest batch over all groups.
    uint64_t maxPages = 0;            ///< Pages of the largest batch over all groups.
    uint64_t chunkStride = 0;         ///< Bytes between staged raw chunks (input and output staging).
    uint64_t compStride = 0;          ///< Bytes between compressed chunks.
    uint64_t maxCompressedChunk = 0;  ///< nvCOMP's bound for a chunk of maxChunkBytes.
    uint64_t blobBytes = 0;           ///< Blob staging of a decode lane.
    uint64_t compressTotalBytes = 0;  ///< Raw bytes of the largest batch (nvCOMP's total bound).
    uint64_t compressTempBytes = 0;
    uint64_t decompressTempBytes = 0;
    uint64_t tempBudget = 0;
    bool encodeStaging = false;     ///< Some group compresses from staging, not the hot slots.
    bool decodeStaging = false;     ///< Some group decompresses into staging.
    std::vector<bool> encodeDirect; ///< Per group.
    std::vector<bool> decodeDirect; ///< Per group.
    uint64_t encodeLaneBytes = 0;   ///< Device bytes of one encode lane.
    uint64_t decodeLaneBytes = 0;   ///< Device bytes of one decode lane.
};

/// Sizes the CUDA workspaces for `plans` (built by NvcompCodec::plan) and lowers their
/// maxPagesPerBatch until nvCOMP's temp memory fits the budget: max(kTempBudgetFloor, the temp
/// of a max_batch_bytes batch of full chunk_bytes chunks). Throws std::runtime_error when an
/// nvCOMP query fails.
WorkspacePlan planWorkspace(
    Params const& options, HotLayout const& layout, std::vector<GroupPlan>& plans, NvcompOps const& ops);

} // namespace kvcodec::nvcomp_plugin

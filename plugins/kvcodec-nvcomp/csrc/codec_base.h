// SPDX-License-Identifier: Apache-2.0
//
// What the CPU reference and the CUDA implementation of the nvCOMP codecs share: parameters,
// the validated hot layout, the chunk plan of each hot pool group and the cold page size.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "format.h"
#include "kvcodec/codec.h"
#include "kvcodec/layout.h"
#include "kvcodec/params.h"

namespace kvcodec::nvcomp_plugin {

struct AlgorithmInfo
{
    Algorithm id;
    char const* name;           ///< Registry name, e.g. "nvcomp-lz4".
    bool hasCpu;                ///< A CPU implementation of the same chunk format exists.
    uint64_t maxChunkBytes;     ///< Largest chunk_bytes both implementations accept.
};

/// The algorithms this plugin implements (those with a registry name are offered).
AlgorithmInfo const& algorithmInfo(Algorithm id);

/// Most chunks one batch (one nvCOMP call) holds; larger calls run in several batches.
inline constexpr uint64_t kMaxBatchChunks = 65536;

struct CodecOptions
{
    Algorithm algorithm = Algorithm::kLz4;
    uint64_t chunkBytes = 65536;
    uint32_t elementBytes = 1; ///< data_type: 1 (uint8), 2 (uint16), 4 (uint32).
    bool bitshuffle = false;
    double slotRatio = 0; ///< 0: the worst-case bound.
    uint64_t maxBatchBytes = 64ull << 20; ///< Per lane (two lanes per direction).
};

/// Parses and checks the factory's JSON parameters. Returns false with `error` set.
bool parseOptions(char const* json, Algorithm algorithm, CodecOptions& out, std::string& error);

/// One chunk of a page: bytes [offset, offset + bytes) of the slot of pool `pool`.
struct ChunkPlan
{
    uint32_t pool;
    uint32_t bytes;
    uint64_t offset;
};

struct GroupPlan
{
    std::vector<ChunkPlan> chunks;
    uint32_t headerBytes = 0;
    uint64_t boundBytes = 0; ///< Worst-case blob: header + padded raw chunks.
    uint64_t coldBytes = 0;
    uint64_t maxPagesPerBatch = 0;
};

class NvcompCodecBase : public IKvCacheColdPageCodec
{
public:
    explicit NvcompCodecBase(CodecOptions options) : options_(options) {}

    bool configure(PoolGroupDesc const* gpuDescs, PoolGroupIndex numGpuDescs) noexcept override;
    size_t queryColdPageBytes(LayerGroupId id) const noexcept override;
    LayerGroupId getBatchingLayerGroupId(LayerGroupId id) const noexcept override;
    PageIndexLocation queryPageIndexLocation(LayerGroupId id) const noexcept override;
    bool encode(LayerGroupId id, void* dstBasePtr, PageIndexPair const* pageIndices, size_t numBasePages,
        cudaStream_t stream) noexcept override;
    bool decode(LayerGroupId id, void const* srcBasePtr, PageIndexPair const* pageIndices, size_t numBasePages,
        cudaStream_t stream) noexcept override;

    /// Both implementations check every blob where they read it and report each page's outcome.
    bool hasCheckedDecode() const noexcept override
    {
        return true;
    }

    bool decodeChecked(LayerGroupId id, void const* srcBasePtr, PageIndexPair const* pageIndices, size_t numBasePages,
        uint8_t* pageStatus, cudaStream_t stream) noexcept override;

    char const* lastError() const noexcept override
    {
        return error_.c_str();
    }

protected:
    virtual bool configureBackend() = 0;
    virtual PageIndexLocation location() const noexcept = 0;
    /// Runs one non-empty call. `pageStatus` is null for encode and plain decode; for a checked
    /// decode it receives one PageStatus per page (a bad blob is then a status, not a failure).
    virtual bool submit(PoolGroupIndex group, uintptr_t blob, PageIndexPair const* pairs, size_t n,
        cudaStream_t stream, bool encode, uint8_t* pageStatus)
        = 0;

    bool fail(std::string message) const noexcept;

    CodecOptions options_;
    HotLayout layout_;
    std::vector<GroupPlan> plans_;
    bool configured_ = false;
    bool configureCalled_ = false;
    mutable std::string error_;
};

} // namespace kvcodec::nvcomp_plugin

// SPDX-License-Identifier: Apache-2.0
//
// What the CPU reference (codec_cpu.h) and the CUDA implementation (codec_cuda.h) of the nvCOMP
// codecs share: the parameters, the chunk plan of each hot pool group, the cold page size and
// the factories. kvcodec::CodecBase (kvcodec/codec_base.h) does everything around them:
// configure-once, layout validation, errors, guarded queries, argument and host-index checks,
// the CUDA device and stream rules. The blob format is described in format.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format.h"
#include "kvcodec/codec_base.h"
#include "kvcodec/plugin.h"

namespace kvcodec::nvcomp_plugin {

struct AlgorithmInfo
{
    Algorithm id;
    char const* name;       ///< Registry name, e.g. "nvcomp-lz4".
    bool hasCpu;            ///< A CPU implementation of the same chunk format exists.
    uint64_t maxChunkBytes; ///< Largest chunk_bytes both implementations accept.
};

/// The algorithms this plugin implements (those with a registry name are offered).
AlgorithmInfo const& algorithmInfo(Algorithm id);

/// Most chunks one batch (one nvCOMP call) holds; larger calls run in several batches.
inline constexpr uint64_t kMaxBatchChunks = 65536;

/// The codec parameters. Types, defaults, ranges and choices are validated by the Python spec
/// (plugin.py): one schema; read() refuses only what the C++ types or the format cannot hold.
struct Params
{
    Algorithm algorithm = Algorithm::kLz4; ///< Set by the algorithm's Traits, not a parameter.
    uint64_t chunkBytes = 65536;
    uint32_t elementBytes = 1; ///< data_type: 1 (uint8), 2 (uint16), 4 (uint32).
    bool bitshuffle = false;
    double slotRatio = 0;                 ///< 0: the worst-case bound.
    uint64_t maxBatchBytes = 64ull << 20; ///< Per lane (two lanes per direction).

    void read(ParamReader& r);
};

/// Reads the JSON parameters of `algorithm`'s codec (unknown keys refused); throws ParamError.
Params readParams(Algorithm algorithm, char const* json);

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

/// The shared part of both implementations: plan() cuts every hot pool group into chunks and
/// sizes its cold page, then lets the implementation plan its own state (planBackend()).
class NvcompCodec : public CodecBase
{
public:
    NvcompCodec(Params const& params, int32_t device)
        : CodecBase(device)
        , options_(params)
    {
    }

    /// Both implementations check every blob where they read it and report each page's outcome.
    bool hasCheckedDecode() const noexcept override
    {
        return true;
    }

protected:
    bool plan(HotLayout const& layout) final;
    uint64_t coldPageBytes(HotLayout::LifeCycle const& lc) const final
    {
        return plans_[lc.group].coldBytes;
    }

    /// The implementation's planning, after plans_ is built (with the CUDA device current).
    virtual bool planBackend() = 0;

    Params options_;
    std::vector<GroupPlan> plans_;
};

/// The factory of one algorithm (a static object).
KvcodecCodecFactory const* codecFactory(Algorithm algorithm) noexcept;

} // namespace kvcodec::nvcomp_plugin

// SPDX-License-Identifier: Apache-2.0
//
// The nvCOMP codecs' parameters, the chunk plan shared by both implementations and one factory
// per algorithm (kvcodec::makeCodecFactory over the algorithm's Traits).
#include "codec.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "codec_cpu.h"
#include "codec_cuda.h"

namespace kvcodec::nvcomp_plugin {

AlgorithmInfo const& algorithmInfo(Algorithm id)
{
    // gdeflate's CPU compressor takes chunks of at most 64 KiB; LZ4's GPU compressor 16 MiB.
    static AlgorithmInfo const kInfo[] = {
        {Algorithm::kLz4, "nvcomp-lz4", true, 1ull << 24},
        {Algorithm::kGdeflate, "nvcomp-gdeflate", true, 1ull << 16},
        {Algorithm::kAns, "nvcomp-ans", false, 1ull << 24},
        {Algorithm::kZstd, "nvcomp-zstd", false, 1ull << 24},
    };
    for (auto const& info : kInfo)
    {
        if (info.id == id)
        {
            return info;
        }
    }
    return kInfo[0];
}

void Params::read(ParamReader& r)
{
    uint64_t const maxChunk = algorithmInfo(algorithm).maxChunkBytes;
    r.read("chunk_bytes", chunkBytes);
    if (chunkBytes < 256 || chunkBytes > maxChunk)
    {
        r.refuse("chunk_bytes", "it must be an integer in [256, " + std::to_string(maxChunk) + "]");
    }
    if (chunkBytes % 16 != 0)
    {
        r.refuse("chunk_bytes", "it must be a multiple of 16");
    }
    r.choice("data_type", elementBytes, {{"uint8", 1u}, {"uint16", 2u}, {"uint32", 4u}});
    r.read("bitshuffle", bitshuffle);
    r.read("slot_ratio", slotRatio);
    if (!(slotRatio >= 0) || slotRatio > 4)
    {
        r.refuse("slot_ratio", "it must be 0 (the worst-case bound) or a number in (0, 4]");
    }
    r.read("max_batch_bytes", maxBatchBytes);
    if (maxBatchBytes < 1 || maxBatchBytes > (1ull << 40))
    {
        r.refuse("max_batch_bytes", "it must be an integer in [1, " + std::to_string(1ull << 40) + "]");
    }
}

Params readParams(Algorithm algorithm, char const* json)
{
    ParamReader reader(algorithmInfo(algorithm).name, json);
    Params params;
    params.algorithm = algorithm;
    params.read(reader);
    reader.finish();
    return params;
}

bool NvcompCodec::plan(HotLayout const& layout)
{
    plans_.clear();
    for (size_t g = 0; g < layout.groups().size(); ++g)
    {
        auto const& group = layout.groups()[g];
        GroupPlan gp;
        std::string const where = "hot pool group " + std::to_string(g);
        for (size_t p = 0; p < group.pools.size(); ++p)
        {
            uint64_t const slot = group.pools[p].slotBytes;
            if (options_.elementBytes > 1 && slot % options_.elementBytes != 0)
            {
                return fail(where + " pool " + std::to_string(p) + " has slotBytes " + std::to_string(slot)
                    + ", not a multiple of data_type's " + std::to_string(options_.elementBytes)
                    + "-byte element; use data_type='uint8' for this layout");
            }
            for (uint64_t off = 0; off < slot; off += options_.chunkBytes)
            {
                gp.chunks.push_back({uint32_t(p), uint32_t(std::min(options_.chunkBytes, slot - off)), off});
            }
        }
        if (gp.chunks.size() > (1u << 24))
        {
            return fail(where + " cuts into " + std::to_string(gp.chunks.size())
                + " chunks per page; at most 2^24 are supported: raise chunk_bytes");
        }
        gp.headerBytes = headerBytesFor(uint32_t(gp.chunks.size()));
        gp.boundBytes = gp.headerBytes;
        for (auto const& c : gp.chunks)
        {
            gp.boundBytes += roundUp(c.bytes, kPayloadAlign);
        }
        if (options_.slotRatio == 0)
        {
            gp.coldBytes = gp.boundBytes;
        }
        else
        {
            gp.coldBytes = roundUp(uint64_t(std::ceil(double(group.pageBytes) * options_.slotRatio)), kPayloadAlign);
            if (gp.coldBytes < gp.headerBytes)
            {
                return fail("slot_ratio " + std::to_string(options_.slotRatio) + " gives " + where + " "
                    + std::to_string(gp.coldBytes) + "-byte cold pages, smaller than its "
                    + std::to_string(gp.headerBytes) + "-byte header: the smallest usable slot_ratio is "
                    + std::to_string(double(gp.headerBytes) / double(group.pageBytes)));
            }
        }
        if (gp.coldBytes > (1ull << 32) - 1)
        {
            return fail(where + " has " + std::to_string(gp.coldBytes)
                + "-byte cold pages; the envelope holds at most 2^32 - 1 bytes");
        }
        // Bytes alone would let a layout of tiny pages put 100k pages into one batch: cap
        // the chunks too (a batch keeps at least one page).
        gp.maxPagesPerBatch = std::max<uint64_t>(1,
            std::min<uint64_t>(
                {group.numSlots, options_.maxBatchBytes / group.pageBytes, kMaxBatchChunks / gp.chunks.size()}));
        plans_.push_back(std::move(gp));
    }
    return planBackend();
}

namespace {

// One Traits per algorithm: the registry name, the format version, the parameters with the
// algorithm set, and the two implementations (the CPU one refuses an algorithm it lacks).
template <Algorithm A, char const* Name>
struct NvcompTraits
{
    static constexpr char const* kName = Name;
    static constexpr uint32_t kFormatVersion = nvcomp_plugin::kFormatVersion;
    struct Params : nvcomp_plugin::Params
    {
        Params()
        {
            algorithm = A;
        }
    };
    using Cpu = NvcompCodecCpu;
    using Cuda = NvcompCodecCuda;
};

constexpr char kLz4Name[] = "nvcomp-lz4";
constexpr char kGdeflateName[] = "nvcomp-gdeflate";
constexpr char kAnsName[] = "nvcomp-ans";
constexpr char kZstdName[] = "nvcomp-zstd";

using Lz4Traits = NvcompTraits<Algorithm::kLz4, kLz4Name>;
using GdeflateTraits = NvcompTraits<Algorithm::kGdeflate, kGdeflateName>;
using AnsTraits = NvcompTraits<Algorithm::kAns, kAnsName>;
using ZstdTraits = NvcompTraits<Algorithm::kZstd, kZstdName>;

KvcodecCodecFactory const kLz4Factory = makeCodecFactory<Lz4Traits>();
KvcodecCodecFactory const kGdeflateFactory = makeCodecFactory<GdeflateTraits>();
KvcodecCodecFactory const kAnsFactory = makeCodecFactory<AnsTraits>();
KvcodecCodecFactory const kZstdFactory = makeCodecFactory<ZstdTraits>();

} // namespace

KvcodecCodecFactory const* codecFactory(Algorithm algorithm) noexcept
{
    switch (algorithm)
    {
    case Algorithm::kLz4: return &kLz4Factory;
    case Algorithm::kGdeflate: return &kGdeflateFactory;
    case Algorithm::kAns: return &kAnsFactory;
    case Algorithm::kZstd: return &kZstdFactory;
    }
    return nullptr;
}

} // namespace kvcodec::nvcomp_plugin

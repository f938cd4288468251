// SPDX-License-Identifier: Apache-2.0
#include "codec_base.h"

#include <algorithm>
#include <limits>

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

bool parseOptions(char const* json, Algorithm algorithm, CodecOptions& out, std::string& error)
{
    CodecParams params;
    if (!params.parse(json, error))
    {
        return false;
    }
    out.algorithm = algorithm;
    std::string const codec = algorithmInfo(algorithm).name;
    uint64_t const maxChunk = algorithmInfo(algorithm).maxChunkBytes;
    auto integer = [&](std::string const& key, CodecParams::Value const& v, double lo, double hi, uint64_t& dst) {
        auto n = params.getNumber(key);
        if (!n || *n < lo || *n > hi || *n != std::floor(*n))
        {
            error = codec + " parameter '" + key + "' is " + v.text + "; it must be an integer in ["
                + std::to_string(uint64_t(lo)) + ", " + std::to_string(uint64_t(hi)) + "]";
            return false;
        }
        dst = uint64_t(*n);
        return true;
    };
    for (auto const& [key, value] : params.values())
    {
        if (key == "chunk_bytes")
        {
            if (!integer(key, value, 256, double(maxChunk), out.chunkBytes)) return false;
            if (out.chunkBytes % 16 != 0)
            {
                error = codec + " parameter 'chunk_bytes' is " + value.text + "; it must be a multiple of 16";
                return false;
            }
        }
        else if (key == "data_type")
        {
            auto s = params.getString(key);
            if (s == std::string("uint8")) out.elementBytes = 1;
            else if (s == std::string("uint16")) out.elementBytes = 2;
            else if (s == std::string("uint32")) out.elementBytes = 4;
            else
            {
                error = codec + " parameter 'data_type' is " + value.text + "; valid values are 'uint8', 'uint16', 'uint32'";
                return false;
            }
        }
        else if (key == "bitshuffle")
        {
            auto b = params.getBool(key);
            if (!b)
            {
                error = codec + " parameter 'bitshuffle' is " + value.text + "; it must be true or false";
                return false;
            }
            out.bitshuffle = *b;
        }
        else if (key == "slot_ratio")
        {
            auto r = params.getNumber(key);
            if (!r || !(*r >= 0) || *r > 4)
            {
                error = codec + " parameter 'slot_ratio' is " + value.text
                    + "; it must be 0 (the worst-case bound) or a number in (0, 4]";
                return false;
            }
            out.slotRatio = *r;
        }
        else if (key == "max_batch_bytes")
        {
            if (!integer(key, value, 1, double(1ull << 40), out.maxBatchBytes)) return false;
        }
        else
        {
            error = "unknown " + codec + " parameter '" + key
                + "'; valid parameters are 'chunk_bytes', 'data_type', 'bitshuffle', 'slot_ratio', 'max_batch_bytes'";
            return false;
        }
    }
    return true;
}

bool NvcompCodecBase::fail(std::string message) const noexcept
{
    try
    {
        error_ = std::move(message);
    }
    catch (...)
    {
    }
    return false;
}

bool NvcompCodecBase::configure(PoolGroupDesc const* gpuDescs, PoolGroupIndex numGpuDescs) noexcept
{
    try
    {
        if (configureCalled_)
        {
            return fail("configure() was already called; a codec is configured exactly once");
        }
        configureCalled_ = true; // Final even when the layout is rejected.
        std::string err = layout_.load(gpuDescs, numGpuDescs);
        if (!err.empty())
        {
            return fail(err);
        }
        plans_.clear();
        for (size_t g = 0; g < layout_.groups().size(); ++g)
        {
            auto const& group = layout_.groups()[g];
            GroupPlan plan;
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
                    plan.chunks.push_back({uint32_t(p), uint32_t(std::min(options_.chunkBytes, slot - off)), off});
                }
            }
            if (plan.chunks.size() > (1u << 24))
            {
                return fail(where + " cuts into " + std::to_string(plan.chunks.size())
                    + " chunks per page; at most 2^24 are supported: raise chunk_bytes");
            }
            plan.headerBytes = headerBytesFor(uint32_t(plan.chunks.size()));
            plan.boundBytes = plan.headerBytes;
            for (auto const& c : plan.chunks)
            {
                plan.boundBytes += roundUp(c.bytes, kPayloadAlign);
            }
            if (options_.slotRatio == 0)
            {
                plan.coldBytes = plan.boundBytes;
            }
            else
            {
                plan.coldBytes = roundUp(uint64_t(std::ceil(double(group.pageBytes) * options_.slotRatio)), kPayloadAlign);
                if (plan.coldBytes < plan.headerBytes)
                {
                    return fail("slot_ratio " + std::to_string(options_.slotRatio) + " gives " + where + " "
                        + std::to_string(plan.coldBytes) + "-byte cold pages, smaller than its "
                        + std::to_string(plan.headerBytes) + "-byte header: the smallest usable slot_ratio is "
                        + std::to_string(double(plan.headerBytes) / double(group.pageBytes)));
                }
            }
            if (plan.coldBytes > (1ull << 32) - 1)
            {
                return fail(where + " has " + std::to_string(plan.coldBytes)
                    + "-byte cold pages; the envelope holds at most 2^32 - 1 bytes");
            }
            // Bytes alone would let a layout of tiny pages put 100k pages into one batch: cap
            // the chunks too (a batch keeps at least one page).
            plan.maxPagesPerBatch = std::max<uint64_t>(1,
                std::min<uint64_t>({group.numSlots, options_.maxBatchBytes / group.pageBytes,
                    kMaxBatchChunks / plan.chunks.size()}));
            plans_.push_back(std::move(plan));
        }
        if (!configureBackend())
        {
            return false;
        }
        configured_ = true;
        error_.clear();
        return true;
    }
    catch (std::exception const& e)
    {
        return fail(std::string("configure() failed: ") + e.what());
    }
}

size_t NvcompCodecBase::queryColdPageBytes(LayerGroupId id) const noexcept
{
    auto const* lc = configured_ ? layout_.find(id) : nullptr;
    return lc ? plans_[lc->group].coldBytes : 0;
}

LayerGroupId NvcompCodecBase::getBatchingLayerGroupId(LayerGroupId id) const noexcept
{
    // Every lifecycle of a hot pool group has the same layout and parameters.
    auto const* lc = configured_ ? layout_.find(id) : nullptr;
    return lc ? layout_.smallestLifeCycle(lc->group) : -1;
}

PageIndexLocation NvcompCodecBase::queryPageIndexLocation(LayerGroupId id) const noexcept
{
    auto const* lc = configured_ ? layout_.find(id) : nullptr;
    return lc ? location() : PageIndexLocation::kBadLocation;
}

bool NvcompCodecBase::encode(LayerGroupId id, void* dstBasePtr, PageIndexPair const* pageIndices, size_t n,
    cudaStream_t stream) noexcept
{
    try
    {
        std::string error;
        auto const* lc = layout_.checkCall("encode", configured_, id, dstBasePtr, pageIndices, n, error);
        if (lc == nullptr) return error.empty() ? true : fail(error); // no pages: nothing to do
        return submit(lc->group, reinterpret_cast<uintptr_t>(dstBasePtr), pageIndices, n, stream, true, nullptr);
    }
    catch (std::exception const& e)
    {
        return fail(std::string("encode() failed: ") + e.what());
    }
}

bool NvcompCodecBase::decode(LayerGroupId id, void const* srcBasePtr, PageIndexPair const* pageIndices, size_t n,
    cudaStream_t stream) noexcept
{
    try
    {
        std::string error;
        auto const* lc = layout_.checkCall("decode", configured_, id, srcBasePtr, pageIndices, n, error);
        if (lc == nullptr) return error.empty() ? true : fail(error); // no pages: nothing to do
        return submit(lc->group, reinterpret_cast<uintptr_t>(srcBasePtr), pageIndices, n, stream, false, nullptr);
    }
    catch (std::exception const& e)
    {
        return fail(std::string("decode() failed: ") + e.what());
    }
}

bool NvcompCodecBase::decodeChecked(LayerGroupId id, void const* srcBasePtr, PageIndexPair const* pageIndices, size_t n,
    uint8_t* pageStatus, cudaStream_t stream) noexcept
{
    try
    {
        std::string error;
        auto const* lc = layout_.checkCall("decodeChecked", configured_, id, srcBasePtr, pageIndices, n, error);
        if (lc == nullptr) return error.empty() ? true : fail(error); // no pages: nothing to do
        if (pageStatus == nullptr)
        {
            return fail("decodeChecked(): pageStatus is null with " + std::to_string(n) + " pages");
        }
        return submit(lc->group, reinterpret_cast<uintptr_t>(srcBasePtr), pageIndices, n, stream, false, pageStatus);
    }
    catch (std::exception const& e)
    {
        return fail(std::string("decodeChecked() failed: ") + e.what());
    }
}

} // namespace kvcodec::nvcomp_plugin

// {{ cookiecutter.codec_name }}: the parameters, the codec (CPU reference and CUDA) and the
// factory. The blob format is described in codec.h. kvcodec::CodecBase (kvcodec/codec_base.h) does
// everything around them: configure-once, layout validation, errors, queries, argument and host
// index checks, the CUDA device and stream rules.
#include "codec.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <kvcodec/codec_base.h>

namespace {{ cookiecutter.codec_name | replace('-', '_') }}_codec {

// Types, defaults and ranges are validated by the Python spec (plugin.py): one schema.
void Params::read(kvcodec::ParamReader& r)
{
    r.read("word_bytes", wordBytes);
{%- if cookiecutter.lossless == "no" %}
    r.read("drop_bits", dropBits);
{%- endif %}
    if (dropBits >= 8 * wordBytes)
    {
        r.refuse("drop_bits", "it must be smaller than 8 * word_bytes (" + std::to_string(8 * wordBytes) + ")");
    }
}

namespace {

using kvcodec::CodecCall;
using kvcodec::HotLayout;
using kvcodec::LayerGroupId;
using kvcodec::PageIndexLocation;

// One class for both implementations: the CPU reference (device() == KVCODEC_DEVICE_CPU: host
// pointers, synchronous, stream ignored) and the CUDA one (one kernel per call).
class Codec final : public kvcodec::DualCodec<Params>
{
public:
    // What makeCodecFactory<Codec>() needs besides Params: the registry name, the format version.
    static constexpr char const* kName = "{{ cookiecutter.codec_name }}";
    static constexpr uint32_t kFormatVersion = ::{{ cookiecutter.codec_name | replace('-', '_') }}_codec::kFormatVersion;
    using DualCodec::DualCodec;

private:
    bool plan(HotLayout const& layout) override
    {
{%- if cookiecutter.lossless == "no" %}
        for (auto const& lc : layout.lifeCycles())
        {
            // K/V buffers (K, V, or both side by side) of 16-bit floats, word-aligned: where
            // drop_bits applies.
            auto& ranges = ranges_[lc.id];
            for (auto const& b : lc.buffers)
            {
                bool const kv = b.role == kvcodec::BufferRole::kKey || b.role == kvcodec::BufferRole::kValue
                    || b.role == kvcodec::BufferRole::kKeyValue;
                bool const half = b.dtype == kvcodec::DataType::kBFloat16 || b.dtype == kvcodec::DataType::kFloat16;
                if (kv && half && b.byteOffset % 2 == 0)
                {
                    ranges.push_back({uint64_t(b.poolIndex), b.byteOffset, b.byteOffset + b.bytes});
                }
            }
            if (!isCpu() && !cudaCheck(deviceRanges_[lc.id].upload(ranges), "uploading the lossy ranges"))
            {
                return false;
            }
        }
{%- endif %}
        if (isCpu())
        {
            return true;
        }
        for (auto const& group : layout.groups()) // CUDA: the kernel's pool table of every group
        {
            auto table = kvcodec::chunkedPools(group, kChunkBytes, chunksPerPage_.emplace_back());
            if (!cudaCheck(tables_.emplace_back().upload(table), "uploading a pool table"))
            {
                return false;
            }
        }
        return cudaCheck(preloadKernel(), "loading the kernel");
    }

{%- if cookiecutter.lossless == "no" %}
    // Lifecycles of one hot pool group with identical lossy ranges encode identically.
    LayerGroupId batchingLayerGroup(HotLayout::LifeCycle const& lc) const override
    {
        return smallestAlike(
            lc, [&](LayerGroupId other) { return params_.dropBits == 0 || ranges_.at(other) == ranges_.at(lc.id); });
    }
{%- endif %}
{%- if cookiecutter.page_index_location == "host" %}

    // The kernel takes the page indices by value (the base default: device indices on a GPU).
    PageIndexLocation pageIndexLocation(HotLayout::LifeCycle const&) const override
    {
        return PageIndexLocation::kHost;
    }
{%- endif %}

    bool submitCpu(CodecCall const& call) override
    {
        uint32_t const w = params_.wordBytes;
{%- if cookiecutter.lossless == "no" %}
        uint64_t const keep = ~((1ull << params_.dropBits) - 1);
        auto const& ranges = ranges_.at(call.lifeCycle.id);
{%- endif %}
        for (size_t i = 0; i < call.numPages; ++i)
        {
            auto* page = reinterpret_cast<uint8_t*>(call.coldBase + uint64_t(call.cold(i)) * call.group.pageBytes);
            for (size_t p = 0; p < call.group.pools.size(); ++p)
            {
                auto const& pool = call.group.pools[p];
                auto* slot = reinterpret_cast<uint8_t*>(pool.base + uint64_t(call.hot(i)) * pool.slotBytes);
                uint64_t const words = pool.slotBytes / w;
                for (uint64_t k = 0; k < words; ++k)
                {
                    uint64_t word = 0;
                    if (call.encoding)
                    {
                        std::memcpy(&word, slot + k * w, w);
{%- if cookiecutter.lossless == "no" %}
                        word &= inRanges(ranges, p, k * w, k * w + w) ? keep : ~0ull;
{%- endif %}
                        for (uint32_t j = 0; j < w; ++j)
                            page[j * words + k] = uint8_t(word >> (8 * j));
                    }
                    else
                    {
                        for (uint32_t j = 0; j < w; ++j)
                            word |= uint64_t(page[j * words + k]) << (8 * j);
                        std::memcpy(slot + k * w, &word, w);
                    }
                }
                uint64_t const tail = words * w; // the slotBytes % w trailing bytes follow the planes
                call.encoding ? std::memcpy(page + tail, slot + tail, pool.slotBytes - tail)
                              : std::memcpy(slot + tail, page + tail, pool.slotBytes - tail);
                page += pool.slotBytes;
            }
        }
        return true;
    }

{%- if cookiecutter.lossless == "no" %}
    static bool inRanges(std::vector<KernelRange> const& ranges, uint64_t pool, uint64_t begin, uint64_t end)
    {
        return std::any_of(ranges.begin(), ranges.end(),
            [&](KernelRange const& r) { return r.pool == pool && begin >= r.begin && end <= r.end; });
    }
{%- endif %}

    bool submitCuda(CodecCall const& call) override
    {
        KernelArgs args{};
        args.pools = tables_[call.groupIndex].get();
        args.numPools = uint32_t(call.group.pools.size());
        args.encode = call.encoding ? 1 : 0;
        args.wordBytes = params_.wordBytes;
{%- if cookiecutter.lossless == "no" %}
        args.dropBits = params_.dropBits;
        args.ranges = deviceRanges_.at(call.lifeCycle.id).get();
        args.numRanges = uint32_t(deviceRanges_.at(call.lifeCycle.id).size());
{%- endif %}
        args.chunksPerPage = chunksPerPage_[call.groupIndex];
        args.pageBytes = call.group.pageBytes;
        args.numHotSlots = call.group.numSlots;
        args.blob = call.coldBase;
{%- if cookiecutter.page_index_location == "device" %}
        args.devicePairs = call.pages;
        args.numPairs = call.numPages;
        return cudaCheck(launchKernel(args, numSms_, call.stream), "kernel launch");
{%- else %}
        // Host indices are consumed here: each launch carries up to kPairsPerLaunch pairs by value,
        // so nothing reads the caller's array after this call returns.
        for (size_t first = 0; first < call.numPages; first += kPairsPerLaunch)
        {
            args.numPairs = std::min<size_t>(kPairsPerLaunch, call.numPages - first);
            std::memcpy(args.hostPairs, call.pages + first, args.numPairs * sizeof(kvcodec::PageIndexPair));
            if (!cudaCheck(launchKernel(args, numSms_, call.stream), "kernel launch"))
            {
                return false;
            }
        }
        return true;
{%- endif %}
    }

{%- if cookiecutter.lossless == "no" %}
    std::map<LayerGroupId, std::vector<KernelRange>> ranges_;
    std::map<LayerGroupId, kvcodec::DeviceArray<KernelRange>> deviceRanges_;
{%- endif %}
    std::vector<kvcodec::DeviceArray<kvcodec::ChunkedPool>> tables_;
    std::vector<uint64_t> chunksPerPage_;
};

KvcodecCodecFactory const kFactory = kvcodec::makeCodecFactory<Codec>();

} // namespace

KvcodecCodecFactory const* codecFactory() noexcept
{
    return &kFactory;
}

} // namespace {{ cookiecutter.codec_name | replace('-', '_') }}_codec

// {{ cookiecutter.codec_name }}: the parameters, the CPU reference, the CUDA implementation and the
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

// Shared by both implementations: which bytes of a lifecycle's pages drop_bits applies to.
class Codec : public kvcodec::CodecBase
{
public:
    Codec(Params params, int32_t device) : CodecBase(device), params_(params) {}

protected:
    bool plan(HotLayout const& layout) override
    {
        for (auto const& lc : layout.lifeCycles())
        {
            // K/V buffers of 16-bit floats, word-aligned: where drop_bits applies.
            auto& ranges = ranges_[lc.id];
            for (auto const& b : lc.buffers)
            {
                bool const kv = b.role == kvcodec::BufferRole::kKey || b.role == kvcodec::BufferRole::kValue;
                bool const half = b.dtype == kvcodec::DataType::kBFloat16 || b.dtype == kvcodec::DataType::kFloat16;
                if (kv && half && b.byteOffset % 2 == 0)
                {
                    ranges.push_back({uint64_t(b.poolIndex), b.byteOffset, b.byteOffset + b.bytes});
                }
            }
        }
        return planBackend(layout);
    }

    // Lifecycles of one hot pool group with identical lossy ranges encode identically.
    LayerGroupId batchingLayerGroup(HotLayout::LifeCycle const& lc) const override
    {
        LayerGroupId best = lc.id;
        for (LayerGroupId other : layout().groups()[lc.group].lifeCycles)
        {
            if (other < best && (params_.dropBits == 0 || ranges_.at(other) == ranges_.at(lc.id)))
            {
                best = other;
            }
        }
        return best;
    }

    virtual bool planBackend(HotLayout const& layout) = 0;

    Params params_;
    std::map<LayerGroupId, std::vector<KernelRange>> ranges_;
};

// CPU reference: host pointers, synchronous, stream ignored.
class CpuCodec final : public Codec
{
public:
    explicit CpuCodec(Params const& params) : Codec(params, KVCODEC_DEVICE_CPU) {}

private:
    bool planBackend(HotLayout const&) override { return true; }

    PageIndexLocation pageIndexLocation(HotLayout::LifeCycle const&) const override { return PageIndexLocation::kHost; }

    bool submit(CodecCall const& call) override
    {
        uint32_t const w = params_.wordBytes;
        uint64_t const keep = params_.dropBits == 0 ? ~0ull : ~((1ull << params_.dropBits) - 1);
        auto const& ranges = ranges_.at(call.lifeCycle.id);
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
                    bool const lossy = params_.dropBits != 0 && inRanges(ranges, p, k * w, k * w + w);
                    if (call.encoding)
                    {
                        std::memcpy(&word, slot + k * w, w);
                        word &= lossy ? keep : ~0ull;
                        for (uint32_t j = 0; j < w; ++j) page[j * words + k] = uint8_t(word >> (8 * j));
                    }
                    else
                    {
                        for (uint32_t j = 0; j < w; ++j) word |= uint64_t(page[j * words + k]) << (8 * j);
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

    static bool inRanges(std::vector<KernelRange> const& ranges, uint64_t pool, uint64_t begin, uint64_t end)
    {
        return std::any_of(ranges.begin(), ranges.end(),
            [&](KernelRange const& r) { return r.pool == pool && begin >= r.begin && end <= r.end; });
    }
};

// CUDA: one kernel; indices {% if cookiecutter.page_index_location == "device" %}read from device memory on the stream{% else %}consumed on the host and passed by value{% endif %}.
class CudaCodec final : public Codec
{
public:
    CudaCodec(Params const& params, kvcodec::CudaDevice device) : Codec(params, device.ordinal), numSms_(device.numSms) {}

    ~CudaCodec() override
    {
        kvcodec::DeviceScope scope(device());
        for (void* p : allocations_) cudaFree(p);
    }

private:
    bool planBackend(HotLayout const& layout) override
    {
        if (!cudaCheck(preloadKernel(), "loading the kernel"))
        {
            return false;
        }
        for (auto const& group : layout.groups())
        {
            std::vector<KernelPool> table;
            uint64_t off = 0, chunk = 0;
            for (auto const& pool : group.pools)
            {
                table.push_back({pool.base, pool.slotBytes, off, chunk});
                off += pool.slotBytes;
                chunk += (pool.slotBytes + kChunkBytes - 1) / kChunkBytes;
            }
            chunksPerPage_.push_back(chunk);
            tables_.push_back(upload(table));
        }
        for (auto const& [id, ranges] : ranges_)
        {
            deviceRanges_[id] = upload(ranges);
        }
        return cudaCheck(status_, "uploading the pool tables");
    }

    PageIndexLocation pageIndexLocation(HotLayout::LifeCycle const&) const override
    {
        return PageIndexLocation::{% if cookiecutter.page_index_location == "device" %}kDevice{% else %}kHost{% endif %};
    }

    bool submit(CodecCall const& call) override
    {
        KernelArgs args{};
        args.pools = tables_[call.groupIndex];
        args.numPools = uint32_t(call.group.pools.size());
        args.encode = call.encoding ? 1 : 0;
        args.wordBytes = params_.wordBytes;
        args.dropBits = params_.dropBits;
        args.ranges = deviceRanges_.at(call.lifeCycle.id);
        args.numRanges = uint32_t(ranges_.at(call.lifeCycle.id).size());
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

    // Copies `items` to a new device array (null when empty); the first error is kept in status_.
    template <class T>
    T* upload(std::vector<T> const& items)
    {
        void* device = nullptr;
        if (!items.empty() && status_ == cudaSuccess && (status_ = cudaMalloc(&device, items.size() * sizeof(T))) == cudaSuccess)
        {
            allocations_.push_back(device);
            status_ = cudaMemcpy(device, items.data(), items.size() * sizeof(T), cudaMemcpyHostToDevice);
        }
        return static_cast<T*>(device);
    }

    int numSms_;
    cudaError_t status_ = cudaSuccess;
    std::vector<void*> allocations_;
    std::vector<KernelPool*> tables_;
    std::map<LayerGroupId, KernelRange*> deviceRanges_;
    std::vector<uint64_t> chunksPerPage_;
};

struct Traits
{
    static constexpr char const* kName = "{{ cookiecutter.codec_name }}";
    static constexpr uint32_t kFormatVersion = ::{{ cookiecutter.codec_name | replace('-', '_') }}_codec::kFormatVersion;
    using Params = ::{{ cookiecutter.codec_name | replace('-', '_') }}_codec::Params;
    using Cpu = CpuCodec;
    using Cuda = CudaCodec;
};

KvcodecCodecFactory const kFactory = kvcodec::makeCodecFactory<Traits>();

} // namespace

KvcodecCodecFactory const* codecFactory() noexcept
{
    return &kFactory;
}

} // namespace {{ cookiecutter.codec_name | replace('-', '_') }}_codec

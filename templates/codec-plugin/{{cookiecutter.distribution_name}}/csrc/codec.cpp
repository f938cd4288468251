// {{ cookiecutter.codec_name }}: configuration, the CPU reference, the CUDA implementation and
// the factory. The blob format is described in codec.h.
#include "codec.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <kvcodec/device_scope.h>
#include <kvcodec/layout.h>
#include <kvcodec/params.h>

namespace {{ cookiecutter.codec_name | replace('-', '_') }}_codec {
namespace {

using kvcodec::HotLayout;
using kvcodec::LayerGroupId;
using kvcodec::PageIndexLocation;
using kvcodec::PageIndexPair;

bool parseParams(char const* json, Params& out, std::string& error)
{
    kvcodec::CodecParams params;
    if (!params.parse(json, error))
    {
        return false;
    }
    for (auto const& [key, value] : params.values())
    {
        auto number = params.getNumber(key);
        if (key == "word_bytes")
        {
            if (!number || !(*number == 1 || *number == 2 || *number == 4 || *number == 8))
            {
                error = "parameter 'word_bytes' is " + value.text + "; valid values are 1, 2, 4, 8";
                return false;
            }
            out.wordBytes = uint32_t(*number);
        }
{%- if cookiecutter.lossless == "no" %}
        else if (key == "drop_bits")
        {
            if (!number || *number < 0 || *number > 15 || *number != double(uint32_t(*number)))
            {
                error = "parameter 'drop_bits' is " + value.text + "; it must be an integer in [0, 15]";
                return false;
            }
            out.dropBits = uint32_t(*number);
        }
{%- endif %}
        else
        {
            error = "unknown parameter '" + key + "'";
            return false;
        }
    }
    if (out.dropBits >= 8 * out.wordBytes)
    {
        error = "drop_bits (" + std::to_string(out.dropBits) + ") must be smaller than 8 * word_bytes ("
            + std::to_string(8 * out.wordBytes) + ")";
        return false;
    }
    return true;
}

// Layout handling and argument checks shared by both implementations.
class CodecBase : public kvcodec::IKvCacheColdPageCodec
{
public:
    explicit CodecBase(Params params)
        : params_(params)
    {
    }

    bool configure(kvcodec::PoolGroupDesc const* descs, kvcodec::PoolGroupIndex n) noexcept override
    {
        try
        {
            if (configureCalled_)
            {
                return fail("configure() was already called; a codec is configured exactly once");
            }
            configureCalled_ = true;
            std::string err = layout_.load(descs, n);
            if (!err.empty())
            {
                return fail(err);
            }
            for (auto const& lc : layout_.lifeCycles())
            {
                ranges_[lc.id] = lossyRanges(lc);
            }
            if (!configureBackend())
            {
                return false;
            }
            configured_ = true;
            return true;
        }
        catch (std::exception const& e)
        {
            return fail(std::string("configure() failed: ") + e.what());
        }
    }

    size_t queryColdPageBytes(LayerGroupId id) const noexcept override
    {
        auto const* lc = configured_ ? layout_.find(id) : nullptr;
        return lc ? layout_.groups()[lc->group].pageBytes : 0;
    }

    LayerGroupId getBatchingLayerGroupId(LayerGroupId id) const noexcept override
    {
        // Lifecycles of one hot pool group whose lossy ranges are identical encode identically:
        // the smallest of them represents the class.
        auto const* lc = configured_ ? layout_.find(id) : nullptr;
        if (lc == nullptr)
        {
            return -1;
        }
        LayerGroupId best = id;
        for (LayerGroupId other : layout_.groups()[lc->group].lifeCycles)
        {
            if (other < best && (params_.dropBits == 0 || ranges_.at(other) == ranges_.at(id)))
            {
                best = other;
            }
        }
        return best;
    }

    PageIndexLocation queryPageIndexLocation(LayerGroupId id) const noexcept override
    {
        auto const* lc = configured_ ? layout_.find(id) : nullptr;
        return lc ? indexLocation() : PageIndexLocation::kBadLocation;
    }

    bool encode(LayerGroupId id, void* dst, PageIndexPair const* pairs, size_t n, cudaStream_t stream) noexcept override
    {
        return transform(id, reinterpret_cast<uintptr_t>(dst), pairs, n, stream, true);
    }

    bool decode(LayerGroupId id, void const* src, PageIndexPair const* pairs, size_t n, cudaStream_t stream) noexcept override
    {
        return transform(id, reinterpret_cast<uintptr_t>(src), pairs, n, stream, false);
    }

    char const* lastError() const noexcept override
    {
        return error_.c_str();
    }

protected:
    virtual bool configureBackend() = 0;
    virtual PageIndexLocation indexLocation() const noexcept = 0;
    virtual bool submit(HotLayout::Group const& group, kvcodec::PoolGroupIndex g, LayerGroupId id, uintptr_t blob,
        PageIndexPair const* pairs, size_t n, cudaStream_t stream, bool encode)
        = 0;

    /// K/V buffers of 16-bit floats, where drop_bits applies (word-aligned).
    static std::vector<KernelRange> lossyRanges(HotLayout::LifeCycle const& lc)
    {
        std::vector<KernelRange> out;
        for (auto const& b : lc.buffers)
        {
            bool const kv = b.role == kvcodec::BufferRole::kKey || b.role == kvcodec::BufferRole::kValue;
            bool const half = b.dtype == kvcodec::DataType::kBFloat16 || b.dtype == kvcodec::DataType::kFloat16;
            if (kv && half && b.byteOffset % 2 == 0)
            {
                out.push_back({uint64_t(b.poolIndex), b.byteOffset, b.byteOffset + b.bytes});
            }
        }
        return out;
    }

    static bool inRanges(std::vector<KernelRange> const& ranges, uint64_t pool, uint64_t begin, uint64_t end)
    {
        for (auto const& r : ranges)
        {
            if (r.pool == pool && begin >= r.begin && end <= r.end)
            {
                return true;
            }
        }
        return false;
    }

    std::map<LayerGroupId, std::vector<KernelRange>> ranges_;

    bool fail(std::string message) const noexcept
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

    HotLayout layout_;
    Params params_;
    mutable std::string error_;

private:
    bool transform(LayerGroupId id, uintptr_t blob, PageIndexPair const* pairs, size_t n, cudaStream_t stream,
        bool encode) noexcept
    {
        try
        {
            std::string error;
            auto const* lc = layout_.checkCall(encode ? "encode" : "decode", configured_, id,
                reinterpret_cast<void const*>(blob), pairs, n, error);
            if (lc == nullptr)
            {
                return error.empty() ? true : fail(error); // no pages: nothing to do
            }
            auto const& group = layout_.groups()[lc->group];
            if (indexLocation() == PageIndexLocation::kHost && !checkHostPairs(group, pairs, n, encode))
            {
                return false;
            }
            return submit(group, lc->group, id, blob, pairs, n, stream, encode);
        }
        catch (std::exception const& e)
        {
            return fail(e.what());
        }
    }

    // Host indices are checked before any work is done or enqueued: a rejected call writes
    // nothing. (Device indices cannot be read here without waiting for the stream.)
    bool checkHostPairs(HotLayout::Group const& group, PageIndexPair const* pairs, size_t n, bool encode)
    {
        for (size_t i = 0; i < n; ++i)
        {
            int32_t const hot = encode ? pairs[i].src : pairs[i].dst;
            int32_t const cold = encode ? pairs[i].dst : pairs[i].src;
            if (hot < 0 || uint64_t(hot) >= group.numSlots || cold < 0)
            {
                return fail("pageIndices[" + std::to_string(i) + "] = {dst " + std::to_string(pairs[i].dst) + ", src "
                    + std::to_string(pairs[i].src) + "} is out of range (hot slots 0.."
                    + std::to_string(group.numSlots - 1) + ", cold slots >= 0)");
            }
        }
        return true;
    }

    bool configured_ = false;
    bool configureCalled_ = false;
};

// ---------------------------------------------------------------------------------------------
// CPU reference: host pointers, synchronous, stream ignored.
// ---------------------------------------------------------------------------------------------

class CpuCodec final : public CodecBase
{
public:
    using CodecBase::CodecBase;

private:
    bool configureBackend() override
    {
        return true;
    }

    PageIndexLocation indexLocation() const noexcept override
    {
        // The CPU reference always reads host indices.
        return PageIndexLocation::kHost;
    }

    bool submit(HotLayout::Group const& group, kvcodec::PoolGroupIndex, LayerGroupId id, uintptr_t blob,
        PageIndexPair const* pairs, size_t n, cudaStream_t, bool encode) override
    {
        uint32_t const w = params_.wordBytes;
        uint64_t const keep = params_.dropBits == 0 ? ~0ull : ~((1ull << params_.dropBits) - 1);
        auto const& ranges = ranges_.at(id);
        for (size_t i = 0; i < n; ++i)
        {
            int32_t const hot = encode ? pairs[i].src : pairs[i].dst; // checked by checkHostPairs
            int32_t const cold = encode ? pairs[i].dst : pairs[i].src;
            auto* page = reinterpret_cast<uint8_t*>(blob + uint64_t(cold) * group.pageBytes);
            uint64_t off = 0;
            for (size_t p = 0; p < group.pools.size(); ++p)
            {
                auto const& pool = group.pools[p];
                auto* slot = reinterpret_cast<uint8_t*>(pool.base + uint64_t(hot) * pool.slotBytes);
                uint64_t const words = pool.slotBytes / w;
                for (uint64_t k = 0; k < words; ++k)
                {
                    uint64_t word = 0;
                    if (encode)
                    {
                        std::memcpy(&word, slot + k * w, w);
                        if (params_.dropBits != 0 && inRanges(ranges, p, k * w, k * w + w))
                        {
                            word &= keep;
                        }
                        for (uint32_t j = 0; j < w; ++j)
                        {
                            page[off + j * words + k] = uint8_t(word >> (8 * j));
                        }
                    }
                    else
                    {
                        for (uint32_t j = 0; j < w; ++j)
                        {
                            word |= uint64_t(page[off + j * words + k]) << (8 * j);
                        }
                        std::memcpy(slot + k * w, &word, w);
                    }
                }
                uint64_t const tail = pool.slotBytes - words * w;
                if (encode)
                {
                    std::memcpy(page + off + words * w, slot + words * w, tail);
                }
                else
                {
                    std::memcpy(slot + words * w, page + off + words * w, tail);
                }
                off += pool.slotBytes;
            }
        }
        return true;
    }
};

// ---------------------------------------------------------------------------------------------
// CUDA: one kernel; indices {% if cookiecutter.page_index_location == "device" %}read from device memory on the stream{% else %}consumed on the host and passed by value{% endif %}.
// ---------------------------------------------------------------------------------------------

class CudaCodec final : public CodecBase
{
public:
    CudaCodec(Params params, int device, int numSms)
        : CodecBase(params)
        , device_(device)
        , numSms_(numSms)
    {
    }

    ~CudaCodec() override
    {
        for (KernelPool* table : tables_)
        {
            cudaFree(table);
        }
        for (auto& [id, table] : deviceRanges_)
        {
            cudaFree(table);
        }
    }

private:
    bool configureBackend() override
    {
        kvcodec::DeviceScope scope(device_); // the caller's device is restored on return
        if (!scope.ok())
        {
            return fail("cannot use CUDA device " + std::to_string(device_));
        }
        if (cudaError_t st = preloadKernel(); st != cudaSuccess)
        {
            return fail(std::string("loading the kernel failed: ") + cudaGetErrorString(st));
        }
        for (auto const& group : layout_.groups())
        {
            std::vector<KernelPool> table;
            uint64_t off = 0;
            uint64_t chunk = 0;
            for (auto const& pool : group.pools)
            {
                table.push_back({pool.base, pool.slotBytes, off, chunk});
                off += pool.slotBytes;
                chunk += (pool.slotBytes + kChunkBytes - 1) / kChunkBytes;
            }
            chunksPerPage_.push_back(chunk);
            KernelPool* device = nullptr;
            cudaError_t st = cudaMalloc(reinterpret_cast<void**>(&device), table.size() * sizeof(KernelPool));
            if (st == cudaSuccess)
            {
                tables_.push_back(device);
                st = cudaMemcpy(device, table.data(), table.size() * sizeof(KernelPool), cudaMemcpyHostToDevice);
            }
            if (st != cudaSuccess)
            {
                return fail(std::string("uploading the pool table failed: ") + cudaGetErrorString(st));
            }
        }
        for (auto const& [id, ranges] : ranges_)
        {
            KernelRange* device = nullptr;
            if (!ranges.empty())
            {
                cudaError_t st = cudaMalloc(reinterpret_cast<void**>(&device), ranges.size() * sizeof(KernelRange));
                if (st == cudaSuccess)
                {
                    deviceRanges_[id] = device;
                    st = cudaMemcpy(device, ranges.data(), ranges.size() * sizeof(KernelRange), cudaMemcpyHostToDevice);
                }
                if (st != cudaSuccess)
                {
                    return fail(std::string("uploading the lossy ranges failed: ") + cudaGetErrorString(st));
                }
            }
        }
        return true;
    }

    PageIndexLocation indexLocation() const noexcept override
    {
        return PageIndexLocation::{% if cookiecutter.page_index_location == "device" %}kDevice{% else %}kHost{% endif %};
    }

    bool submit(HotLayout::Group const& group, kvcodec::PoolGroupIndex g, LayerGroupId id, uintptr_t blob,
        PageIndexPair const* pairs, size_t n, cudaStream_t stream, bool encode) override
    {
        if (stream == nullptr || stream == cudaStreamLegacy)
        {
            return fail("non-empty calls need a non-legacy CUDA stream");
        }
        kvcodec::DeviceScope scope(device_); // the caller's device is restored on return
        if (!scope.ok())
        {
            return fail("cannot use CUDA device " + std::to_string(device_));
        }
        KernelArgs args{};
        args.pools = tables_[g];
        args.numPools = uint32_t(group.pools.size());
        args.encode = encode ? 1 : 0;
        args.wordBytes = params_.wordBytes;
        args.dropBits = params_.dropBits;
        args.ranges = deviceRanges_.count(id) ? deviceRanges_.at(id) : nullptr;
        args.numRanges = uint32_t(ranges_.at(id).size());
        args.chunksPerPage = chunksPerPage_[g];
        args.pageBytes = group.pageBytes;
        args.numHotSlots = group.numSlots;
        args.blob = blob;
{%- if cookiecutter.page_index_location == "device" %}
        args.devicePairs = pairs;
        args.numPairs = n;
        cudaError_t st = launchKernel(args, numSms_, stream);
        return st == cudaSuccess ? true : fail(std::string("kernel launch failed: ") + cudaGetErrorString(st));
{%- else %}
        // Host indices are consumed here: each launch carries up to kPairsPerLaunch pairs by value,
        // so nothing reads the caller's array after this call returns.
        for (size_t first = 0; first < n; first += kPairsPerLaunch)
        {
            args.numPairs = std::min<size_t>(kPairsPerLaunch, n - first);
            std::memcpy(args.hostPairs, pairs + first, args.numPairs * sizeof(PageIndexPair));
            args.devicePairs = nullptr;
            cudaError_t st = launchKernel(args, numSms_, stream);
            if (st != cudaSuccess)
            {
                return fail(std::string("kernel launch failed: ") + cudaGetErrorString(st));
            }
        }
        return true;
{%- endif %}
    }

    int device_;
    int numSms_;
    std::vector<KernelPool*> tables_;
    std::map<LayerGroupId, KernelRange*> deviceRanges_;
    std::vector<uint64_t> chunksPerPage_;
};

kvcodec::IKvCacheColdPageCodec* create(char const* json, int32_t device, char* error, size_t capacity)
{
    try
    {
        Params params;
        std::string message;
        if (!parseParams(json, params, message))
        {
            kvcodec::writeFactoryError(error, capacity, message.c_str());
            return nullptr;
        }
        if (device == KVCODEC_DEVICE_CPU)
        {
            return new CpuCodec(params);
        }
        int count = 0;
        if (device < 0 || cudaGetDeviceCount(&count) != cudaSuccess || device >= count)
        {
            cudaGetLastError();
            kvcodec::writeFactoryError(error, capacity,
                ("CUDA device " + std::to_string(device) + " is not available (" + std::to_string(count) + " devices)").c_str());
            return nullptr;
        }
        int numSms = 0;
        cudaDeviceGetAttribute(&numSms, cudaDevAttrMultiProcessorCount, device);
        return new CudaCodec(params, device, numSms);
    }
    catch (std::exception const& e)
    {
        kvcodec::writeFactoryError(error, capacity, e.what());
        return nullptr;
    }
}

void destroy(kvcodec::IKvCacheColdPageCodec* codec)
{
    delete codec;
}

KvcodecCodecFactory const kFactory{KVCODEC_PLUGIN_ABI_VERSION, sizeof(KvcodecCodecFactory),
    "{{ cookiecutter.codec_name }}", kFormatVersion, 0, &create, &destroy};

} // namespace

KvcodecCodecFactory const* codecFactory() noexcept
{
    return &kFactory;
}

} // namespace {{ cookiecutter.codec_name | replace('-', '_') }}_codec

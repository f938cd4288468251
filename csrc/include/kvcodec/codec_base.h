// SPDX-License-Identifier: Apache-2.0
//
// The one codec skeleton. Header-only, for use inside codecs (built-in or plugin); nothing here
// crosses the plugin ABI, so adopting it changes no ABI.
//
// Every codec has to do the same things around its real work: accept configure() exactly once,
// validate the hot layout, keep an error message, answer the queries only once configured, check
// the arguments and (host) page indices of every call before touching memory, make its CUDA device
// current, refuse the legacy stream, and catch every exception at the noexcept boundary. CodecBase
// does all of that. A codec writes:
//
//   plan(layout)        its layout planning, once, after the SDK validated the layout;
//   submit(call)        one checked, non-empty encode or decode call;
//
// and optionally pageIndexLocation() (default: host indices on the CPU, device ones on a GPU),
// coldPageBytes() (default: the page's bytes, i.e. no compression),
// batchingLayerGroup() (default: the smallest lifecycle of the hot pool group) and, for codecs
// whose blobs carry the cold-page envelope, hasCheckedDecode() returning true (submit() then also
// serves decodeChecked(), with call.pageStatus set).
//
// makeCodecFactory<Traits>() builds the plugin factory: it reads the parameters (ParamReader in
// kvcodec/params.h), checks the device and constructs the CPU or the CUDA implementation. A codec
// written as one class for both devices derives from DualCodec<Params>, which keeps the parameters
// and splits submit() into submitCpu() and submitCuda(), or from PlannedCodec<Params, Plan> when it
// plans each lifecycle from its buffer list.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "kvcodec/codec.h"
#include "kvcodec/cuda_error.h"
#include "kvcodec/device_scope.h"
#include "kvcodec/fp_environment.h"
#include "kvcodec/layout.h"
#include "kvcodec/params.h"
#include "kvcodec/plugin.h"

namespace kvcodec {

/// One checked, non-empty encode() / decode() / decodeChecked() call, as submit() receives it.
struct CodecCall
{
    HotLayout::LifeCycle const& lifeCycle; ///< The lifecycle named by the call.
    HotLayout::Group const& group;         ///< Its hot pool group (pools, page bytes, slot count).
    PoolGroupIndex groupIndex;             ///< Index of `group` in the layout.
    uintptr_t coldBase;                    ///< dstBasePtr of encode, srcBasePtr of decode.
    PageIndexPair const* pages;            ///< numPages index pairs, at pageIndexLocation().
    size_t numPages;                       ///< > 0.
    cudaStream_t stream;                   ///< Non-legacy for CUDA codecs; ignored by the CPU ones.
    bool encoding;                         ///< True for encode (hot -> cold).
    uint8_t* pageStatus;                   ///< decodeChecked(): one PageStatus per page; else null.
    /// The largest cold slot index when the base checked host indices (encode and decode with
    /// kHost indices), else -1. A checked decode's indices are unchecked: submit() reports a bad
    /// pair as that page's kPageBadIndex.
    int64_t maxColdIndex;

    /// The hot slot of pair i (src of encode, dst of decode). Host indices only.
    [[nodiscard]] int32_t hot(size_t i) const noexcept
    {
        return encoding ? pages[i].src : pages[i].dst;
    }

    /// The cold slot of pair i (dst of encode, src of decode). Host indices only.
    [[nodiscard]] int32_t cold(size_t i) const noexcept
    {
        return encoding ? pages[i].dst : pages[i].src;
    }
};

/// The codec skeleton (see the file comment). `device` is KVCODEC_DEVICE_CPU for the CPU
/// reference implementation or the CUDA device ordinal the codec runs on.
class CodecBase : public IKvCacheColdPageCodec
{
public:
    explicit CodecBase(int32_t device) noexcept
        : device_(device)
    {
    }

    bool configure(PoolGroupDesc const* gpuDescs, PoolGroupIndex numGpuDescs) noexcept final
    {
        try
        {
            if (configureCalled_)
            {
                return fail("configure() was already called; a codec is configured exactly once");
            }
            configureCalled_ = true; // Even a rejected configuration is final: a host configures once.
            std::string err = layout_.load(gpuDescs, numGpuDescs);
            if (!err.empty())
            {
                return fail(err);
            }
            std::optional<DeviceScope> scope; // A CPU codec touches no device (and creates no context).
            if (!isCpu() && !scope.emplace(device_).ok())
            {
                return fail("cannot make CUDA device " + std::to_string(device_) + " current");
            }
            if (!plan(layout_))
            {
                return false;
            }
            answers_.clear();
            for (auto const& lc : layout_.lifeCycles())
            {
                answers_[lc.id] = Answers{coldPageBytes(lc), batchingLayerGroup(lc), pageIndexLocation(lc)};
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

    size_t queryColdPageBytes(LayerGroupId id) const noexcept final
    {
        Answers const* a = answers(id);
        return a ? size_t(a->coldPageBytes) : 0;
    }

    LayerGroupId getBatchingLayerGroupId(LayerGroupId id) const noexcept final
    {
        Answers const* a = answers(id);
        return a ? a->batching : -1;
    }

    PageIndexLocation queryPageIndexLocation(LayerGroupId id) const noexcept final
    {
        Answers const* a = answers(id);
        return a ? a->location : PageIndexLocation::kBadLocation;
    }

    bool encode(LayerGroupId id, void* dstBasePtr, PageIndexPair const* pageIndices, size_t numBasePages,
        cudaStream_t stream) noexcept final
    {
        return run(
            "encode", id, reinterpret_cast<uintptr_t>(dstBasePtr), pageIndices, numBasePages, nullptr, stream, true);
    }

    bool decode(LayerGroupId id, void const* srcBasePtr, PageIndexPair const* pageIndices, size_t numBasePages,
        cudaStream_t stream) noexcept final
    {
        return run(
            "decode", id, reinterpret_cast<uintptr_t>(srcBasePtr), pageIndices, numBasePages, nullptr, stream, false);
    }

    bool decodeChecked(LayerGroupId id, void const* srcBasePtr, PageIndexPair const* pageIndices, size_t numBasePages,
        uint8_t* pageStatus, cudaStream_t stream) noexcept final
    {
        if (!hasCheckedDecode())
        {
            return fail("decodeChecked(): this codec has no checked decode (hasCheckedDecode() is false)");
        }
        if (numBasePages > 0 && pageStatus == nullptr)
        {
            return fail("decodeChecked(): pageStatus is null with " + std::to_string(numBasePages) + " pages");
        }
        return run("decodeChecked", id, reinterpret_cast<uintptr_t>(srcBasePtr), pageIndices, numBasePages, pageStatus,
            stream, false);
    }

    char const* lastError() const noexcept final
    {
        return error_.c_str();
    }

protected:
    // ---- What a codec writes ---------------------------------------------------------------

    /// Plans the validated layout (called once, from configure(), with the codec's CUDA device
    /// current). Returns false through fail() to reject the layout.
    virtual bool plan(HotLayout const& layout) = 0;

    /// Where the codec reads the page indices of lifecycle `lc` (called after plan()). Default:
    /// the host for the CPU implementation, the device for a CUDA one.
    virtual PageIndexLocation pageIndexLocation(HotLayout::LifeCycle const& /*lc*/) const
    {
        return isCpu() ? PageIndexLocation::kHost : PageIndexLocation::kDevice;
    }

    /// Runs one checked, non-empty call (with the codec's CUDA device current). Returns false
    /// through fail(). For decodeChecked() a bad blob is a page status, not a failure.
    virtual bool submit(CodecCall const& call) = 0;

    /// Bytes of one cold page of lifecycle `lc` (called after plan()). Default: the hot page's
    /// bytes, the sum of the slot bytes of its pools.
    virtual uint64_t coldPageBytes(HotLayout::LifeCycle const& lc) const
    {
        return layout_.groups()[lc.group].pageBytes;
    }

    /// The lifecycle that represents `lc` in batched calls (called after plan()). Default: every
    /// lifecycle of a hot pool group encodes identically, so the group's smallest lifecycle ID.
    virtual LayerGroupId batchingLayerGroup(HotLayout::LifeCycle const& lc) const
    {
        return layout_.smallestLifeCycle(lc.group);
    }

    /// The smallest lifecycle of `lc`'s hot pool group for which `alike(other)` holds, `lc` itself
    /// when no smaller one does: the batchingLayerGroup() of a codec whose encoding differs
    /// between lifecycles of one group.
    template <class Alike>
    LayerGroupId smallestAlike(HotLayout::LifeCycle const& lc, Alike&& alike) const
    {
        LayerGroupId best = lc.id;
        for (LayerGroupId other : layout_.groups()[lc.group].lifeCycles)
        {
            best = (other < best && alike(other)) ? other : best;
        }
        return best;
    }

    /// smallestAlike() by the buffer list: the smallest lifecycle of the group whose buffers are
    /// field-for-field those of `lc` (for codecs whose encoding follows the buffer list alone).
    LayerGroupId smallestWithSameBuffers(HotLayout::LifeCycle const& lc) const
    {
        return smallestAlike(
            lc, [&](LayerGroupId other) { return sameBuffers(layout_.find(other)->buffers, lc.buffers); });
    }

    // ---- What the base gives ---------------------------------------------------------------

    /// Records `message` as lastError() and returns false.
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

    /// fail("<what> failed: <CUDA error text>") unless `status` is cudaSuccess.
    bool cudaCheck(cudaError_t status, std::string const& what) const noexcept
    {
        if (status == cudaSuccess)
        {
            return true;
        }
        try
        {
            return fail(what + " failed: " + cudaErrorText(status));
        }
        catch (...)
        {
            return false;
        }
    }

    [[nodiscard]] bool isCpu() const noexcept
    {
        return device_ == KVCODEC_DEVICE_CPU;
    }

    /// The CUDA device ordinal, or KVCODEC_DEVICE_CPU.
    [[nodiscard]] int32_t device() const noexcept
    {
        return device_;
    }

    [[nodiscard]] HotLayout const& layout() const noexcept
    {
        return layout_;
    }

private:
    struct Answers
    {
        uint64_t coldPageBytes;
        LayerGroupId batching;
        PageIndexLocation location;
    };

    Answers const* answers(LayerGroupId id) const noexcept
    {
        if (!configured_)
        {
            return nullptr;
        }
        auto it = answers_.find(id);
        return it == answers_.end() ? nullptr : &it->second;
    }

    bool run(char const* op, LayerGroupId id, uintptr_t coldBase, PageIndexPair const* pairs, size_t n,
        uint8_t* pageStatus, cudaStream_t stream, bool encoding) noexcept
    {
        try
        {
            std::string error;
            auto const* lc
                = layout_.checkCall(op, configured_, id, reinterpret_cast<void const*>(coldBase), pairs, n, error);
            if (lc == nullptr)
            {
                return error.empty() ? true : fail(error); // no pages: nothing to do
            }
            auto const& group = layout_.groups()[lc->group];
            int64_t maxCold = -1;
            // A checked decode reports a bad pair as that page's kPageBadIndex instead (submit()).
            if (pageStatus == nullptr && answers_.at(id).location == PageIndexLocation::kHost
                && !checkHostIndices(group, pairs, n, encoding, maxCold))
            {
                return false;
            }
            CodecCall const call{*lc, group, lc->group, coldBase, pairs, n, stream, encoding, pageStatus, maxCold};
            if (isCpu())
            {
                IeeeScope ieee; // the same bytes whatever the caller's floating-point settings
                return submit(call);
            }
            if (stream == nullptr || stream == cudaStreamLegacy)
            {
                return fail(
                    std::string(op) + "(): non-empty calls need a non-legacy CUDA stream (got the legacy/null stream)");
            }
            DeviceScope scope(device_);
            if (!scope.ok())
            {
                return fail("cannot make CUDA device " + std::to_string(device_) + " current");
            }
            return submit(call);
        }
        catch (std::exception const& e)
        {
            return fail(std::string(op) + "() failed: " + e.what());
        }
    }

    // Host indices are checked before any work is done or enqueued: a rejected call writes
    // nothing. (Device indices cannot be read here without waiting for the stream.)
    bool checkHostIndices(
        HotLayout::Group const& group, PageIndexPair const* pairs, size_t n, bool encoding, int64_t& maxCold) const
    {
        for (size_t i = 0; i < n; ++i)
        {
            int32_t const hot = encoding ? pairs[i].src : pairs[i].dst;
            int32_t const cold = encoding ? pairs[i].dst : pairs[i].src;
            if (hot < 0 || uint64_t(hot) >= group.numSlots)
            {
                return fail("pageIndices[" + std::to_string(i) + "]." + (encoding ? "src" : "dst") + " is "
                    + std::to_string(hot) + "; hot slot indices are 0.." + std::to_string(group.numSlots - 1));
            }
            if (cold < 0)
            {
                return fail("pageIndices[" + std::to_string(i) + "]." + (encoding ? "dst" : "src") + " is "
                    + std::to_string(cold) + "; cold slot indices must be >= 0");
            }
            maxCold = cold > maxCold ? cold : maxCold;
        }
        return true;
    }

    HotLayout layout_;
    std::unordered_map<LayerGroupId, Answers> answers_;
    int32_t device_;
    bool configured_ = false;
    bool configureCalled_ = false;
    mutable std::string error_;
};

/// A device array a codec plans at configure() (pool tables, per-lifecycle constants): owns the
/// allocation, frees it on its device, and reports CUDA errors as a status.
template <class T>
class DeviceArray
{
    static_assert(std::is_trivially_copyable_v<T>, "DeviceArray holds trivially copyable elements");

public:
    DeviceArray() = default;
    DeviceArray(DeviceArray const&) = delete;
    DeviceArray& operator=(DeviceArray const&) = delete;
    DeviceArray(DeviceArray&& other) noexcept
    {
        *this = std::move(other);
    }
    DeviceArray& operator=(DeviceArray&& other) noexcept
    {
        std::swap(data_, other.data_);
        std::swap(size_, other.size_);
        std::swap(device_, other.device_);
        return *this;
    }
    ~DeviceArray()
    {
        reset();
    }

    /// Replaces the contents with a copy of `items` on the current device (synchronous copy;
    /// nothing is allocated for an empty vector and get() is then null).
    cudaError_t upload(std::vector<T> const& items) noexcept
    {
        reset();
        if (items.empty())
        {
            return cudaSuccess;
        }
        cudaError_t st = cudaGetDevice(&device_);
        if (st == cudaSuccess)
        {
            st = cudaMalloc(reinterpret_cast<void**>(&data_), items.size() * sizeof(T));
        }
        if (st == cudaSuccess)
        {
            size_ = items.size();
            st = cudaMemcpy(data_, items.data(), items.size() * sizeof(T), cudaMemcpyHostToDevice);
        }
        return st;
    }

    [[nodiscard]] T* get() const noexcept
    {
        return data_;
    }

    [[nodiscard]] size_t size() const noexcept
    {
        return size_;
    }

private:
    void reset() noexcept
    {
        if (data_ != nullptr)
        {
            DeviceScope scope(device_);
            cudaFree(data_);
        }
        data_ = nullptr;
        size_ = 0;
    }

    T* data_ = nullptr;
    size_t size_ = 0;
    int device_ = 0;
};

/// One pool of a hot pool group as a gather/scatter kernel sees it: the pools' slots follow each
/// other in the blob in pool order, and each slot is cut into chunks of `chunkBytes` (the last one
/// may be shorter) numbered across the page.
struct ChunkedPool
{
    uint64_t base;       ///< Address of the pool's slot 0.
    uint64_t slotBytes;  ///< Bytes of one slot.
    uint64_t blobOffset; ///< Where the slot's bytes start inside the page's blob.
    uint64_t firstChunk; ///< Index of the slot's first chunk among the page's chunks.
};

/// The ChunkedPool table of `group`; `chunksPerPage` receives the page's number of chunks.
inline std::vector<ChunkedPool> chunkedPools(
    HotLayout::Group const& group, uint64_t chunkBytes, uint64_t& chunksPerPage)
{
    std::vector<ChunkedPool> table;
    uint64_t offset = 0;
    chunksPerPage = 0;
    for (auto const& pool : group.pools)
    {
        table.push_back({pool.base, pool.slotBytes, offset, chunksPerPage});
        offset += pool.slotBytes;
        chunksPerPage += (pool.slotBytes + chunkBytes - 1) / chunkBytes;
    }
    return table;
}

/// What the CUDA implementation's constructor receives from the factory.
struct CudaDevice
{
    int32_t ordinal; ///< The CUDA device ordinal (available: the factory checked it).
    int32_t numSms;  ///< Its multiprocessor count.
};

/// The base of a codec written as one class for both devices (its own factory Traits): it keeps
/// the parameters and the device's multiprocessor count, and submit() runs submitCpu() for the CPU
/// reference and submitCuda() on a CUDA device. The codec adds kName and kFormatVersion, inherits
/// the constructor (`using DualCodec::DualCodec;`) and writes plan(), submitCpu() and submitCuda().
template <class ParamsT>
class DualCodec : public CodecBase
{
public:
    using Params = ParamsT;

    explicit DualCodec(Params const& params, CudaDevice cuda = {KVCODEC_DEVICE_CPU, 0})
        : CodecBase(cuda.ordinal)
        , params_(params)
        , numSms_(cuda.numSms)
    {
    }

protected:
    /// The call on host pointers, synchronously (the stream is ignored).
    virtual bool submitCpu(CodecCall const& call) = 0;
    /// The call enqueued on call.stream.
    virtual bool submitCuda(CodecCall const& call) = 0;

    bool submit(CodecCall const& call) override
    {
        return isCpu() ? submitCpu(call) : submitCuda(call);
    }

    Params const params_;  ///< As the factory read them.
    int32_t const numSms_; ///< Multiprocessors of the CUDA device (0 for the CPU reference).
};

/// A DualCodec that plans each lifecycle from its buffer list alone into a `PlanT` (which has a
/// `coldPageBytes` field): plan() fills plans_, and the base answers coldPageBytes() from them and
/// batches the lifecycles of a group whose buffer lists are identical.
template <class ParamsT, class PlanT>
class PlannedCodec : public DualCodec<ParamsT>
{
public:
    using DualCodec<ParamsT>::DualCodec;

protected:
    uint64_t coldPageBytes(HotLayout::LifeCycle const& lc) const override
    {
        return plans_.at(lc.id).coldPageBytes;
    }

    LayerGroupId batchingLayerGroup(HotLayout::LifeCycle const& lc) const override
    {
        return this->smallestWithSameBuffers(lc);
    }

    std::unordered_map<LayerGroupId, PlanT> plans_; ///< Per lifecycle, filled by plan().
};

/// Thrown by a codec's constructor or parameter reading to refuse creation with a message; the
/// factory returns it as its error. (Any std::exception works the same way.)
struct CodecCreateError : std::runtime_error
{
    using std::runtime_error::runtime_error;
};

namespace detail {

// Traits::Cpu / Traits::Cuda when declared, else Traits itself (one class for both).
template <class T>
struct Tag
{
    using type = T;
};
template <class Traits>
Tag<typename Traits::Cpu> cpuOf(int);
template <class Traits>
Tag<Traits> cpuOf(...);
template <class Traits>
Tag<typename Traits::Cuda> cudaOf(int);
template <class Traits>
Tag<Traits> cudaOf(...);

template <class Traits>
IKvCacheColdPageCodec* createCodec(char const* paramsJson, int32_t device, char* error, size_t capacity) noexcept
{
    try
    {
        ParamReader reader(Traits::kName, paramsJson);
        typename Traits::Params params{};
        params.read(reader);
        reader.finish();
        if (device == KVCODEC_DEVICE_CPU)
        {
            return new typename decltype(cpuOf<Traits>(0))::type(params);
        }
        using Cuda = typename decltype(cudaOf<Traits>(0))::type;
        if constexpr (std::is_void_v<Cuda>)
        {
            throw CodecCreateError(std::string("codec '") + Traits::kName
                + "' has only a CPU implementation; create it with device -1 (KVCODEC_DEVICE_CPU)");
        }
        else
        {
            if (device < 0)
            {
                throw CodecCreateError(
                    "device is " + std::to_string(device) + "; use -1 for the CPU reference or a CUDA device ordinal");
            }
            int count = 0;
            cudaError_t st = cudaGetDeviceCount(&count);
            if (st != cudaSuccess || device >= count)
            {
                cudaGetLastError();
                throw CodecCreateError("CUDA device " + std::to_string(device) + " is not available ("
                    + (st == cudaSuccess ? std::to_string(count) + " devices" : cudaErrorText(st)) + ")");
            }
            int numSms = 0;
            {
                DeviceScope scope(device);
                cudaFree(nullptr); // Creates the primary context so driver queries work.
                cudaDeviceGetAttribute(&numSms, cudaDevAttrMultiProcessorCount, device);
            }
            return new Cuda(params, CudaDevice{device, numSms});
        }
    }
    catch (std::exception const& e)
    {
        writeFactoryError(error, capacity, e.what());
        return nullptr;
    }
}

inline void destroyCodec(IKvCacheColdPageCodec* codec) noexcept
{
    delete codec;
}

} // namespace detail

/// The plugin factory of a codec described by `Traits`:
///
///   struct Traits {
///       static constexpr char const* kName = "my-codec";   // the registry name
///       static constexpr uint32_t kFormatVersion = 1;      // the blob format's version
///       using Params = MyParams;  // default-constructible, with void read(kvcodec::ParamReader&)
///       using Cpu = MyCodecCpu;   // constructible from Params const&
///       using Cuda = MyCodecCuda; // constructible from (Params const&, CudaDevice); void: CPU only
///   };
///   KvcodecCodecFactory const kFactory = kvcodec::makeCodecFactory<Traits>();
///
/// Without `Cpu` / `Cuda` the Traits class itself is the codec for that device (a codec class can
/// be its own Traits: one class with both constructors that branches on isCpu()).
/// The factory reads the parameters (unknown keys and wrong types are refused with the key named),
/// creates the CPU implementation for KVCODEC_DEVICE_CPU and the CUDA one for an available device,
/// and turns any exception into its error message.
template <class Traits>
constexpr KvcodecCodecFactory makeCodecFactory() noexcept
{
    return KvcodecCodecFactory{KVCODEC_PLUGIN_ABI_VERSION, sizeof(KvcodecCodecFactory), Traits::kName,
        Traits::kFormatVersion, 0, &detail::createCodec<Traits>, &detail::destroyCodec};
}

} // namespace kvcodec

// SPDX-License-Identifier: Apache-2.0
//
// The default, lossless concatenating codec.
//
// Blob format (format version 1): the cold page of a lifecycle is the concatenation, in pool
// order, of the page's full slot in every pool of its hot pool group. cold bytes = sum of the
// pools' slotBytes. No header.
//
// Two implementations of that one format:
//  - CPU reference: host pointers, memcpy per (page, pool), synchronous, stream ignored.
//  - CUDA: a copy-engine path (host indices consumed synchronously into one cuMemcpyBatchAsync
//    descriptor per (page, pool), submitted once per call; per-descriptor cuMemcpyAsync where
//    the batch API is missing) and an SM path (device indices, one gather kernel per call) for
//    pieces too small for the copy engines. The path is chosen per hot pool group at configure
//    time; the page-index location follows it.
#include "concat_codec.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "concat_gather.h"
#include "kvcodec/device_scope.h"
#include "kvcodec/layout.h"
#include "kvcodec/params.h"
#include "kvcodec/plugin.h"
#include "runtime/driver_api.h"

namespace kvcodec::concat {
namespace {

enum class Path { kAuto, kCopyEngine, kSm };
enum class CopyApi { kAuto, kBatch, kPerCopy };

struct ConcatParams
{
    Path path = Path::kAuto;
    uint64_t smPathBelowBytes = 1024 * 1024;
    CopyApi copyApi = CopyApi::kAuto;
};

// Reads the parameters; the Python registry validated them already, this repeats the checks so
// a native caller gets the same errors.
bool parseParams(char const* json, ConcatParams& out, std::string& error)
{
    CodecParams params;
    if (!params.parse(json, error))
    {
        return false;
    }
    for (auto const& [key, value] : params.values())
    {
        if (key == "path")
        {
            auto v = params.getString(key);
            if (v == std::string("auto")) out.path = Path::kAuto;
            else if (v == std::string("copy_engine")) out.path = Path::kCopyEngine;
            else if (v == std::string("sm")) out.path = Path::kSm;
            else
            {
                error = "concat parameter 'path' is " + value.text + "; valid values are 'auto', 'copy_engine', 'sm'";
                return false;
            }
        }
        else if (key == "sm_path_below_bytes")
        {
            auto v = params.getNumber(key);
            if (!v || *v < 0 || *v != double(uint64_t(*v)))
            {
                error = "concat parameter 'sm_path_below_bytes' is " + value.text + "; it must be an integer >= 0";
                return false;
            }
            out.smPathBelowBytes = uint64_t(*v);
        }
        else if (key == "copy_api")
        {
            auto v = params.getString(key);
            if (v == std::string("auto")) out.copyApi = CopyApi::kAuto;
            else if (v == std::string("batch")) out.copyApi = CopyApi::kBatch;
            else if (v == std::string("per_copy")) out.copyApi = CopyApi::kPerCopy;
            else
            {
                error = "concat parameter 'copy_api' is " + value.text + "; valid values are 'auto', 'batch', 'per_copy'";
                return false;
            }
        }
        else
        {
            error = "unknown concat parameter '" + key + "'; valid parameters are 'path', 'sm_path_below_bytes', 'copy_api'";
            return false;
        }
    }
    return true;
}

// Shared by both implementations: layout, blob offsets, queries and argument validation.
class ConcatCodecBase : public IKvCacheColdPageCodec
{
public:
    explicit ConcatCodecBase(ConcatParams params)
        : params_(params)
    {
    }

    bool configure(PoolGroupDesc const* gpuDescs, PoolGroupIndex numGpuDescs) noexcept override
    {
        try
        {
            if (configureCalled_)
            {
                return fail("configure() was already called; a codec is configured exactly once");
            }
            configureCalled_ = true; // Even a rejected configuration is final: KVCM calls configure once.
            std::string err = layout_.load(gpuDescs, numGpuDescs);
            if (!err.empty())
            {
                return fail(err);
            }
            offsets_.clear();
            for (auto const& group : layout_.groups())
            {
                std::vector<uint64_t> offs;
                uint64_t off = 0;
                for (auto const& pool : group.pools)
                {
                    offs.push_back(off);
                    off += pool.slotBytes;
                }
                offsets_.push_back(std::move(offs));
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

    size_t queryColdPageBytes(LayerGroupId id) const noexcept override
    {
        auto const* lc = configured_ ? layout_.find(id) : nullptr;
        return lc ? layout_.groups()[lc->group].pageBytes : 0;
    }

    LayerGroupId getBatchingLayerGroupId(LayerGroupId id) const noexcept override
    {
        // Every lifecycle of a hot pool group encodes identically: the representative is the
        // smallest lifecycle ID of the group.
        auto const* lc = configured_ ? layout_.find(id) : nullptr;
        return lc ? layout_.smallestLifeCycle(lc->group) : -1;
    }

    PageIndexLocation queryPageIndexLocation(LayerGroupId id) const noexcept override
    {
        auto const* lc = configured_ ? layout_.find(id) : nullptr;
        return lc ? groupLocation(lc->group) : PageIndexLocation::kBadLocation;
    }

    bool encode(LayerGroupId id, void* dstBasePtr, PageIndexPair const* pageIndices, size_t numBasePages,
        cudaStream_t stream) noexcept override
    {
        return transform(id, reinterpret_cast<uintptr_t>(dstBasePtr), pageIndices, numBasePages, stream, true);
    }

    bool decode(LayerGroupId id, void const* srcBasePtr, PageIndexPair const* pageIndices, size_t numBasePages,
        cudaStream_t stream) noexcept override
    {
        return transform(id, reinterpret_cast<uintptr_t>(srcBasePtr), pageIndices, numBasePages, stream, false);
    }

    char const* lastError() const noexcept override
    {
        return error_.c_str();
    }

protected:
    // One (page, pool) copy in blob-relative terms.
    struct Piece
    {
        uintptr_t hot;
        uintptr_t cold;
        uint64_t bytes;
    };

    virtual bool configureBackend() = 0;
    virtual PageIndexLocation groupLocation(PoolGroupIndex group) const noexcept = 0;
    virtual bool submit(PoolGroupIndex group, uintptr_t blob, PageIndexPair const* pairs, size_t n,
        cudaStream_t stream, bool encode)
        = 0;

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

    // Checks host-visible indices of one call; returns the largest cold index through maxCold.
    bool checkHostIndices(HotLayout::Group const& group, PageIndexPair const* pairs, size_t n, bool encode,
        int64_t& maxCold) const
    {
        maxCold = -1;
        for (size_t i = 0; i < n; ++i)
        {
            int32_t const hot = encode ? pairs[i].src : pairs[i].dst;
            int32_t const cold = encode ? pairs[i].dst : pairs[i].src;
            if (hot < 0 || uint64_t(hot) >= group.numSlots)
            {
                return fail("pageIndices[" + std::to_string(i) + "]." + (encode ? "src" : "dst") + " is "
                    + std::to_string(hot) + "; hot slot indices are 0.." + std::to_string(group.numSlots - 1));
            }
            if (cold < 0)
            {
                return fail("pageIndices[" + std::to_string(i) + "]." + (encode ? "dst" : "src") + " is "
                    + std::to_string(cold) + "; cold slot indices must be >= 0");
            }
            maxCold = std::max<int64_t>(maxCold, cold);
        }
        return true;
    }

    HotLayout layout_;
    std::vector<std::vector<uint64_t>> offsets_; // per group, per pool: offset inside the blob
    ConcatParams params_;
    bool configured_ = false;
    bool configureCalled_ = false;
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
            return submit(lc->group, blob, pairs, n, stream, encode);
        }
        catch (std::exception const& e)
        {
            return fail(std::string("transform failed: ") + e.what());
        }
    }
};

// ---------------------------------------------------------------------------------------------
// CPU reference
// ---------------------------------------------------------------------------------------------

class ConcatCodecCpu final : public ConcatCodecBase
{
public:
    using ConcatCodecBase::ConcatCodecBase;

private:
    bool configureBackend() override
    {
        return true;
    }

    PageIndexLocation groupLocation(PoolGroupIndex) const noexcept override
    {
        return PageIndexLocation::kHost;
    }

    bool submit(PoolGroupIndex g, uintptr_t blob, PageIndexPair const* pairs, size_t n, cudaStream_t,
        bool encode) override
    {
        auto const& group = layout_.groups()[g];
        int64_t maxCold = 0;
        if (!checkHostIndices(group, pairs, n, encode, maxCold))
        {
            return false;
        }
        auto const& offs = offsets_[g];
        for (size_t i = 0; i < n; ++i)
        {
            uint64_t const hotIdx = uint64_t(encode ? pairs[i].src : pairs[i].dst);
            uint64_t const coldIdx = uint64_t(encode ? pairs[i].dst : pairs[i].src);
            auto* cold = reinterpret_cast<char*>(blob + coldIdx * group.pageBytes);
            for (size_t p = 0; p < group.pools.size(); ++p)
            {
                auto const& pool = group.pools[p];
                auto* hot = reinterpret_cast<char*>(pool.base + hotIdx * pool.slotBytes);
                if (encode)
                {
                    std::memcpy(cold + offs[p], hot, pool.slotBytes);
                }
                else
                {
                    std::memcpy(hot, cold + offs[p], pool.slotBytes);
                }
            }
        }
        return true;
    }
};

// ---------------------------------------------------------------------------------------------
// CUDA
// ---------------------------------------------------------------------------------------------

// Registration boundaries of host memory: HostMem may register one allocation as adjacent
// regions, and a copy descriptor must not cross one. Boundaries are queried from the driver.
void appendRegistrationBoundaries(uintptr_t begin, uintptr_t end, std::vector<uintptr_t>& out)
{
    auto const& api = runtime::driverApi();
    if (api.pointerGetAttribute == nullptr)
    {
        return;
    }
    uintptr_t addr = begin;
    while (addr < end)
    {
        CUdeviceptr start = 0;
        size_t size = 0;
        if (api.pointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CUdeviceptr(addr)) != CUDA_SUCCESS
            || api.pointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, CUdeviceptr(addr)) != CUDA_SUCCESS
            || size == 0)
        {
            return; // Pageable or foreign memory: the driver stages it as a whole.
        }
        uintptr_t const boundary = uintptr_t(start) + size;
        if (boundary <= addr || boundary >= end)
        {
            return;
        }
        out.push_back(boundary);
        addr = boundary;
    }
}

// Descriptor arrays reused across calls on the same thread, so building a call allocates nothing
// once warm.
struct DescriptorScratch
{
    std::vector<CUdeviceptr> dsts;
    std::vector<CUdeviceptr> srcs;
    std::vector<size_t> sizes;
    std::vector<uint64_t> cuts;
    std::vector<uintptr_t> blobBounds;
};

thread_local DescriptorScratch tScratch;

class ConcatCodecCuda final : public ConcatCodecBase
{
public:
    ConcatCodecCuda(ConcatParams params, int device, int numSms)
        : ConcatCodecBase(params)
        , device_(device)
        , numSms_(numSms)
    {
    }

    ~ConcatCodecCuda() override
    {
        DeviceScope scope(device_);
        for (auto& plan : plans_)
        {
            if (plan.devicePools != nullptr)
            {
                cudaFree(plan.devicePools);
            }
        }
    }

private:
    struct GroupPlan
    {
        bool smPath = false;
        std::vector<std::vector<uintptr_t>> poolBoundaries; // registration boundaries per hot pool
        GatherPool* devicePools = nullptr;
        uint64_t chunksPerPage = 0;
    };

    static constexpr uint64_t kGatherChunkBytes = 16 * 1024;

    bool configureBackend() override
    {
        DeviceScope scope(device_);
        if (!scope.ok())
        {
            return fail("cannot make CUDA device " + std::to_string(device_) + " current");
        }
        if (cudaError_t st = preloadGather(); st != cudaSuccess)
        {
            return fail("loading the gather kernel failed: " + runtime::runtimeErrorText(st));
        }
        plans_.resize(layout_.groups().size());
        for (size_t g = 0; g < plans_.size(); ++g)
        {
            auto const& group = layout_.groups()[g];
            GroupPlan& plan = plans_[g];
            uint64_t smallest = UINT64_MAX;
            for (auto const& pool : group.pools)
            {
                smallest = std::min(smallest, pool.slotBytes);
                std::vector<uintptr_t> bounds;
                appendRegistrationBoundaries(pool.base, pool.base + pool.slotBytes * pool.numSlots, bounds);
                plan.poolBoundaries.push_back(std::move(bounds));
            }
            plan.smPath = params_.path == Path::kSm
                || (params_.path == Path::kAuto && smallest < params_.smPathBelowBytes);
            if (!plan.smPath)
            {
                continue;
            }
            std::vector<GatherPool> table;
            uint64_t chunk = 0;
            for (size_t p = 0; p < group.pools.size(); ++p)
            {
                auto const& pool = group.pools[p];
                table.push_back({pool.base, pool.slotBytes, offsets_[g][p], chunk});
                chunk += (pool.slotBytes + kGatherChunkBytes - 1) / kGatherChunkBytes;
            }
            plan.chunksPerPage = chunk;
            cudaError_t st = cudaMalloc(reinterpret_cast<void**>(&plan.devicePools), table.size() * sizeof(GatherPool));
            if (st == cudaSuccess)
            {
                st = cudaMemcpy(plan.devicePools, table.data(), table.size() * sizeof(GatherPool), cudaMemcpyHostToDevice);
            }
            if (st != cudaSuccess)
            {
                return fail("allocating the SM-path pool table of hot pool group " + std::to_string(g)
                    + " failed: " + runtime::runtimeErrorText(st));
            }
        }
        return true;
    }

    PageIndexLocation groupLocation(PoolGroupIndex g) const noexcept override
    {
        return plans_[g].smPath ? PageIndexLocation::kDevice : PageIndexLocation::kHost;
    }

    bool submit(PoolGroupIndex g, uintptr_t blob, PageIndexPair const* pairs, size_t n, cudaStream_t stream,
        bool encode) override
    {
        if (stream == nullptr || stream == cudaStreamLegacy)
        {
            return fail(std::string(encode ? "encode" : "decode")
                + "(): non-empty calls need a non-legacy CUDA stream (got the legacy/null stream)");
        }
        DeviceScope scope(device_);
        if (!scope.ok())
        {
            return fail("cannot make CUDA device " + std::to_string(device_) + " current");
        }
        auto const& group = layout_.groups()[g];
        GroupPlan const& plan = plans_[g];
        if (plan.smPath)
        {
            GatherArgs args{plan.devicePools, uint32_t(group.pools.size()), encode ? 1u : 0u, kGatherChunkBytes,
                plan.chunksPerPage, group.pageBytes, group.numSlots, pairs, n, blob};
            cudaError_t st = launchGather(args, numSms_, stream);
            return st == cudaSuccess ? true : fail("gather kernel launch failed: " + runtime::runtimeErrorText(st));
        }
        return submitCopyEngine(g, blob, pairs, n, stream, encode);
    }

    bool submitCopyEngine(PoolGroupIndex g, uintptr_t blob, PageIndexPair const* pairs, size_t n,
        cudaStream_t stream, bool encode)
    {
        auto const& group = layout_.groups()[g];
        GroupPlan const& plan = plans_[g];
        int64_t maxCold = 0;
        if (!checkHostIndices(group, pairs, n, encode, maxCold))
        {
            return false;
        }
        // Queried on every call: the cold base may be reallocated between calls.
        std::vector<uintptr_t>& blobBounds = tScratch.blobBounds;
        blobBounds.clear();
        appendRegistrationBoundaries(blob, blob + uint64_t(maxCold + 1) * group.pageBytes, blobBounds);

        auto& dsts = tScratch.dsts;
        auto& srcs = tScratch.srcs;
        auto& sizes = tScratch.sizes;
        size_t const numPools = group.pools.size();
        dsts.resize(n * numPools);
        srcs.resize(n * numPools);
        sizes.resize(n * numPools);
        bool anyBounds = !blobBounds.empty();
        for (auto const& b : plan.poolBoundaries)
        {
            anyBounds = anyBounds || !b.empty();
        }
        uint64_t const* offs = offsets_[g].data();
        size_t k = 0;
        if (!anyBounds)
        {
            for (size_t i = 0; i < n; ++i)
            {
                uint64_t const hotIdx = uint64_t(encode ? pairs[i].src : pairs[i].dst);
                uintptr_t const cold = blob + uint64_t(encode ? pairs[i].dst : pairs[i].src) * group.pageBytes;
                for (size_t p = 0; p < numPools; ++p, ++k)
                {
                    auto const& pool = group.pools[p];
                    uintptr_t const hot = pool.base + hotIdx * pool.slotBytes;
                    srcs[k] = encode ? hot : cold + offs[p];
                    dsts[k] = encode ? cold + offs[p] : hot;
                    sizes[k] = pool.slotBytes;
                }
            }
        }
        else
        {
            for (size_t i = 0; i < n; ++i)
            {
                uint64_t const hotIdx = uint64_t(encode ? pairs[i].src : pairs[i].dst);
                uintptr_t const cold = blob + uint64_t(encode ? pairs[i].dst : pairs[i].src) * group.pageBytes;
                for (size_t p = 0; p < numPools; ++p)
                {
                    auto const& pool = group.pools[p];
                    appendSplit({pool.base + hotIdx * pool.slotBytes, cold + offs[p], pool.slotBytes},
                        plan.poolBoundaries[p], blobBounds, encode, k);
                }
            }
        }
        return submitDescriptors(k, stream);
    }

    // Appends a piece, cut at every registration boundary inside it on either side.
    void appendSplit(Piece piece, std::vector<uintptr_t> const& hotBounds, std::vector<uintptr_t> const& coldBounds,
        bool encode, size_t& k)
    {
        auto& cuts = tScratch.cuts;
        auto& dsts = tScratch.dsts;
        auto& srcs = tScratch.srcs;
        auto& sizes = tScratch.sizes;
        cuts.clear();
        for (uintptr_t b : hotBounds)
        {
            if (b > piece.hot && b < piece.hot + piece.bytes) cuts.push_back(b - piece.hot);
        }
        for (uintptr_t b : coldBounds)
        {
            if (b > piece.cold && b < piece.cold + piece.bytes) cuts.push_back(b - piece.cold);
        }
        std::sort(cuts.begin(), cuts.end());
        cuts.push_back(piece.bytes);
        uint64_t from = 0;
        for (uint64_t to : cuts)
        {
            if (to == from)
            {
                continue;
            }
            if (k >= sizes.size())
            {
                dsts.resize(k + 1);
                srcs.resize(k + 1);
                sizes.resize(k + 1);
            }
            srcs[k] = encode ? piece.hot + from : piece.cold + from;
            dsts[k] = encode ? piece.cold + from : piece.hot + from;
            sizes[k] = to - from;
            ++k;
            from = to;
        }
    }

    bool submitDescriptors(size_t count, cudaStream_t stream)
    {
        auto& dsts = tScratch.dsts;
        auto& srcs = tScratch.srcs;
        auto& sizes = tScratch.sizes;
        auto const& api = runtime::driverApi();
        auto const cuStream = reinterpret_cast<CUstream>(stream);
        bool const useBatch = params_.copyApi != CopyApi::kPerCopy && api.hasMemcpyBatch();
        if (useBatch)
        {
            CUmemcpyAttributes attr{};
            attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
            attr.flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
            size_t attrIndex = 0;
            CUresult r;
            size_t failIdx = SIZE_MAX;
            if (api.memcpyBatchAsyncV13 != nullptr)
            {
                r = api.memcpyBatchAsyncV13(dsts.data(), srcs.data(), sizes.data(), count, &attr, &attrIndex, 1, cuStream);
            }
            else
            {
                r = api.memcpyBatchAsyncV12(
                    dsts.data(), srcs.data(), sizes.data(), count, &attr, &attrIndex, 1, &failIdx, cuStream);
            }
            if (r != CUDA_SUCCESS)
            {
                return fail("cuMemcpyBatchAsync of " + std::to_string(count) + " descriptors failed"
                    + (failIdx != SIZE_MAX ? " at descriptor " + std::to_string(failIdx) : std::string()) + ": "
                    + runtime::driverErrorText(r));
            }
            return true;
        }
        if (api.memcpyAsync == nullptr)
        {
            return fail("the CUDA driver provides neither cuMemcpyBatchAsync nor cuMemcpyAsync");
        }
        for (size_t k = 0; k < count; ++k)
        {
            CUresult r = api.memcpyAsync(dsts[k], srcs[k], sizes[k], cuStream);
            if (r != CUDA_SUCCESS)
            {
                return fail("cuMemcpyAsync of descriptor " + std::to_string(k) + " of " + std::to_string(count)
                    + " failed: " + runtime::driverErrorText(r));
            }
        }
        return true;
    }

    int device_;
    int numSms_;
    std::vector<GroupPlan> plans_;
};

IKvCacheColdPageCodec* createConcat(char const* paramsJson, int32_t device, char* errorMessage, size_t errorCapacity)
{
    try
    {
        ConcatParams params;
        std::string error;
        if (!parseParams(paramsJson, params, error))
        {
            writeFactoryError(errorMessage, errorCapacity, error.c_str());
            return nullptr;
        }
        if (device == KVCODEC_DEVICE_CPU)
        {
            return new ConcatCodecCpu(params);
        }
        if (device < 0)
        {
            writeFactoryError(errorMessage, errorCapacity,
                ("device is " + std::to_string(device) + "; use -1 for the CPU reference or a CUDA device ordinal").c_str());
            return nullptr;
        }
        int count = 0;
        cudaError_t st = cudaGetDeviceCount(&count);
        if (st != cudaSuccess || device >= count)
        {
            cudaGetLastError();
            writeFactoryError(errorMessage, errorCapacity,
                ("CUDA device " + std::to_string(device) + " is not available ("
                    + (st == cudaSuccess ? std::to_string(count) + " devices" : runtime::runtimeErrorText(st)) + ")")
                    .c_str());
            return nullptr;
        }
        if (params.copyApi == CopyApi::kBatch && !runtime::driverApi().hasMemcpyBatch())
        {
            writeFactoryError(errorMessage, errorCapacity,
                ("concat parameter copy_api='batch' needs cuMemcpyBatchAsync (CUDA 12.8+), but the driver reports version "
                    + std::to_string(runtime::driverApi().driverVersion))
                    .c_str());
            return nullptr;
        }
        int numSms = 0;
        {
            DeviceScope scope(device);
            cudaFree(nullptr); // Creates the primary context so driver queries work.
            cudaDeviceGetAttribute(&numSms, cudaDevAttrMultiProcessorCount, device);
        }
        return new ConcatCodecCuda(params, device, numSms);
    }
    catch (std::exception const& e)
    {
        writeFactoryError(errorMessage, errorCapacity, e.what());
        return nullptr;
    }
}

void destroyConcat(IKvCacheColdPageCodec* codec)
{
    delete codec;
}

KvcodecCodecFactory const kFactory{
    KVCODEC_PLUGIN_ABI_VERSION, sizeof(KvcodecCodecFactory), "concat", kConcatFormatVersion, 0, &createConcat, &destroyConcat};

} // namespace

KvcodecCodecFactory const* concatCodecFactory() noexcept
{
    return &kFactory;
}

std::unique_ptr<IKvCacheColdPageCodec> createDefaultKvCacheColdPageCodec(int32_t device)
{
    char error[512] = {};
    IKvCacheColdPageCodec* codec = createConcat("{}", device, error, sizeof(error));
    if (codec == nullptr)
    {
        throw std::runtime_error(error);
    }
    return std::unique_ptr<IKvCacheColdPageCodec>(codec);
}

} // namespace kvcodec::concat

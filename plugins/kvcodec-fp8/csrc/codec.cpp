// SPDX-License-Identifier: Apache-2.0
//
// The fp8 codec: a shared base (layout, blob plans, queries, argument checks), the CPU
// reference and the CUDA implementation of blob format 1 (see format.h).
#include "codec.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu.h"
#include "format.h"
#include "kernel.h"
#include "plan.h"
#include "kvcodec/device_scope.h"
#include "kvcodec/layout.h"

namespace kvcodec::fp8 {
namespace {

class Fp8CodecBase : public IKvCacheColdPageCodec
{
public:
    explicit Fp8CodecBase(Fp8Params params)
        : params_(std::move(params))
    {
    }

    bool configure(PoolGroupDesc const* gpuDescs, PoolGroupIndex numGpuDescs) noexcept override
    {
        try
        {
            if (configured_)
            {
                return fail("configure() was already called; a codec is configured exactly once");
            }
            std::string err = layout_.load(gpuDescs, numGpuDescs);
            if (!err.empty())
            {
                return fail(err);
            }
            plans_.clear();
            representative_.clear();
            for (auto const& lc : layout_.lifeCycles())
            {
                LifeCyclePlan plan;
                err = planLifeCycle(layout_, lc, params_, plan, tileBudgetBytes());
                if (!err.empty())
                {
                    return fail(err);
                }
                for (auto const& b : plan.buffers)
                {
                    if (b.quantized && b.elems > uint64_t(INT32_MAX))
                    {
                        return fail("lifecycle " + std::to_string(lc.id) + " has a quantized buffer of "
                            + std::to_string(b.elems) + " elements; at most 2^31 - 1 are supported");
                    }
                }
                plans_[lc.id] = std::move(plan);
            }
            // Batching representative: the smallest lifecycle of the same hot pool group with an
            // identical buffer list (parameters are codec-wide).
            for (auto const& lc : layout_.lifeCycles())
            {
                LifeCycleId best = lc.id;
                for (LifeCycleId other : layout_.groups()[lc.group].lifeCycles)
                {
                    if (other < best && sameBuffers(layout_.find(other)->buffers, lc.buffers))
                    {
                        best = other;
                    }
                }
                representative_[lc.id] = best;
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
        auto const* plan = find(id);
        return plan ? plan->coldPageBytes : 0;
    }

    LayerGroupId getBatchingLayerGroupId(LayerGroupId id) const noexcept override
    {
        auto it = configured_ ? representative_.find(id) : representative_.end();
        return it == representative_.end() ? -1 : it->second;
    }

    PageIndexLocation queryPageIndexLocation(LayerGroupId id) const noexcept override
    {
        return find(id) ? location() : PageIndexLocation::kBadLocation;
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
    virtual bool configureBackend() = 0;
    /// Shared memory a tile of the tile variant may use (the CPU reference plans with the
    /// default; its blobs do not depend on it).
    virtual uint64_t tileBudgetBytes() const noexcept
    {
        return kDefaultTileBudget;
    }
    virtual PageIndexLocation location() const noexcept = 0;
    virtual bool submit(HotLayout::LifeCycle const& lc, LifeCyclePlan const& plan, uintptr_t blob,
        PageIndexPair const* pairs, size_t n, cudaStream_t stream, bool encode)
        = 0;

    LifeCyclePlan const* find(LayerGroupId id) const noexcept
    {
        if (!configured_)
        {
            return nullptr;
        }
        auto it = plans_.find(id);
        return it == plans_.end() ? nullptr : &it->second;
    }

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
    Fp8Params params_;
    std::unordered_map<LifeCycleId, LifeCyclePlan> plans_;
    std::unordered_map<LifeCycleId, LifeCycleId> representative_;
    bool configured_ = false;
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
            return submit(*lc, plans_.at(id), blob, pairs, n, stream, encode);
        }
        catch (std::exception const& e)
        {
            return fail(std::string("transform failed: ") + e.what());
        }
    }
};

// ---------------------------------------------------------------------------------------------
// CPU reference (the kernels are in cpu.cpp)
// ---------------------------------------------------------------------------------------------

class Fp8CodecCpu final : public Fp8CodecBase
{
public:
    using Fp8CodecBase::Fp8CodecBase;

private:
    bool configureBackend() override
    {
        return true;
    }

    PageIndexLocation location() const noexcept override
    {
        return PageIndexLocation::kHost;
    }

    bool submit(HotLayout::LifeCycle const& lc, LifeCyclePlan const& plan, uintptr_t blob, PageIndexPair const* pairs,
        size_t n, cudaStream_t, bool encode) override
    {
        auto const& group = layout_.groups()[lc.group];
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
        }
        cpu::IeeeScope ieee;
        cpu::Simd const simd = cpu::activeSimd();
        for (size_t i = 0; i < n; ++i)
        {
            uint64_t const hotIdx = uint64_t(encode ? pairs[i].src : pairs[i].dst);
            uint64_t const coldIdx = uint64_t(encode ? pairs[i].dst : pairs[i].src);
            char* page = reinterpret_cast<char*>(blob + coldIdx * plan.coldPageBytes);
            for (auto const& b : plan.buffers)
            {
                char* hot = reinterpret_cast<char*>(b.poolBase + hotIdx * b.slotBytes + b.hotOffset);
                if (encode)
                {
                    cpu::encodeBuffer(b, hot, page, params_.format, simd);
                }
                else
                {
                    cpu::decodeBuffer(b, hot, page, params_.format, simd);
                }
            }
        }
        return true;
    }
};

// ---------------------------------------------------------------------------------------------
// CUDA
// ---------------------------------------------------------------------------------------------

std::string cudaText(cudaError_t st)
{
    return std::string(cudaGetErrorName(st)) + " (" + cudaGetErrorString(st) + ")";
}

class Fp8CodecCuda final : public Fp8CodecBase
{
public:
    Fp8CodecCuda(Fp8Params params, int device, int numSms, uint64_t tileBudget)
        : Fp8CodecBase(std::move(params))
        , device_(device)
        , numSms_(numSms)
        , tileBudget_(tileBudget)
    {
    }

    ~Fp8CodecCuda() override
    {
        DeviceScope scope(device_);
        for (BufferPlan* table : owned_)
        {
            cudaFree(table);
        }
    }

private:
    // One kernel variant's launch of a lifecycle: its plan's device buffer table and, for the
    // tile variant, the dynamic shared memory and resident thread blocks per direction.
    struct Launch
    {
        uint32_t variant = 0;
        BufferPlan* table = nullptr;
        uint32_t numBuffers = 0;
        uint64_t unitsPerPage = 0;
        uint32_t smem[2] = {0, 0};     ///< [decode, encode]
        uint32_t resident[2] = {1, 1};
    };

    struct LifeCycleLaunches
    {
        Launch base;               ///< params_.kernel (kernel=auto: b4)
        std::optional<Launch> tile; ///< kernel=auto: tile, when it tiles every quantized buffer
    };

    bool configureBackend() override
    {
        DeviceScope scope(device_);
        if (!scope.ok())
        {
            return fail("cannot make CUDA device " + std::to_string(device_) + " current");
        }
        if (cudaError_t st = preloadFp8(); st != cudaSuccess)
        {
            return fail(std::string("loading the fp8 kernel failed: ") + cudaGetErrorString(st));
        }
        for (auto const& lc : layout_.lifeCycles())
        {
            LifeCyclePlan const& plan = plans_.at(lc.id);
            LifeCycleLaunches& launches = launches_[lc.id];
            std::string err = prepare(lc.id, plan, params_.kernel, launches.base);
            if (err.empty() && params_.autoKernel)
            {
                // kernel=auto: the tile variant's plan next to b4's, used per call when it tiles
                // every quantized buffer (an untiled one would run warp code one CTA at a time);
                // a lifecycle the tile plan cannot take keeps b4.
                Fp8Params tileParams = params_;
                tileParams.kernel = kTileVariant;
                LifeCyclePlan tilePlan;
                bool const usable = planLifeCycle(layout_, lc, tileParams, tilePlan, tileBudget_).empty()
                    && tilePlan.coldPageBytes == plan.coldPageBytes
                    && std::all_of(tilePlan.buffers.begin(), tilePlan.buffers.end(),
                        [](BufferPlan const& b) { return !b.quantized || b.tileBlocks > 0; });
                if (usable)
                {
                    err = prepare(lc.id, tilePlan, kTileVariant, launches.tile.emplace());
                }
            }
            if (!err.empty())
            {
                return fail(err);
            }
        }
        return true;
    }

    // Copies a plan's buffer table to the device and, for the tile variant, sets its kernels'
    // shared memory.
    std::string prepare(LifeCycleId id, LifeCyclePlan const& plan, uint32_t variant, Launch& launch)
    {
        launch.variant = variant;
        launch.numBuffers = uint32_t(plan.buffers.size());
        launch.unitsPerPage = plan.unitsPerPage;
        size_t const bytes = plan.buffers.size() * sizeof(BufferPlan);
        cudaError_t st = cudaMalloc(reinterpret_cast<void**>(&launch.table), bytes);
        if (st != cudaSuccess)
        {
            launch.table = nullptr;
            return "allocating the buffer table of lifecycle " + std::to_string(id) + " failed: " + cudaText(st);
        }
        owned_.push_back(launch.table);
        st = cudaMemcpy(launch.table, plan.buffers.data(), bytes, cudaMemcpyHostToDevice);
        if (st != cudaSuccess)
        {
            return "copying the buffer table of lifecycle " + std::to_string(id) + " failed: " + cudaText(st);
        }
        if (!kKernelVariants[variant].tiled)
        {
            return {};
        }
        launch.smem[0] = uint32_t(plan.tileDecodeSmem);
        launch.smem[1] = uint32_t(plan.tileEncodeSmem);
        for (int enc = 0; enc < 2; ++enc)
        {
            int resident = 0;
            st = prepareTileKernel(enc == 1, tileBudget_, launch.smem[enc], &resident);
            if (st != cudaSuccess)
            {
                return "preparing the tile kernel for lifecycle " + std::to_string(id) + " ("
                    + std::to_string(launch.smem[enc]) + " bytes of shared memory) failed: " + cudaText(st);
            }
            launch.resident[enc] = uint32_t(std::max(resident, 1));
        }
        return {};
    }

    uint64_t tileBudgetBytes() const noexcept override
    {
        return tileBudget_;
    }

    PageIndexLocation location() const noexcept override
    {
        return PageIndexLocation::kDevice;
    }

    bool submit(HotLayout::LifeCycle const& lc, LifeCyclePlan const& plan, uintptr_t blob, PageIndexPair const* pairs,
        size_t n, cudaStream_t stream, bool encode) override
    {
        if (stream == nullptr || stream == cudaStreamLegacy)
        {
            return fail(std::string(encode ? "encode" : "decode")
                + "(): non-empty calls need a non-legacy CUDA stream (got the legacy/null stream)");
        }
        if (reinterpret_cast<uintptr_t>(pairs) % alignof(PageIndexPair) != 0)
        {
            return fail("pageIndices is not 8-byte aligned");
        }
        DeviceScope scope(device_);
        if (!scope.ok())
        {
            return fail("cannot make CUDA device " + std::to_string(device_) + " current");
        }
        // kernel=auto: tile for decodes and for encodes into host memory, b4 otherwise.
        LifeCycleLaunches const& launches = launches_.at(lc.id);
        bool const useTile = launches.tile && (!encode || !isDeviceMemory(reinterpret_cast<void const*>(blob)));
        Launch const& l = useTile ? *launches.tile : launches.base;
        KernelArgs args{};
        args.buffers = l.table;
        args.numBuffers = l.numBuffers;
        args.encode = encode ? 1 : 0;
        args.format = uint32_t(params_.format);
        args.scalarOnly = (blob % kRegionAlign) != 0 ? 1 : 0;
        args.variant = l.variant;
        args.blockFinite = params_.blockFinite ? 1 : 0;
        args.unitsPerPage = l.unitsPerPage;
        args.coldPageBytes = plan.coldPageBytes;
        args.numHotSlots = layout_.groups()[lc.group].numSlots;
        args.pairs = pairs;
        args.numPairs = n;
        args.blob = blob;
        args.tileSmem = l.smem[encode ? 1 : 0];
        args.tileResident = l.resident[encode ? 1 : 0];
        cudaError_t const st = launchFp8(args, numSms_, stream);
        return st == cudaSuccess ? true : fail("fp8 kernel launch failed: " + cudaText(st));
    }

    int device_;
    int numSms_;
    uint64_t tileBudget_;
    std::vector<BufferPlan*> owned_;
    std::unordered_map<LifeCycleId, LifeCycleLaunches> launches_;
};

IKvCacheColdPageCodec* createFp8(char const* paramsJson, int32_t device, char* errorMessage, size_t errorCapacity)
{
    try
    {
        Fp8Params params;
        std::string error;
        if (!parseFp8Params(paramsJson, params, error))
        {
            writeFactoryError(errorMessage, errorCapacity, error.c_str());
            return nullptr;
        }
        if (device == KVCODEC_DEVICE_CPU)
        {
            return new Fp8CodecCpu(std::move(params));
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
                    + (st == cudaSuccess ? std::to_string(count) + " devices" : cudaText(st)) + ")")
                    .c_str());
            return nullptr;
        }
        int numSms = 0, perSm = 0, optin = 0, reserved = 0;
        cudaDeviceGetAttribute(&numSms, cudaDevAttrMultiProcessorCount, device);
        cudaDeviceGetAttribute(&perSm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
        cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device);
        uint64_t const budget = tileBudget(uint64_t(std::max(perSm, 0)), uint64_t(std::max(optin, 0)),
            uint64_t(std::max(reserved, 0)));
        return new Fp8CodecCuda(std::move(params), device, numSms, budget);
    }
    catch (std::exception const& e)
    {
        writeFactoryError(errorMessage, errorCapacity, e.what());
        return nullptr;
    }
}

void destroyFp8(IKvCacheColdPageCodec* codec)
{
    delete codec;
}

KvcodecCodecFactory const kFactory{
    KVCODEC_PLUGIN_ABI_VERSION, sizeof(KvcodecCodecFactory), "fp8", kFormatVersion, 0, &createFp8, &destroyFp8};

} // namespace

KvcodecCodecFactory const* fp8CodecFactory() noexcept
{
    return &kFactory;
}

} // namespace kvcodec::fp8

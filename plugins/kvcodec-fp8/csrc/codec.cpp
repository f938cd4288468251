// SPDX-License-Identifier: Apache-2.0
//
// The fp8 codec: its parameters, the codec (CPU reference and CUDA implementation of blob format
// 1, see format.h) and its factory. kvcodec::CodecBase (kvcodec/codec_base.h) does everything
// around them: configure-once, layout validation, errors, queries, argument and host index
// checks, the CUDA device and stream rules.
#include "codec.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <kvcodec/codec_base.h>

#include "cpu.h"
#include "format.h"
#include "kernel.h"
#include "plan.h"

namespace kvcodec::fp8 {
namespace {

// Reads the string parameter `key` as the index of one of `names` into `index` when present.
// A value of any other type or text is refused with the valid texts listed.
void readChoice(ParamReader& r, char const* key, std::vector<std::string> const& names, size_t& index)
{
    std::string valid;
    for (auto const& name : names)
    {
        valid += (valid.empty() ? "'" : ", '") + name + "'";
    }
    std::string text;
    try
    {
        r.read(key, text);
    }
    catch (ParamError const&)
    {
        r.refuse(key, "valid values are " + valid); // not a string: still say what is valid
    }
    if (!r.has(key))
    {
        return;
    }
    auto const it = std::find(names.begin(), names.end(), text);
    if (it == names.end())
    {
        r.refuse(key, "valid values are " + valid);
    }
    index = size_t(it - names.begin());
}

} // namespace

void Fp8Params::read(ParamReader& r)
{
    size_t i = size_t(format);
    readChoice(r, "format", {"e4m3", "e5m2"}, i);
    format = Format(i);
    i = size_t(granularity);
    readChoice(r, "granularity", {"page_head", "token_head", "page"}, i);
    granularity = Granularity(i);
    readLossless(r);
    std::vector<std::string> kernels{"auto"}; // then kKernelVariants in order
    for (auto const& v : kKernelVariants)
    {
        kernels.emplace_back(v.name);
    }
    i = autoKernel ? 0 : kernel + 1;
    readChoice(r, "kernel", kernels, i);
    autoKernel = i == 0;
    kernel = autoKernel ? kAutoBaseVariant : uint32_t(i - 1);
    i = deepSmallBlocks ? 1 : 0;
    readChoice(r, "small_blocks", {"wide", "deep"}, i);
    deepSmallBlocks = i == 1;
    i = blockFinite ? 1 : 0;
    readChoice(r, "finite_check", {"element", "block"}, i);
    blockFinite = i == 1;
    if (!kKernelVariants[kernel].tunable && (deepSmallBlocks || blockFinite))
    {
        throw ParamError(std::string("fp8 parameters small_blocks='") + (deepSmallBlocks ? "deep" : "wide")
            + "' and finite_check='" + (blockFinite ? "block" : "element") + "' need a tunable kernel; 'kernel' is '"
            + kKernelVariants[kernel].name
            + "' (use 'auto', 'b2', 'b4' or 'tile', or small_blocks='wide' and finite_check='element')");
    }
}

namespace {

static_assert(uint32_t(Format::kE4M3) == 0 && uint32_t(Format::kE5M2) == 1, "readChoice order of 'format'");
static_assert(uint32_t(Granularity::kPageHead) == 0 && uint32_t(Granularity::kTokenHead) == 1
        && uint32_t(Granularity::kPage) == 2,
    "readChoice order of 'granularity'");

// The tile budget of a CUDA device (tileBudget() of its shared memory limits).
uint64_t deviceTileBudget(int device) noexcept
{
    int perSm = 0, optin = 0, reserved = 0;
    cudaDeviceGetAttribute(&perSm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device);
    return tileBudget(uint64_t(std::max(perSm, 0)), uint64_t(std::max(optin, 0)), uint64_t(std::max(reserved, 0)));
}

// One class for both implementations: the CPU reference (device() == KVCODEC_DEVICE_CPU: host
// pointers, synchronous, stream ignored; the kernels are in cpu.cpp) and the CUDA one (one
// kernel launch per call, kernel*.cu).
class Fp8Codec final : public PlannedCodec<Fp8Params, LifeCyclePlan>
{
public:
    // What makeCodecFactory<Fp8Codec>() needs besides Params: the registry name, the format version.
    static constexpr char const* kName = "fp8";
    static constexpr uint32_t kFormatVersion = fp8::kFormatVersion;

    explicit Fp8Codec(Params const& params, CudaDevice cuda = {KVCODEC_DEVICE_CPU, 0})
        : PlannedCodec(params, cuda)
        // The CPU reference plans with the default budget; its blobs do not depend on it.
        , tileBudget_(cuda.ordinal == KVCODEC_DEVICE_CPU ? kDefaultTileBudget : deviceTileBudget(cuda.ordinal))
    {
    }

private:
    // One kernel variant's launch of a lifecycle: its plan's device buffer table and, for the
    // tile variant, the dynamic shared memory and resident thread blocks per direction.
    struct Launch
    {
        uint32_t variant = 0;
        DeviceArray<BufferPlan> table;
        uint64_t unitsPerPage = 0;
        uint32_t smem[2] = {0, 0}; ///< [decode, encode]
        uint32_t resident[2] = {1, 1};
    };

    struct LifeCycleLaunches
    {
        Launch base;                ///< params_.kernel (kernel=auto: b4)
        std::optional<Launch> tile; ///< kernel=auto: tile, when it tiles every quantized buffer
    };

    bool plan(HotLayout const& layout) override
    {
        for (auto const& lc : layout.lifeCycles())
        {
            LifeCyclePlan plan;
            std::string err = planLifeCycle(layout, lc, params_, plan, tileBudget_);
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
        return isCpu() || planCuda(layout);
    }

    bool planCuda(HotLayout const& layout)
    {
        if (!cudaCheck(preloadFp8(), "loading the fp8 kernel"))
        {
            return false;
        }
        for (auto const& lc : layout.lifeCycles())
        {
            LifeCyclePlan const& plan = plans_.at(lc.id);
            LifeCycleLaunches& launches = launches_[lc.id];
            if (!prepare(lc.id, plan, params_.kernel, launches.base))
            {
                return false;
            }
            if (params_.autoKernel)
            {
                // kernel=auto: the tile variant's plan next to b4's, used per call when it tiles
                // every quantized buffer (an untiled one would run warp code one CTA at a time);
                // a lifecycle the tile plan cannot take keeps b4.
                Fp8Params tileParams = params_;
                tileParams.kernel = kTileVariant;
                LifeCyclePlan tilePlan;
                bool const usable = planLifeCycle(layout, lc, tileParams, tilePlan, tileBudget_).empty()
                    && tilePlan.coldPageBytes == plan.coldPageBytes
                    && std::all_of(tilePlan.buffers.begin(), tilePlan.buffers.end(),
                        [](BufferPlan const& b) { return !b.quantized || b.tileBlocks > 0; });
                if (usable && !prepare(lc.id, tilePlan, kTileVariant, launches.tile.emplace()))
                {
                    return false;
                }
            }
        }
        return true;
    }

    // Copies a plan's buffer table to the device and, for the tile variant, sets its kernels'
    // shared memory.
    bool prepare(LifeCycleId id, LifeCyclePlan const& plan, uint32_t variant, Launch& launch)
    {
        launch.variant = variant;
        launch.unitsPerPage = plan.unitsPerPage;
        if (!cudaCheck(
                launch.table.upload(plan.buffers), "uploading the buffer table of lifecycle " + std::to_string(id)))
        {
            return false;
        }
        if (!kKernelVariants[variant].tiled)
        {
            return true;
        }
        launch.smem[0] = uint32_t(plan.tileDecodeSmem);
        launch.smem[1] = uint32_t(plan.tileEncodeSmem);
        for (int enc = 0; enc < 2; ++enc)
        {
            int resident = 0;
            if (!cudaCheck(prepareTileKernel(enc == 1, tileBudget_, launch.smem[enc], &resident),
                    "preparing the tile kernel for lifecycle " + std::to_string(id) + " ("
                        + std::to_string(launch.smem[enc]) + " bytes of shared memory)"))
            {
                return false;
            }
            launch.resident[enc] = uint32_t(std::max(resident, 1));
        }
        return true;
    }

    bool submitCpu(CodecCall const& call) override
    {
        LifeCyclePlan const& plan = plans_.at(call.lifeCycle.id); // in CodecBase's IeeeScope
        cpu::Simd const simd = cpu::activeSimd();
        for (size_t i = 0; i < call.numPages; ++i)
        {
            uint64_t const hotIdx = uint64_t(call.hot(i));
            char* page = reinterpret_cast<char*>(call.coldBase + uint64_t(call.cold(i)) * plan.coldPageBytes);
            for (auto const& b : plan.buffers)
            {
                char* hot = reinterpret_cast<char*>(b.poolBase + hotIdx * b.slotBytes + b.hotOffset);
                if (call.encoding)
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

    bool submitCuda(CodecCall const& call) override
    {
        if (reinterpret_cast<uintptr_t>(call.pages) % alignof(PageIndexPair) != 0)
        {
            return fail("pageIndices is not 8-byte aligned");
        }
        // kernel=auto: tile for decodes and for encodes into host memory, b4 otherwise.
        LifeCycleLaunches const& launches = launches_.at(call.lifeCycle.id);
        bool const useTile
            = launches.tile && (!call.encoding || !isDeviceMemory(reinterpret_cast<void const*>(call.coldBase)));
        Launch const& l = useTile ? *launches.tile : launches.base;
        KernelArgs args{};
        args.buffers = l.table.get();
        args.numBuffers = uint32_t(l.table.size());
        args.encode = call.encoding ? 1 : 0;
        args.format = uint32_t(params_.format);
        args.scalarOnly = (call.coldBase % kRegionAlign) != 0 ? 1 : 0;
        args.variant = l.variant;
        args.blockFinite = params_.blockFinite ? 1 : 0;
        args.unitsPerPage = l.unitsPerPage;
        args.coldPageBytes = plans_.at(call.lifeCycle.id).coldPageBytes;
        args.numHotSlots = call.group.numSlots;
        args.pairs = call.pages;
        args.numPairs = call.numPages;
        args.blob = call.coldBase;
        args.tileSmem = l.smem[call.encoding ? 1 : 0];
        args.tileResident = l.resident[call.encoding ? 1 : 0];
        return cudaCheck(launchFp8(args, numSms_, call.stream), "fp8 kernel launch");
    }

    uint64_t tileBudget_;
    std::unordered_map<LifeCycleId, LifeCycleLaunches> launches_;
};

KvcodecCodecFactory const kFactory = makeCodecFactory<Fp8Codec>();

} // namespace

KvcodecCodecFactory const* codecFactory() noexcept
{
    return &kFactory;
}

} // namespace kvcodec::fp8

// SPDX-License-Identifier: Apache-2.0
//
// nvfp4: the parameters, the codec (CPU reference and CUDA) and the factory. The blob format is
// described in codec.h, its arithmetic in format.h, the plan and the CPU page routines in
// plan.cpp. kvcodec::CodecBase (kvcodec/codec_base.h) does everything around them:
// configure-once, layout validation, errors, queries, argument and host index checks, the CUDA
// device and stream rules.
#include "codec.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include <kvcodec/codec_base.h>

namespace nvfp4_codec {

// Types, defaults and choices are validated by the Python spec (plugin.py): one schema. The list
// contents are checked here too, so a native caller gets the same refusals.
void Params::read(kvcodec::ParamReader& r)
{
    r.choice("granularity", granularity, {{"page_head", Granularity::kPageHead}, {"page", Granularity::kPage}});
    readLossless(r);
}

namespace {

using kvcodec::CodecCall;
using kvcodec::HotLayout;
using kvcodec::LayerGroupId;

// One class for both implementations: the CPU reference (device() == KVCODEC_DEVICE_CPU: host
// pointers, synchronous, stream ignored) and the CUDA one (one kernel launch per call).
class Codec final : public kvcodec::PlannedCodec<Params, LifeCyclePlan>
{
public:
    // What makeCodecFactory<Codec>() needs besides Params: the registry name, the format version.
    static constexpr char const* kName = "nvfp4";
    static constexpr uint32_t kFormatVersion = ::nvfp4_codec::kFormatVersion;
    using PlannedCodec::PlannedCodec;

private:
    bool plan(HotLayout const& layout) override
    {
        for (auto const& lc : layout.lifeCycles())
        {
            LifeCyclePlan plan;
            std::string const err = planLifeCycle(layout, lc, params_, plan);
            if (!err.empty())
            {
                return fail(err);
            }
            if (!isCpu()
                && !cudaCheck(tables_[lc.id].upload(plan.buffers),
                    "uploading the buffer table of lifecycle " + std::to_string(lc.id)))
            {
                return false;
            }
            if (!isCpu() && !plan.warpBuffers.empty()
                && !cudaCheck(warpTables_[lc.id].upload(plan.warpBuffers),
                    "uploading the warp table of lifecycle " + std::to_string(lc.id)))
            {
                return false;
            }
            if (!isCpu() && plan.staged.hotBytes > 0)
            {
                plan.staged.stages = stagedStages();
                if (!cudaCheck(stagedOccupancy(plan.staged.sharedBytes(), plan.stagedBlocksPerSm),
                        "sizing the nvfp4 staged encoder"))
                {
                    return false;
                }
            }
            plans_[lc.id] = std::move(plan);
        }
        return isCpu() || cudaCheck(preloadKernel(), "loading the nvfp4 kernel");
    }

    bool submitCpu(CodecCall const& call) override
    {
        LifeCyclePlan const& plan = plans_.at(call.lifeCycle.id);
        for (size_t i = 0; i < call.numPages; ++i)
        {
            auto* blob = reinterpret_cast<uint8_t*>(call.coldBase + uint64_t(call.cold(i)) * plan.coldPageBytes);
            if (call.encoding)
            {
                encodePageCpu(plan, uint64_t(call.hot(i)), blob);
            }
            else
            {
                decodePageCpu(plan, uint64_t(call.hot(i)), blob);
            }
        }
        return true;
    }

    bool submitCuda(CodecCall const& call) override
    {
        if (reinterpret_cast<uintptr_t>(call.pages) % alignof(kvcodec::PageIndexPair) != 0)
        {
            return fail("pageIndices is not 8-byte aligned");
        }
        LifeCyclePlan const& plan = plans_.at(call.lifeCycle.id);
        auto const& table = tables_.at(call.lifeCycle.id);
        KernelArgs args{};
        args.buffers = table.get();
        args.numBuffers = uint32_t(table.size());
        args.encode = call.encoding ? 1 : 0;
        args.itemsPerPage = plan.itemsPerPage;
        args.coldPageBytes = plan.coldPageBytes;
        args.numHotSlots = call.group.numSlots;
        args.numPairs = call.numPages;
        args.blob = call.coldBase;
        args.pairs = call.pages;
        args.staged = plan.staged;
        args.stagedBlocksPerSm = plan.stagedBlocksPerSm;
        // The warp kernels store codes and scales as words: only 16-byte aligned blobs (pages of
        // a blob array are a multiple of 16 bytes apart); others keep the byte-wise paths.
        if (!plan.warpBuffers.empty() && call.coldBase % 16 == 0)
        {
            bool onDevice = false;
            if (!blobOnDevice(call.coldBase, onDevice))
            {
                return false;
            }
            if (onDevice)
            {
                args.buffers = warpTables_.at(call.lifeCycle.id).get();
                args.itemsPerPage = plan.warpItemsPerPage;
                args.warpPath = 1;
                args.warpStaged = args.encode && plan.warpGroupBytes <= kMaxWarpStagedGroupBytes ? 1 : 0;
            }
        }
        return cudaCheck(launchKernel(args, numSms_, call.stream), "nvfp4 kernel launch");
    }

    // Whether the blobs at `coldBase` lie in device memory (the warp kernels' stores suit device
    // memory; blobs in pinned host memory need the other kernels' contiguous stores). Cold pools
    // rarely move: the last answer is kept. Calls of a codec are serialized (CodecBase).
    bool blobOnDevice(uintptr_t coldBase, bool& onDevice)
    {
        if (coldBase != lastColdBase_)
        {
            cudaPointerAttributes attributes{};
            if (!cudaCheck(cudaPointerGetAttributes(&attributes, reinterpret_cast<void const*>(coldBase)),
                    "finding where the blobs lie"))
            {
                return false;
            }
            lastColdBase_ = coldBase;
            lastColdOnDevice_ = attributes.type == cudaMemoryTypeDevice;
        }
        onDevice = lastColdOnDevice_;
        return true;
    }

    std::unordered_map<LayerGroupId, kvcodec::DeviceArray<BufferPlan>> tables_;
    std::unordered_map<LayerGroupId, kvcodec::DeviceArray<BufferPlan>> warpTables_;
    uintptr_t lastColdBase_ = 0;
    bool lastColdOnDevice_ = false;
};

KvcodecCodecFactory const kFactory = kvcodec::makeCodecFactory<Codec>();

} // namespace

KvcodecCodecFactory const* codecFactory() noexcept
{
    return &kFactory;
}

} // namespace nvfp4_codec

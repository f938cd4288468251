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
namespace {

std::vector<std::string> splitList(std::string const& text)
{
    std::vector<std::string> out;
    std::string cur;
    for (char c : text + ",")
    {
        if (c != ',')
        {
            cur.push_back(c);
            continue;
        }
        size_t const b = cur.find_first_not_of(" \t");
        size_t const e = cur.find_last_not_of(" \t");
        if (b != std::string::npos)
        {
            out.push_back(cur.substr(b, e - b + 1));
        }
        cur.clear();
    }
    return out;
}

} // namespace

// Types, defaults and choices are validated by the Python spec (plugin.py): one schema. The list
// contents are checked here too, so a native caller gets the same refusals.
void Params::read(kvcodec::ParamReader& r)
{
    r.choice("granularity", granularity, {{"page_head", Granularity::kPageHead}, {"page", Granularity::kPage}});
    std::string roles;
    r.read("lossless_roles", roles);
    for (auto const& role : splitList(roles))
    {
        if (role == "key")
            losslessKey = true;
        else if (role == "value")
            losslessValue = true;
        else if (role != "other")
            r.refuse("lossless_roles",
                "'" + role + "' is not a role; valid roles are 'key', 'value', 'other' (comma-separated)");
    }
    std::string layers;
    r.read("lossless_layers", layers);
    for (auto const& item : splitList(layers))
    {
        bool const digits = !item.empty() && item.size() <= 9
            && std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits)
        {
            r.refuse("lossless_layers",
                "'" + item + "' is not a layer id; it must be comma-separated non-negative layer ids, e.g. '0,31'");
        }
        losslessLayers.insert(std::stoll(item));
    }
}

namespace {

using kvcodec::CodecCall;
using kvcodec::HotLayout;
using kvcodec::LayerGroupId;
using kvcodec::PageIndexLocation;

bool sameBuffers(std::vector<kvcodec::BufferDesc> const& a, std::vector<kvcodec::BufferDesc> const& b)
{
    return a.size() == b.size()
        && std::equal(a.begin(), a.end(), b.begin(), [](kvcodec::BufferDesc const& x, kvcodec::BufferDesc const& y) {
               return x.layerId == y.layerId && x.role == y.role && x.poolIndex == y.poolIndex && x.dtype == y.dtype
                   && x.byteOffset == y.byteOffset && x.bytes == y.bytes && x.tokensPerPage == y.tokensPerPage
                   && x.numHeads == y.numHeads && x.headDim == y.headDim;
           });
}

// One class for both implementations: the CPU reference (device() == KVCODEC_DEVICE_CPU: host
// pointers, synchronous, stream ignored) and the CUDA one (one kernel launch per call).
class Codec final : public kvcodec::CodecBase
{
public:
    // What makeCodecFactory<Codec>() needs: the registry name, the format version, the parameters.
    static constexpr char const* kName = "nvfp4";
    static constexpr uint32_t kFormatVersion = ::nvfp4_codec::kFormatVersion;
    using Params = ::nvfp4_codec::Params;

    explicit Codec(Params const& params, kvcodec::CudaDevice cuda = {KVCODEC_DEVICE_CPU, 0})
        : CodecBase(cuda.ordinal)
        , params_(params)
        , numSms_(cuda.numSms)
    {
    }

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
            plans_[lc.id] = std::move(plan);
        }
        return isCpu() || cudaCheck(preloadKernel(), "loading the nvfp4 kernel");
    }

    uint64_t coldPageBytes(HotLayout::LifeCycle const& lc) const override
    {
        return plans_.at(lc.id).coldPageBytes;
    }

    // The smallest lifecycle of the same hot pool group with an identical buffer list encodes
    // identically (parameters are codec-wide).
    LayerGroupId batchingLayerGroup(HotLayout::LifeCycle const& lc) const override
    {
        LayerGroupId best = lc.id;
        for (LayerGroupId other : layout().groups()[lc.group].lifeCycles)
        {
            if (other < best && sameBuffers(layout().find(other)->buffers, lc.buffers))
            {
                best = other;
            }
        }
        return best;
    }

    PageIndexLocation pageIndexLocation(HotLayout::LifeCycle const&) const override
    {
        return isCpu() ? PageIndexLocation::kHost : PageIndexLocation::kDevice;
    }

    bool submit(CodecCall const& call) override
    {
        return isCpu() ? submitCpu(call) : submitCuda(call);
    }

    bool submitCpu(CodecCall const& call)
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

    bool submitCuda(CodecCall const& call)
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
        return cudaCheck(launchKernel(args, numSms_, call.stream), "nvfp4 kernel launch");
    }

    Params params_;
    int numSms_;
    std::unordered_map<LayerGroupId, LifeCyclePlan> plans_;
    std::unordered_map<LayerGroupId, kvcodec::DeviceArray<BufferPlan>> tables_;
};

KvcodecCodecFactory const kFactory = kvcodec::makeCodecFactory<Codec>();

} // namespace

KvcodecCodecFactory const* codecFactory() noexcept
{
    return &kFactory;
}

} // namespace nvfp4_codec

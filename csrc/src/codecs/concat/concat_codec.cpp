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
#include "kvcodec/codec_base.h"
#include "runtime/driver_api.h"

namespace kvcodec::concat {
namespace {

enum class Path
{
    kAuto,
    kCopyEngine,
    kSm
};
enum class CopyApi
{
    kAuto,
    kBatch,
    kPerCopy
};

// The values the registry's schema validated (kvcodec_sdk/codecs/concat.py holds the schema).
struct ConcatParams
{
    Path path = Path::kAuto;
    uint64_t smPathBelowBytes = 1024 * 1024;
    CopyApi copyApi = CopyApi::kAuto;

    void read(ParamReader& r)
    {
        r.choice("path", path, {{"auto", Path::kAuto}, {"copy_engine", Path::kCopyEngine}, {"sm", Path::kSm}});
        r.read("sm_path_below_bytes", smPathBelowBytes);
        r.choice("copy_api", copyApi,
            {{"auto", CopyApi::kAuto}, {"batch", CopyApi::kBatch}, {"per_copy", CopyApi::kPerCopy}});
    }
};

// Shared by both implementations: the blob offset of every pool of a hot pool group.
class ConcatCodec : public CodecBase
{
public:
    ConcatCodec(ConcatParams params, int32_t device)
        : CodecBase(device)
        , params_(params)
    {
    }

protected:
    // One (page, pool) copy in blob-relative terms.
    struct Piece
    {
        uintptr_t hot;
        uintptr_t cold;
        uint64_t bytes;
    };

    bool plan(HotLayout const& layout) override
    {
        offsets_.clear();
        for (auto const& group : layout.groups())
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
        return planBackend();
    }

    virtual bool planBackend() = 0;

    std::vector<std::vector<uint64_t>> offsets_; // per group, per pool: offset inside the blob
    ConcatParams params_;
};

// ---------------------------------------------------------------------------------------------
// CPU reference
// ---------------------------------------------------------------------------------------------

class ConcatCodecCpu final : public ConcatCodec
{
public:
    explicit ConcatCodecCpu(ConcatParams const& params)
        : ConcatCodec(params, KVCODEC_DEVICE_CPU)
    {
    }

private:
    bool planBackend() override
    {
        return true;
    }

    PageIndexLocation pageIndexLocation(HotLayout::LifeCycle const&) const override
    {
        return PageIndexLocation::kHost;
    }

    bool submit(CodecCall const& call) override
    {
        auto const& group = call.group;
        auto const& offs = offsets_[call.groupIndex];
        for (size_t i = 0; i < call.numPages; ++i)
        {
            uint64_t const hotIdx = uint64_t(call.hot(i));
            auto* cold = reinterpret_cast<char*>(call.coldBase + uint64_t(call.cold(i)) * group.pageBytes);
            for (size_t p = 0; p < group.pools.size(); ++p)
            {
                auto const& pool = group.pools[p];
                auto* hot = reinterpret_cast<char*>(pool.base + hotIdx * pool.slotBytes);
                if (call.encoding)
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
    std::vector<CUdeviceptr> dsts, srcs;
    std::vector<size_t> sizes;
    std::vector<uint64_t> cuts;
    std::vector<uintptr_t> blobBounds;
};

thread_local DescriptorScratch tScratch;

class ConcatCodecCuda final : public ConcatCodec
{
public:
    ConcatCodecCuda(ConcatParams const& params, CudaDevice device)
        : ConcatCodec(params, device.ordinal)
        , numSms_(device.numSms)
    {
        if (params.copyApi == CopyApi::kBatch && !runtime::driverApi().hasMemcpyBatch())
        {
            throw CodecCreateError("concat parameter copy_api='batch' needs cuMemcpyBatchAsync (CUDA 12.8+), but the "
                                   "driver reports version "
                + std::to_string(runtime::driverApi().driverVersion));
        }
    }

private:
    struct GroupPlan
    {
        bool smPath = false;
        std::vector<std::vector<uintptr_t>> poolBoundaries; // registration boundaries per hot pool
        DeviceArray<GatherPool> devicePools;
        uint64_t chunksPerPage = 0;
    };

    static constexpr uint64_t kGatherChunkBytes = 16 * 1024;

    bool planBackend() override
    {
        if (!cudaCheck(preloadGather(), "loading the gather kernel"))
        {
            return false;
        }
        plans_.resize(layout().groups().size());
        for (size_t g = 0; g < plans_.size(); ++g)
        {
            auto const& group = layout().groups()[g];
            GroupPlan& plan = plans_[g];
            uint64_t smallest = UINT64_MAX;
            for (auto const& pool : group.pools)
            {
                smallest = std::min(smallest, pool.slotBytes);
                std::vector<uintptr_t> bounds;
                appendRegistrationBoundaries(pool.base, pool.base + pool.slotBytes * pool.numSlots, bounds);
                plan.poolBoundaries.push_back(std::move(bounds));
            }
            plan.smPath
                = params_.path == Path::kSm || (params_.path == Path::kAuto && smallest < params_.smPathBelowBytes);
            if (!plan.smPath)
            {
                continue;
            }
            auto const table = chunkedPools(group, kGatherChunkBytes, plan.chunksPerPage);
            if (!cudaCheck(plan.devicePools.upload(table),
                    "allocating the SM-path pool table of hot pool group " + std::to_string(g)))
            {
                return false;
            }
        }
        return true;
    }

    PageIndexLocation pageIndexLocation(HotLayout::LifeCycle const& lc) const override
    {
        return plans_[lc.group].smPath ? PageIndexLocation::kDevice : PageIndexLocation::kHost;
    }

    bool submit(CodecCall const& call) override
    {
        GroupPlan const& plan = plans_[call.groupIndex];
        if (plan.smPath)
        {
            auto const& group = call.group;
            GatherArgs args{plan.devicePools.get(), uint32_t(group.pools.size()), call.encoding ? 1u : 0u,
                kGatherChunkBytes, plan.chunksPerPage, group.pageBytes, group.numSlots, call.pages, call.numPages,
                call.coldBase};
            return cudaCheck(launchGather(args, numSms_, call.stream), "gather kernel launch");
        }
        return submitCopyEngine(call);
    }

    bool submitCopyEngine(CodecCall const& call)
    {
        auto const& group = call.group;
        GroupPlan const& plan = plans_[call.groupIndex];
        uintptr_t const blob = call.coldBase;
        size_t const n = call.numPages;
        bool const encode = call.encoding;
        int64_t const maxCold = call.maxColdIndex;
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
        uint64_t const* offs = offsets_[call.groupIndex].data();
        size_t k = 0;
        if (!anyBounds)
        {
            for (size_t i = 0; i < n; ++i)
            {
                uint64_t const hotIdx = uint64_t(call.hot(i));
                uintptr_t const cold = blob + uint64_t(call.cold(i)) * group.pageBytes;
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
                uint64_t const hotIdx = uint64_t(call.hot(i));
                uintptr_t const cold = blob + uint64_t(call.cold(i)) * group.pageBytes;
                for (size_t p = 0; p < numPools; ++p)
                {
                    auto const& pool = group.pools[p];
                    appendSplit({pool.base + hotIdx * pool.slotBytes, cold + offs[p], pool.slotBytes},
                        plan.poolBoundaries[p], blobBounds, encode, k);
                }
            }
        }
        return submitDescriptors(k, call.stream);
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
            if (b > piece.hot && b < piece.hot + piece.bytes)
                cuts.push_back(b - piece.hot);
        }
        for (uintptr_t b : coldBounds)
        {
            if (b > piece.cold && b < piece.cold + piece.bytes)
                cuts.push_back(b - piece.cold);
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
                r = api.memcpyBatchAsyncV13(
                    dsts.data(), srcs.data(), sizes.data(), count, &attr, &attrIndex, 1, cuStream);
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

    int numSms_;
    std::vector<GroupPlan> plans_;
};

struct ConcatTraits
{
    static constexpr char const* kName = "concat";
    static constexpr uint32_t kFormatVersion = kConcatFormatVersion;
    using Params = ConcatParams;
    using Cpu = ConcatCodecCpu;
    using Cuda = ConcatCodecCuda;
};

KvcodecCodecFactory const kFactory = makeCodecFactory<ConcatTraits>();

} // namespace

KvcodecCodecFactory const* concatCodecFactory() noexcept
{
    return &kFactory;
}

std::unique_ptr<IKvCacheColdPageCodec> createDefaultKvCacheColdPageCodec(int32_t device)
{
    char error[512] = {};
    IKvCacheColdPageCodec* codec = kFactory.create("{}", device, error, sizeof(error));
    if (codec == nullptr)
    {
        throw std::runtime_error(error);
    }
    return std::unique_ptr<IKvCacheColdPageCodec>(codec);
}

} // namespace kvcodec::concat

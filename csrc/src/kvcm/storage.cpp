// SPDX-License-Identifier: Apache-2.0
#include "kvcm/storage.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

#include "codecs/concat/concat_codec.h"
#include "kvcm/shared_level.h"
#include "kvcodec/plugin.h"

namespace kvcodec::kvcm {
namespace {

std::string deviceLabel(int32_t device)
{
    return device == KVCODEC_DEVICE_CPU ? std::string("cpu") : "cuda:" + std::to_string(device);
}

std::string locationName(PageIndexLocation location)
{
    switch (location)
    {
    case PageIndexLocation::kHost: return "host";
    case PageIndexLocation::kDevice: return "device";
    default: return "bad";
    }
}

std::string idList(std::vector<LifeCycleId> const& ids)
{
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i)
    {
        out += (i ? ", " : "") + std::to_string(ids[i]);
    }
    return out + "]";
}

} // namespace

StorageManager::StorageManager(
    KvcmConfig config, runtime::DeviceRuntime& runtime, runtime::CodecPtr codec, int32_t codecDevice)
    : config_(std::move(config))
    , runtime_(runtime)
    , codec_(std::move(codec)) // Step 1: the supplied codec is owned from here on, whatever happens next.
{
    if (codec_ && codecDevice != runtime_.codecDevice())
    {
        throw std::invalid_argument("the cold-page codec was created for device " + deviceLabel(codecDevice)
            + " but the manager runs on " + runtime_.name() + "; create the codec with device='" + runtime_.name()
            + "'");
    }
    validateConfig(config_);
    buildHotLayout();
    if (!codec_)
    {
        auto created = concat::createDefaultKvCacheColdPageCodec(runtime_.codecDevice());
        codec_ = runtime::CodecPtr(created.release(), runtime::CodecDeleter{});
    }
    allocateHot();                // Step 2
    configureCodec();             // Step 3
    queryCodec();                 // Step 4
    validateBatchingAndMapCold(); // Step 5
    allocateCold();               // Step 6
    // Step 7: codec_ stays here for every migration.
}

StorageManager::~StorageManager() = default;

void StorageManager::buildHotLayout()
{
    size_t const n = config_.layerGroups.size();
    lifeCycles_.resize(n);
    double total = 0;
    for (double w : config_.poolRatio)
    {
        total += w;
    }
    weights_.clear();
    for (double w : config_.poolRatio)
    {
        weights_.push_back(w / total);
    }
    // Lifecycles whose pool list (slot bytes per pool) is identical share a hot pool group.
    std::map<std::vector<uint64_t>, PoolGroupIndex> groupOf;
    auto& hotMap = lifeCycleToPoolGroup_[size_t(CacheLevel::kHot)];
    hotMap.assign(n, -1);
    for (size_t l = 0; l < n; ++l)
    {
        LifeCycleInfo& info = lifeCycles_[l];
        info.layout = hotSlotLayout(config_.layerGroups[l]);
        info.hotPageBytes = 0;
        for (uint64_t b : info.layout.poolSlotBytes)
        {
            info.hotPageBytes += b;
        }
        auto [it, inserted] = groupOf.emplace(info.layout.poolSlotBytes, PoolGroupIndex(hot_.size()));
        if (inserted)
        {
            HotPoolGroup group;
            group.slotBytes = info.layout.poolSlotBytes;
            group.pageBytes = info.hotPageBytes;
            hot_.push_back(std::move(group));
        }
        hotMap[l] = it->second;
        hot_[size_t(it->second)].lifeCycles.push_back(LifeCycleId(l));
    }
}

std::vector<uint64_t> StorageManager::projectHot(uint64_t quota, char const* quotaField) const
{
    // Hot bytes per lifecycle = its normalized weight of the quota, summed per hot pool group.
    // Floors (minHotSlots, summed per group) clamp this split: a group whose share falls below
    // its floor gets exactly the floor and the rest of the quota is re-split among the others by
    // weight, until no unclamped group is below its floor (water filling).
    size_t const numGroups = hot_.size();
    std::vector<double> weight(numGroups, 0.0);
    std::vector<uint64_t> floorSlots(numGroups, 0);
    double floorBytes = 0;
    size_t worst = 0; // Layer group with the largest floor in bytes, named when infeasible.
    double worstBytes = -1;
    for (size_t g = 0; g < numGroups; ++g)
    {
        for (LifeCycleId l : hot_[g].lifeCycles)
        {
            weight[g] += weights_[size_t(l)];
            uint64_t const floor = config_.minHotSlots.empty() ? 0 : config_.minHotSlots[size_t(l)];
            floorSlots[g] += floor;
            double const bytes = double(floor) * double(hot_[g].pageBytes);
            if (bytes > worstBytes)
            {
                worstBytes = bytes;
                worst = size_t(l);
            }
        }
        floorBytes += double(floorSlots[g]) * double(hot_[g].pageBytes);
    }
    if (floorBytes > double(quota))
    {
        throw std::invalid_argument("config.minHotSlots needs " + std::to_string(uint64_t(floorBytes))
            + " hot bytes but " + quotaField + " is " + std::to_string(quota) + ": short by "
            + std::to_string(uint64_t(floorBytes) - quota) + " bytes (the largest floor is layer group "
            + std::to_string(worst) + "'s minHotSlots[" + std::to_string(worst)
            + "] = " + std::to_string(config_.minHotSlots[worst]) + " slots of "
            + std::to_string(lifeCycles_[worst].hotPageBytes) + " bytes); lower the floors or raise the quota");
    }
    std::vector<bool> clamped(numGroups, false);
    std::vector<uint64_t> slotsOf(numGroups, 0);
    for (bool changed = true; changed;)
    {
        changed = false;
        double rest = double(quota);
        double restWeight = 0;
        for (size_t g = 0; g < numGroups; ++g)
        {
            if (clamped[g])
            {
                rest -= double(floorSlots[g]) * double(hot_[g].pageBytes);
            }
            else
            {
                restWeight += weight[g];
            }
        }
        for (size_t g = 0; g < numGroups; ++g)
        {
            if (clamped[g])
            {
                slotsOf[g] = floorSlots[g];
                continue;
            }
            double const bytes = std::max(0.0, rest) * weight[g] / restWeight;
            slotsOf[g] = uint64_t(std::floor(bytes / double(hot_[g].pageBytes)));
            if (slotsOf[g] < floorSlots[g])
            {
                clamped[g] = true;
                changed = true;
            }
        }
    }
    for (size_t g = 0; g < numGroups; ++g)
    {
        HotPoolGroup const& group = hot_[g];
        uint64_t slots = std::min<uint64_t>(slotsOf[g], uint64_t(INT32_MAX));
        if (slots == 0)
        {
            throw std::invalid_argument(std::string(quotaField) + " is " + std::to_string(quota) + ": hot pool group "
                + std::to_string(g) + " (layer groups " + idList(group.lifeCycles) + ", "
                + std::to_string(group.pageBytes) + " bytes per page) gets less than one page"
                + (floorBytes > 0 ? " after the minHotSlots floors" : "")
                + "; raise the quota or these layer groups' poolRatio");
        }
        slotsOf[g] = slots;
    }
    return slotsOf;
}

void StorageManager::allocateHot()
{
    // The pools are sized for the largest hot quota once (the codec is configured with their
    // addresses and never again); resize() changes only how many of their slots are usable.
    uint64_t const maxQuota = std::max(config_.maxGpuQuotaBytes, config_.gpuQuotaBytes);
    std::vector<uint64_t> const capacity = projectHot(maxQuota,
        config_.maxGpuQuotaBytes > config_.gpuQuotaBytes ? "config.maxGpuQuotaBytes" : "config.gpuQuotaBytes");
    std::vector<uint64_t> const usable = projectHot(config_.gpuQuotaBytes, "config.gpuQuotaBytes");
    for (size_t g = 0; g < hot_.size(); ++g)
    {
        HotPoolGroup& group = hot_[g];
        group.capacitySlots = capacity[g];
        group.slots = SlotPool(std::min(usable[g], capacity[g]));
        for (uint64_t slotBytes : group.slotBytes)
        {
            group.pools.emplace_back(runtime_, runtime::MemoryKind::kDevice, size_t(slotBytes * capacity[g]));
        }
    }
}

void StorageManager::configureCodec()
{
    runtime::HotLayoutStorage storage;
    for (auto const& group : hot_)
    {
        runtime::HotLayoutStorage::Group g;
        for (size_t p = 0; p < group.pools.size(); ++p)
        {
            g.pools.push_back({group.pools[p].data(), group.slotBytes[p], group.capacitySlots});
        }
        for (LifeCycleId l : group.lifeCycles)
        {
            g.lifeCycles.push_back({l, lifeCycles_[size_t(l)].layout.buffers});
        }
        storage.groups.push_back(std::move(g));
    }
    auto const& descs = storage.descs();
    if (!codec_->configure(descs.data(), PoolGroupIndex(descs.size())))
    {
        throw std::invalid_argument(
            std::string("the cold-page codec rejected the hot layout in configure(): ") + codec_->lastError());
    }
}

void StorageManager::queryCodec()
{
    // Methods of plugin ABI 2 exist only in the vtables of codecs built for it.
    checkedDecode_ = codec_.get_deleter().abiVersion >= 2 && codec_->hasCheckedDecode();
    for (size_t l = 0; l < lifeCycles_.size(); ++l)
    {
        LifeCycleInfo& info = lifeCycles_[l];
        auto const id = LifeCycleId(l);
        info.coldPageBytes = codec_->queryColdPageBytes(id);
        if (info.coldPageBytes == 0)
        {
            throw std::invalid_argument("the codec reports 0 cold-page bytes for layer group " + std::to_string(l)
                + " (queryColdPageBytes failed): " + codec_->lastError());
        }
        info.batchingRepresentative = codec_->getBatchingLayerGroupId(id);
        if (info.batchingRepresentative < 0)
        {
            throw std::invalid_argument("the codec reports batching representative "
                + std::to_string(info.batchingRepresentative) + " for layer group " + std::to_string(l)
                + " (getBatchingLayerGroupId failed)");
        }
        info.location = codec_->queryPageIndexLocation(id);
        if (info.location != PageIndexLocation::kHost && info.location != PageIndexLocation::kDevice)
        {
            throw std::invalid_argument("the codec reports page-index location " + std::to_string(int(info.location))
                + " for layer group " + std::to_string(l) + "; only kHost (0) and kDevice (1) are valid");
        }
    }
}

void StorageManager::validateBatchingAndMapCold()
{
    size_t const n = lifeCycles_.size();
    auto const& hotMap = lifeCycleToPoolGroup_[size_t(CacheLevel::kHot)];
    // Cold groups from encoded sizes: lifecycles with the same cold-page size (= blob stride)
    // share a cold pool group, independently of their hot grouping.
    auto& coldMap = lifeCycleToPoolGroup_[size_t(CacheLevel::kHost)];
    coldMap.assign(n, -1);
    std::map<uint64_t, PoolGroupIndex> coldGroupOf;
    for (size_t l = 0; l < n; ++l)
    {
        auto [it, inserted] = coldGroupOf.emplace(lifeCycles_[l].coldPageBytes, PoolGroupIndex(coldGroupOf.size()));
        coldMap[l] = it->second;
    }
    for (size_t l = 0; l < n; ++l)
    {
        LifeCycleInfo const& m = lifeCycles_[l];
        LifeCycleId const r = m.batchingRepresentative;
        std::string const cls
            = "layer group " + std::to_string(l) + " has batching representative " + std::to_string(r);
        if (size_t(r) >= n)
        {
            throw std::invalid_argument(
                cls + ", which is not a configured layer group (valid: 0.." + std::to_string(n - 1) + ")");
        }
        if (r > LifeCycleId(l))
        {
            throw std::invalid_argument(cls + ", which is greater than the member; a representative is the smallest "
                + "lifecycle of its class");
        }
        LifeCycleInfo const& rep = lifeCycles_[size_t(r)];
        if (rep.batchingRepresentative != r)
        {
            throw std::invalid_argument(cls + ", but layer group " + std::to_string(r) + " maps to representative "
                + std::to_string(rep.batchingRepresentative) + ", not to itself");
        }
        if (hotMap[l] != hotMap[size_t(r)])
        {
            throw std::invalid_argument(cls + " but they are in different hot pool groups (" + std::to_string(hotMap[l])
                + " and " + std::to_string(hotMap[size_t(r)]) + "); a batching class must share one hot pool group");
        }
        if (m.coldPageBytes != rep.coldPageBytes)
        {
            throw std::invalid_argument(cls + " but their cold-page sizes differ (" + std::to_string(m.coldPageBytes)
                + " and " + std::to_string(rep.coldPageBytes) + " bytes)");
        }
        if (coldMap[l] != coldMap[size_t(r)])
        {
            throw std::invalid_argument(cls + " but they are in different cold pool groups ("
                + std::to_string(coldMap[l]) + " and " + std::to_string(coldMap[size_t(r)]) + ")");
        }
        if (m.location != rep.location)
        {
            throw std::invalid_argument(cls + " but their page-index locations differ (" + locationName(m.location)
                + " and " + locationName(rep.location) + ")");
        }
    }
}

void StorageManager::allocateCold()
{
    // Every cold level uses the same lifecycle -> cold pool group mapping and cold-page sizes.
    auto const coldMap = lifeCycleToPoolGroup_[size_t(CacheLevel::kHost)];
    bool const hasDisk = !config_.disk.path.empty();
    if (hasDisk)
    {
        lifeCycleToPoolGroup_[size_t(CacheLevel::kDisk)] = coldMap;
    }
    bool const hasRemote = config_.remote.maxPages != 0;
    if (hasRemote)
    {
        lifeCycleToPoolGroup_[size_t(CacheLevel::kRemote)] = coldMap;
    }
    if (config_.hostQuotaBytes == 0)
    {
        lifeCycleToPoolGroup_[size_t(CacheLevel::kHost)].clear(); // No host tier.
    }
    // Each lifecycle's hot byte weight -> its implied hot slot-count weight -> cold bytes with
    // its own cold-page size, summed per cold pool group. Slot-count proportions between layer
    // groups survive different page sizes and groupings.
    size_t numGroups = 0;
    for (PoolGroupIndex g : coldMap)
    {
        numGroups = std::max(numGroups, size_t(g) + 1);
    }
    std::vector<double> coldWeight(numGroups, 0.0);
    std::vector<uint64_t> pageBytes(numGroups, 0);
    std::vector<std::vector<LifeCycleId>> members(numGroups);
    double total = 0;
    uint64_t maxColdPageBytes = 0;
    for (size_t l = 0; l < lifeCycles_.size(); ++l)
    {
        double const slots = weights_[l] * double(config_.gpuQuotaBytes) / double(lifeCycles_[l].hotPageBytes);
        double const bytes = slots * double(lifeCycles_[l].coldPageBytes);
        coldWeight[size_t(coldMap[l])] += bytes;
        pageBytes[size_t(coldMap[l])] = lifeCycles_[l].coldPageBytes;
        members[size_t(coldMap[l])].push_back(LifeCycleId(l));
        maxColdPageBytes = std::max(maxColdPageBytes, lifeCycles_[l].coldPageBytes);
        total += bytes;
    }
    coldWeight_ = coldWeight;
    coldPageBytes_ = pageBytes;
    if (config_.hostQuotaBytes != 0)
    {
        std::vector<uint64_t> const slots = projectCold(config_.hostQuotaBytes);
        if (!config_.shared.socketPath.empty())
        {
            // The host tier in the per-host daemon's shared arena.
            std::vector<SharedColdLevel::GroupSpec> groups;
            for (size_t g = 0; g < numGroups; ++g)
            {
                groups.push_back({pageBytes[g], slots[g], members[g]});
            }
            host_ = std::make_unique<SharedColdLevel>(runtime_, config_.shared, std::move(groups));
        }
        else
        {
            std::vector<std::pair<uint64_t, uint64_t>> groups;
            for (size_t g = 0; g < numGroups; ++g)
            {
                groups.emplace_back(pageBytes[g], slots[g]);
            }
            host_ = std::make_unique<HostColdLevel>(runtime_, groups);
        }
    }
    if (hasDisk)
    {
        std::vector<DiskColdLevel::GroupSpec> groups;
        for (size_t g = 0; g < numGroups; ++g)
        {
            auto const bytes = uint64_t(std::floor(double(config_.disk.maxBytes) * coldWeight[g] / total));
            groups.push_back({pageBytes[g], bytes, members[g]});
        }
        // The pinned page ring exists only because a cold level is neither GPU nor host memory.
        pageRing_ = std::make_unique<StagingManager>(
            runtime_, StagingManager::Backing(runtime::HostMem(runtime_, size_t(pageRingBytes(maxColdPageBytes)))));
        disk_ = std::make_unique<DiskColdLevel>(runtime_, config_.disk, groups, *pageRing_);
    }
    if (hasRemote)
    {
        std::vector<RemoteColdLevel::GroupSpec> groups;
        for (size_t g = 0; g < numGroups; ++g)
        {
            groups.push_back({pageBytes[g], config_.remote.maxPages});
        }
        remoteRing_ = std::make_unique<StagingManager>(
            runtime_, StagingManager::Backing(runtime::HostMem(runtime_, size_t(pageRingBytes(maxColdPageBytes)))));
        remote_ = std::make_unique<RemoteColdLevel>(config_.remote, groups, coldMap, *remoteRing_);
    }
}

std::vector<uint64_t> StorageManager::projectCold(uint64_t quota) const
{
    double total = 0;
    for (double w : coldWeight_)
    {
        total += w;
    }
    std::vector<uint64_t> out;
    for (size_t g = 0; g < coldWeight_.size(); ++g)
    {
        double const bytes = double(quota) * coldWeight_[g] / total;
        // Structural minimum of the slot allocator: one slot.
        uint64_t slots = std::max<uint64_t>(1, uint64_t(std::floor(bytes / double(coldPageBytes_[g]))));
        slots = std::min<uint64_t>(slots, uint64_t(INT32_MAX));
        if (coldPageBytes_[g] > UINT64_MAX / slots)
        {
            throw std::invalid_argument("cold pool group " + std::to_string(g) + " size overflows");
        }
        out.push_back(slots);
    }
    return out;
}

std::vector<uint64_t> StorageManager::projectSlots(CacheLevel level, uint64_t quota) const
{
    if (level == CacheLevel::kHot)
    {
        return projectHot(quota, "quota_bytes");
    }
    if (auto own = coldLevel(level)->ownSlotCounts(quota))
    {
        return std::move(*own); // A level that decides its own geometry (the disk's containers).
    }
    return projectCold(quota);
}

void StorageManager::setQuota(CacheLevel level, uint64_t quota) noexcept
{
    if (level == CacheLevel::kHot)
    {
        config_.gpuQuotaBytes = quota;
    }
    else if (level == CacheLevel::kHost)
    {
        config_.hostQuotaBytes = quota;
    }
    // The disk level records its quota itself (DiskColdLevel::quota(), persisted with the tier).
}

std::string StorageManager::missingLevelReason(CacheLevel level)
{
    return level == CacheLevel::kDisk  ? "config.disk is not set"
        : level == CacheLevel::kRemote ? "config.remote is not set"
                                       : "config.hostQuotaBytes is 0";
}

void StorageManager::closeLevel(CacheLevel level) noexcept
{
    if (level == CacheLevel::kDisk)
    {
        closeDisk();
    }
    else if (level == CacheLevel::kRemote)
    {
        closeRemote();
    }
    else if (level == CacheLevel::kHost)
    {
        host_.reset();
        lifeCycleToPoolGroup_[size_t(CacheLevel::kHost)].clear();
    }
}

size_t StorageManager::numPoolGroups(CacheLevel level) const noexcept
{
    if (level == CacheLevel::kHot)
    {
        return hot_.size();
    }
    ColdLevel const* cold = coldLevel(level);
    return cold ? cold->numPoolGroups() : 0;
}

SlotPool& StorageManager::slots(CacheLevel level, PoolGroupIndex group) noexcept
{
    return level == CacheLevel::kHot ? hot_[size_t(group)].slots : coldLevel(level)->slots(group);
}

uint64_t StorageManager::pageBytes(CacheLevel level, PoolGroupIndex group) const noexcept
{
    return level == CacheLevel::kHot ? hot_[size_t(group)].pageBytes : coldLevel(level)->pageBytes(group);
}

StagingManager& StorageManager::ensureIndexRing()
{
    if (!indexRing_)
    {
        indexRing_ = std::make_unique<StagingManager>(
            runtime_, StagingManager::Backing(runtime::DeviceMem(runtime_, size_t(config_.indexRingBytes))));
    }
    return *indexRing_;
}

bool StorageManager::transcode(bool encode, LifeCycleId rep, std::byte* coldBase, PageIndexPair const* pairs,
    size_t count, Stream stream, std::string& error, uint8_t* pageStatus, uint64_t* calls)
{
    std::lock_guard<std::mutex> lock(codecMu_);
    size_t done = 0;
    auto call = [&](PageIndexPair const* p, size_t k) {
        ++codecCalls_;
        if (calls != nullptr)
        {
            ++*calls;
        }
        bool const ok = encode ? codec_->encode(rep, coldBase, p, k, stream)
            : pageStatus       ? codec_->decodeChecked(rep, coldBase, p, k, pageStatus + done, stream)
                               : codec_->decode(rep, coldBase, p, k, stream);
        if (!ok)
        {
            error = std::string(encode   ? "encode"
                            : pageStatus ? "decodeChecked"
                                         : "decode")
                + "(layer group " + std::to_string(rep) + ", " + std::to_string(k)
                + " pages) failed: " + codec_->lastError();
        }
        return ok;
    };
    if (lifeCycles_[size_t(rep)].location == PageIndexLocation::kHost)
    {
        return call(pairs, count); // The codec consumes host indices before returning.
    }
    // Device indices: lease ring bytes on the codec stream, upload the pageable array (consumed
    // during the call), and hand the lease to the codec. The lease records its event when it is
    // released, after the upload and all codec work enqueued so far.
    StagingManager& ring = ensureIndexRing();
    while (done < count)
    {
        size_t const want = (count - done) * sizeof(PageIndexPair);
        auto lease = ring.acquire(sizeof(PageIndexPair), want, sizeof(PageIndexPair), alignof(PageIndexPair), stream);
        if (!lease)
        {
            error = "the device index ring (" + std::to_string(ring.capacity()) + " bytes) has no free range";
            return false;
        }
        size_t const k = lease->size() / sizeof(PageIndexPair);
        if (!runtime_.uploadFromPageable(lease->data(), pairs + done, k * sizeof(PageIndexPair), stream, error))
        {
            return false;
        }
        if (!call(reinterpret_cast<PageIndexPair const*>(lease->data()), k))
        {
            return false;
        }
        done += k;
    }
    return true;
}

bool StorageManager::copyHot(
    PoolGroupIndex g, PageIndexPair const* pairs, size_t count, Stream stream, std::string& error)
{
    thread_local std::vector<void*> dsts;
    thread_local std::vector<void const*> srcs;
    thread_local std::vector<size_t> sizes;
    HotPoolGroup const& group = hot_[size_t(g)];
    size_t const pools = group.pools.size();
    dsts.resize(count * pools);
    srcs.resize(count * pools);
    sizes.resize(count * pools);
    size_t k = 0;
    for (size_t i = 0; i < count; ++i)
    {
        for (size_t p = 0; p < pools; ++p, ++k)
        {
            std::byte* base = group.pools[p].data();
            dsts[k] = base + uint64_t(pairs[i].dst) * group.slotBytes[p];
            srcs[k] = base + uint64_t(pairs[i].src) * group.slotBytes[p];
            sizes[k] = group.slotBytes[p];
        }
    }
    return runtime_.copyBatch(dsts.data(), srcs.data(), sizes.data(), k, stream, error);
}

bool StorageManager::copyCold(CacheLevel srcLevel, PoolGroupIndex srcGroup, CacheLevel dstLevel,
    PoolGroupIndex dstGroup, PageIndexPair const* pairs, size_t count, Stream stream, std::string& error)
{
    thread_local std::vector<int32_t> slots;
    thread_local std::vector<std::byte*> addrs;
    ColdLevel* src = coldLevel(srcLevel);
    ColdLevel* dst = coldLevel(dstLevel);
    slots.resize(count);
    addrs.resize(count);
    // The side with GPU-accessible bytes gives addresses; the other level copies its blobs.
    if (std::byte* base = dst->accessibleBase(dstGroup))
    {
        uint64_t const stride = dst->pageBytes(dstGroup);
        for (size_t i = 0; i < count; ++i)
        {
            slots[i] = pairs[i].src;
            addrs[i] = base + uint64_t(pairs[i].dst) * stride;
        }
        return src->copyOut(srcGroup, slots.data(), addrs.data(), count, stream, error);
    }
    std::byte* base = src->accessibleBase(srcGroup);
    if (base == nullptr)
    {
        error = "neither cold level is GPU-accessible; a blob copy between them needs a staging hop";
        return false;
    }
    uint64_t const stride = src->pageBytes(srcGroup);
    for (size_t i = 0; i < count; ++i)
    {
        slots[i] = pairs[i].dst;
        addrs[i] = base + uint64_t(pairs[i].src) * stride;
    }
    return dst->copyIn(dstGroup, slots.data(), addrs.data(), count, stream, error);
}

} // namespace kvcodec::kvcm

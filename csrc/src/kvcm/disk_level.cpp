// SPDX-License-Identifier: Apache-2.0
#include "kvcm/disk_level.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "tiers/disk/journal.h"

namespace kvcodec::kvcm {
namespace {

constexpr uint64_t kMinPageRingBytes = 64ull << 20;

/// The quota a previous resize left for the same configured size, or `configured`.
uint64_t recordedQuota(std::string const& path, uint64_t configured)
{
    FILE* f = std::fopen((path + "/" + DiskColdLevel::kQuotaFile).c_str(), "r");
    if (f == nullptr)
    {
        return configured;
    }
    std::string text(4096, '\0');
    text.resize(std::fread(text.data(), 1, text.size(), f));
    std::fclose(f);
    disk::FlatJson obj;
    std::string why;
    if (!disk::parseFlatJson(text, obj, why) || obj["configured_max_bytes"] != std::to_string(configured))
    {
        return configured; // Damaged, or the configuration changed since: the configuration wins.
    }
    uint64_t const q = std::strtoull(obj["quota_bytes"].c_str(), nullptr, 10);
    return q > 0 ? q : configured;
}

} // namespace

uint64_t pageRingBytes(uint64_t maxColdPageBytes)
{
    if (maxColdPageBytes > UINT64_MAX / 3)
    {
        throw std::overflow_error("the pinned page ring needs 3 * " + std::to_string(maxColdPageBytes)
            + " bytes (3 * the largest cold page), which overflows 64 bits");
    }
    return std::max(kMinPageRingBytes, 3 * maxColdPageBytes);
}

DiskColdLevel::DiskColdLevel(runtime::DeviceRuntime& runtime, DiskTierConfig const& config,
    std::vector<GroupSpec> const& specs, StagingManager& ring)
    : StagedColdLevel(ring, "the pinned page ring")
    , runtime_(runtime)
    , path_(config.path)
    , configured_(config.maxBytes)
{
    groups_.reserve(specs.size());
    for (GroupSpec const& spec : specs)
    {
        Group group;
        group.weight = spec.maxBytes;
        group.containerBytes = std::min(config.containerBytes, spec.maxBytes);
        groups_.push_back(std::move(group));
    }
    quota_ = recordedQuota(path_, configured_);
    std::vector<uint32_t> containers;
    try
    {
        containers = containersFor(quota_);
    }
    catch (std::invalid_argument const&)
    {
        quota_ = configured_; // A recorded quota these regions cannot take: start from the configuration.
        containers = containersFor(quota_);
    }
    std::vector<Group> prepared = std::move(groups_);
    groups_.clear();
    for (size_t g = 0; g < specs.size(); ++g)
    {
        GroupSpec const& spec = specs[g];
        disk::RegionConfig rc;
        rc.name = "group" + std::to_string(g);
        rc.slotBytes = spec.pageBytes;
        rc.containerBytes = prepared[g].containerBytes;
        rc.maxBytes = uint64_t(containers[g]) * rc.containerBytes;
        rc.resizeOnOpen = true; // A crash inside a resize left some regions at the other size.
        rc.codec = {config.codecName, config.formatVersion, config.paramHash, config.paramsJson};
        rc.ioMode = disk::IoMode(config.ioMode);
        rc.whenFull = disk::FullPolicy::kRefuse; // The manager owns placement: the region never evicts its pages.
        rc.ioThreads = config.ioThreads;
        rc.ioBackend = disk::IoBackend(config.ioBackend);
        rc.queueDepth = config.queueDepth;
        rc.layoutJson = config.layoutJson;
        if (!config.faults.empty())
        {
            rc.fileIo = disk::faultyFileIo(config.faults);
        }
        std::string const dir = config.path + "/" + rc.name;
        Group group = std::move(prepared[g]);
        group.pageBytes = spec.pageBytes;
        try
        {
            group.region = disk::DiskRegion::open(dir, std::move(rc));
        }
        catch (std::invalid_argument const& e)
        {
            throw std::invalid_argument("config.disk: cold pool group " + std::to_string(g) + " ("
                + std::to_string(spec.pageBytes) + "-byte pages) gets " + std::to_string(spec.maxBytes)
                + " bytes of config.disk.maxBytes; its region rejects that: " + e.what());
        }
        uint64_t const numSlots = std::min<uint64_t>(
            uint64_t(group.region->numContainers()) * group.region->slotsPerContainer(), uint64_t(INT32_MAX));
        group.slots = SlotPool(numSlots);
        group.keys.assign(numSlots, std::string());
        group.tags.assign(numSlots, 0);
        groups_.push_back(std::move(group));

        // What a previous manager left: keyed pages of this group's lifecycles can be claimed;
        // anonymous ones (and anything else) nobody can name any more.
        Group& gr = groups_.back();
        for (disk::PageInfo const& page : gr.region->pages())
        {
            bool const mine = std::find(spec.lifeCycles.begin(), spec.lifeCycles.end(), LifeCycleId(page.tag))
                != spec.lifeCycles.end();
            if (page.key.size() > 1 && page.key[0] == 'k' && mine && gr.slots.freeSlots() > 0
                && found_.count(page.key.substr(1)) == 0)
            {
                int32_t const slot = gr.slots.take();
                gr.keys[size_t(slot)] = page.key;
                gr.tags[size_t(slot)] = page.tag;
                found_.emplace(page.key.substr(1), Found{PoolGroupIndex(g), slot, LifeCycleId(page.tag)});
            }
            else
            {
                gr.erasing.push_back(gr.region->submitErase(page.key));
            }
        }
        waitErases(gr);
    }
}

DiskColdLevel::~DiskColdLevel()
{
    for (Group& g : groups_)
    {
        waitErases(g);
        g.region->close();
    }
}

void DiskColdLevel::waitErases(Group& g) noexcept
{
    for (disk::Ticket t : g.erasing)
    {
        try
        {
            g.region->wait(t); // A failed retirement leaves the blob unreachable; nothing to undo.
        }
        catch (...)
        {
        }
    }
    g.erasing.clear();
}

bool DiskColdLevel::eraseNow(Group& g, std::string const& regionKey, std::string& error) noexcept
{
    try
    {
        disk::Status const s = g.region->wait(g.region->submitErase(regionKey));
        if (s.code != disk::StatusCode::kOk && s.code != disk::StatusCode::kNotFound)
        {
            error = s.message;
            return false;
        }
        return true;
    }
    catch (std::exception const& e)
    {
        error = e.what();
        return false;
    }
}

void DiskColdLevel::assign(PoolGroupIndex group, int32_t slot, std::string const& contentKey, LifeCycleId lifeCycle)
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Group& g = groups_[size_t(group)];
    if (contentKey.empty())
    {
        g.keys[size_t(slot)] = "a" + std::to_string(nextAnonymous_++); // Unique even after renumbering.
    }
    else
    {
        g.keys[size_t(slot)] = "k" + contentKey;
        // A page written under a key an unclaimed found page holds replaces it, once the write is
        // durable (settleReplaced): no longer claimable from now on, still on disk until then.
        auto it = found_.find(contentKey);
        if (it != found_.end())
        {
            replacing_.push_back({contentKey, it->second});
            found_.erase(it);
        }
    }
    g.tags[size_t(slot)] = uint32_t(lifeCycle);
}

DiskColdLevel::Pending* DiskColdLevel::pending(BlobIo io) noexcept
{
    for (Pending& p : pending_)
    {
        if (p.id == io.id)
        {
            return &p;
        }
    }
    return nullptr; // (pending_ holds the few batches in flight: a scan is cheapest.)
}

BlobIo DiskColdLevel::submitRead(
    PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count, BlobStatus* status) noexcept
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Group& g = groups_[size_t(group)];
    try
    {
        pending_.emplace_back();
    }
    catch (...)
    {
        for (size_t i = 0; i < count; ++i)
        {
            status[i] = BlobStatus::kFailed;
        }
        return BlobIo{0};
    }
    Pending& p = pending_.back();
    p.id = nextIo_++;
    p.group = group;
    p.count = count;
    p.status = status;
    try
    {
        p.tickets.assign(count, 0);
        p.messages.assign(count, std::string());
    }
    catch (std::exception const& e)
    {
        p.submitError = e.what();
        p.count = 0;
        return BlobIo{p.id};
    }
    for (size_t i = 0; i < count; ++i)
    {
        try
        {
            p.tickets[i] = g.region->submitRead(g.keys[size_t(slots[i])], dsts[i], g.pageBytes);
        }
        catch (std::exception const& e)
        {
            p.messages[i] = e.what();
        }
    }
    return BlobIo{p.id};
}

void DiskColdLevel::finishRead(
    Pending& p, std::vector<disk::StatusCode>& codes, std::vector<std::string>& messages) noexcept
{
    Group& g = groups_[size_t(p.group)];
    codes.assign(p.count, disk::StatusCode::kIoError);
    messages = std::move(p.messages);
    for (size_t i = 0; i < p.count; ++i)
    {
        if (p.tickets[i] != 0)
        {
            disk::Status const s = p.awaited ? p.results[i] : g.region->wait(p.tickets[i]);
            codes[i] = s.code;
            messages[i] = s.message;
        }
    }
}

BlobIo DiskColdLevel::submitWrite(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs,
    BlobName const* names, size_t count) noexcept
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    try
    {
        for (size_t i = 0; i < count; ++i)
        {
            assign(group, slots[i], *names[i].contentKey, names[i].lifeCycle);
        }
    }
    catch (std::exception const& e)
    {
        BlobIo const io = submitAssigned(group, slots, srcs, 0);
        if (Pending* p = pending(io))
        {
            p->submitError = e.what();
        }
        return io;
    }
    return submitAssigned(group, slots, srcs, count);
}

BlobIo DiskColdLevel::submitAssigned(
    PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count) noexcept
{
    Group& g = groups_[size_t(group)];
    waitErases(g); // Retired blobs give their region slots back once durable.
    std::vector<Replaced> replaced = std::exchange(replacing_, {});
    try
    {
        pending_.emplace_back();
    }
    catch (...)
    {
        Pending none; // Nothing written: the pages assign() took for replacing stay unclaimed.
        none.group = group;
        none.replaced = std::move(replaced);
        settleReplaced(none, {}, false);
        return BlobIo{0};
    }
    Pending& p = pending_.back();
    p.id = nextIo_++;
    p.group = group;
    p.write = true;
    p.replaced = std::move(replaced);
    try
    {
        p.tickets.reserve(count);
        p.keys.reserve(count);
        for (; p.count < count; ++p.count)
        {
            std::string const& key = g.keys[size_t(slots[p.count])];
            p.keys.push_back(key);
            p.tickets.push_back(g.region->submitWrite(key, srcs[p.count], g.pageBytes, g.tags[size_t(slots[p.count])]));
        }
    }
    catch (std::exception const& e)
    {
        p.submitError = e.what();
        p.keys.resize(p.tickets.size());
        p.count = p.tickets.size();
    }
    return BlobIo{p.id};
}

bool DiskColdLevel::finishWrite(Pending& p, std::string& error) noexcept
{
    Group& g = groups_[size_t(p.group)];
    bool ok = p.submitError.empty();
    if (!ok)
    {
        error = p.submitError;
    }
    std::vector<bool> written(p.count, false);
    for (size_t i = 0; i < p.count; ++i)
    {
        disk::Status const s = p.awaited ? p.results[i] : g.region->wait(p.tickets[i]);
        written[i] = s.code == disk::StatusCode::kOk;
        if (!written[i] && ok)
        {
            ok = false;
            error = "disk write of cold pool group " + std::to_string(p.group) + " failed (" + disk::statusName(s.code)
                + "): " + s.message;
        }
    }
    if (!ok)
    {
        // All or nothing: the pages stay at their source, so their blobs must not stay here.
        for (size_t i = 0; i < p.count; ++i)
        {
            if (written[i])
            {
                std::string ignored;
                eraseNow(g, p.keys[i], ignored);
            }
        }
    }
    settleReplaced(p, written, ok);
    return ok;
}

void DiskColdLevel::settleReplaced(Pending& p, std::vector<bool> const& onDisk, bool ok) noexcept
{
    Group& g = groups_[size_t(p.group)];
    for (Replaced& r : p.replaced)
    {
        std::string const key = "k" + r.contentKey;
        auto const at = std::find(p.keys.begin(), p.keys.end(), key);
        bool const landed = at != p.keys.end() && onDisk[size_t(at - p.keys.begin())];
        Group& owner = groups_[size_t(r.page.group)];
        bool const sameRegion = &owner == &g;
        // In the same region the new blob's durable record replaced the old one (and the
        // all-or-nothing erase of a failed batch removed both). In another region the old blob
        // stays until erased here, after the new one is durable.
        if (!landed || (!ok && !sameRegion))
        {
            try
            {
                found_.emplace(r.contentKey, r.page); // Still on disk, unclaimed: findable again.
            }
            catch (...)
            {
                // Out of memory: the blob stays on disk, found again at the next open.
            }
            continue;
        }
        if (!sameRegion)
        {
            std::string ignored;
            eraseNow(owner, key, ignored); // Before the call returns: the new page is acknowledged.
        }
        if (owner.keys[size_t(r.page.slot)] == key)
        {
            owner.keys[size_t(r.page.slot)].clear();
        }
        owner.slots.give(r.page.slot, nullptr);
    }
    p.replaced.clear();
}

void DiskColdLevel::awaitIo(BlobIo io) noexcept
{
    Pending* p = nullptr;
    disk::DiskRegion* region = nullptr;
    {
        std::lock_guard<std::recursive_mutex> lock(mu_);
        p = pending(io);
        if (p == nullptr || p->awaited)
        {
            return;
        }
        region = groups_[size_t(p->group)].region.get();
    }
    // Outside the lock: only the owner of the handle completes (or erases) this entry, after
    // this returns; the region's waits are thread-safe.
    std::vector<disk::Status> results(p->tickets.size());
    for (size_t i = 0; i < p->tickets.size(); ++i)
    {
        if (p->tickets[i] != 0)
        {
            try
            {
                results[i] = region->wait(p->tickets[i]);
            }
            catch (std::exception const& e)
            {
                results[i] = disk::Status{disk::StatusCode::kIoError, e.what()};
            }
        }
    }
    std::lock_guard<std::recursive_mutex> lock(mu_);
    p->results = std::move(results);
    p->awaited = true;
}

bool DiskColdLevel::complete(BlobIo io, std::string& error) noexcept
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Pending* found = pending(io);
    if (found == nullptr)
    {
        error = "the disk level could not take the batch (out of memory) or completed it already";
        return false;
    }
    Pending p = std::move(*found);
    pending_.remove_if([&](Pending const& q) { return &q == found; });
    if (p.write)
    {
        return finishWrite(p, error);
    }
    if (!p.submitError.empty())
    {
        error = p.submitError;
        return false;
    }
    thread_local std::vector<disk::StatusCode> codes;
    thread_local std::vector<std::string> messages;
    finishRead(p, codes, messages);
    bool ok = true;
    for (size_t i = 0; i < p.count; ++i)
    {
        disk::StatusCode const c = codes[i];
        p.status[i] = c == disk::StatusCode::kOk       ? BlobStatus::kOk
            : c == disk::StatusCode::kNotFound         ? BlobStatus::kMissing
            : c == disk::StatusCode::kChecksumMismatch ? BlobStatus::kCorrupt
                                                       : BlobStatus::kFailed;
        if (p.status[i] == BlobStatus::kFailed && ok)
        {
            ok = false;
            error = "disk read of cold pool group " + std::to_string(p.group) + " failed (" + disk::statusName(c)
                + "): " + messages[i];
        }
    }
    return ok;
}

void DiskColdLevel::release(PoolGroupIndex group, int32_t slot) noexcept
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Group& g = groups_[size_t(group)];
    try
    {
        g.erasing.push_back(g.region->submitErase(g.keys[size_t(slot)]));
    }
    catch (...)
    {
        // A closed or failed region: the blob is unreachable either way.
    }
    g.keys[size_t(slot)].clear();
}

std::optional<DiskColdLevel::Found> DiskColdLevel::claim(std::string const& key)
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto it = found_.find(key);
    if (it == found_.end())
    {
        return std::nullopt;
    }
    Found const f = it->second;
    found_.erase(it);
    return f;
}

size_t DiskColdLevel::forgetUnclaimed()
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    size_t const n = found_.size();
    for (auto const& [key, f] : found_)
    {
        Group& g = groups_[size_t(f.group)];
        g.erasing.push_back(g.region->submitErase("k" + key));
        g.keys[size_t(f.slot)].clear();
        g.slots.give(f.slot, nullptr);
    }
    found_.clear();
    return n;
}

bool DiskColdLevel::copyOut(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count,
    Stream stream, std::string& error) noexcept
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (!synchronize(stream, error))
    {
        return false;
    }
    thread_local std::vector<BlobStatus> status;
    status.resize(count);
    Pending* p = pending(submitRead(group, slots, dsts, count, status.data()));
    if (p == nullptr)
    {
        error = "the disk level could not take the batch (out of memory)";
        return false;
    }
    Pending batch = std::move(*p);
    pending_.remove_if([&](Pending const& q) { return &q == p; });
    if (!batch.submitError.empty())
    {
        error = batch.submitError;
        return false;
    }
    std::vector<disk::StatusCode> codes;
    std::vector<std::string> messages;
    finishRead(batch, codes, messages);
    for (size_t i = 0; i < count; ++i)
    {
        if (codes[i] != disk::StatusCode::kOk)
        {
            error = "disk read of cold pool group " + std::to_string(group) + " failed (" + disk::statusName(codes[i])
                + "): " + messages[i];
            return false;
        }
    }
    return true;
}

bool DiskColdLevel::copyIn(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count,
    Stream stream, std::string& error) noexcept
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return synchronize(stream, error) && complete(submitAssigned(group, slots, srcs, count), error);
}

bool DiskColdLevel::synchronize(Stream stream, std::string& error) noexcept
{
    try
    {
        runtime_.synchronize(stream);
        return true;
    }
    catch (std::exception const& e)
    {
        error = e.what();
        return false;
    }
}

} // namespace kvcodec::kvcm

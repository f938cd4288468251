// SPDX-License-Identifier: Apache-2.0
#include "kvcm/disk_level.h"

#include <algorithm>
#include <stdexcept>

namespace kvcodec::kvcm {
namespace {

constexpr uint64_t kMinPageRingBytes = 64ull << 20;

std::string anonymousKey(int32_t slot)
{
    return "a" + std::to_string(slot);
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

DiskColdLevel::DiskColdLevel(
    runtime::DeviceRuntime& runtime, DiskTierConfig const& config, std::vector<GroupSpec> const& specs)
    : runtime_(runtime)
{
    groups_.reserve(specs.size());
    for (size_t g = 0; g < specs.size(); ++g)
    {
        GroupSpec const& spec = specs[g];
        disk::RegionConfig rc;
        rc.name = "group" + std::to_string(g);
        rc.slotBytes = spec.pageBytes;
        rc.maxBytes = spec.maxBytes;
        rc.containerBytes = std::min(config.containerBytes, spec.maxBytes);
        rc.codec = {config.codecName, config.formatVersion, config.paramHash, config.paramsJson};
        rc.ioMode = disk::IoMode(config.ioMode);
        rc.whenFull = disk::FullPolicy::kRefuse; // The manager owns placement: the region never evicts its pages.
        rc.ioThreads = config.ioThreads;
        rc.layoutJson = config.layoutJson;
        if (!config.faults.empty())
        {
            std::vector<disk::FaultRule> rules;
            for (auto const& [op, part, after, err, torn, count] : config.faults)
            {
                rules.push_back({op, part, after, err, torn, count});
            }
            rc.fileIo = disk::faultyFileIo(std::move(rules));
        }
        std::string const dir = config.path + "/" + rc.name;
        Group group;
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
    Group& g = groups_[size_t(group)];
    if (contentKey.empty())
    {
        g.keys[size_t(slot)] = anonymousKey(slot);
    }
    else
    {
        g.keys[size_t(slot)] = "k" + contentKey;
        // A page written under a key an unclaimed found page holds replaces it.
        auto it = found_.find(contentKey);
        if (it != found_.end())
        {
            Group& owner = groups_[size_t(it->second.group)];
            std::string error;
            eraseNow(owner, "k" + contentKey, error);
            owner.slots.give(it->second.slot, nullptr);
            found_.erase(it);
        }
    }
    g.tags[size_t(slot)] = uint32_t(lifeCycle);
}

bool DiskColdLevel::write(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count,
    std::string& error) noexcept
{
    Group& g = groups_[size_t(group)];
    waitErases(g); // Retired blobs give their region slots back once durable.
    thread_local std::vector<disk::Ticket> tickets;
    tickets.clear();
    bool ok = true;
    size_t submitted = 0;
    try
    {
        for (; submitted < count; ++submitted)
        {
            int32_t const s = slots[submitted];
            tickets.push_back(g.region->submitWrite(g.keys[size_t(s)], srcs[submitted], g.pageBytes, g.tags[size_t(s)]));
        }
    }
    catch (std::exception const& e)
    {
        ok = false;
        error = e.what();
    }
    std::vector<bool> written(submitted, false);
    for (size_t i = 0; i < submitted; ++i)
    {
        disk::Status const s = g.region->wait(tickets[i]);
        written[i] = s.code == disk::StatusCode::kOk;
        if (!written[i] && ok)
        {
            ok = false;
            error = "disk write of cold pool group " + std::to_string(group) + " failed ("
                + disk::statusName(s.code) + "): " + s.message;
        }
    }
    if (!ok)
    {
        // All or nothing: the pages stay at their source, so their blobs must not stay here.
        for (size_t i = 0; i < submitted; ++i)
        {
            if (written[i])
            {
                std::string ignored;
                eraseNow(g, g.keys[size_t(slots[i])], ignored);
            }
        }
    }
    return ok;
}

void DiskColdLevel::read(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count,
    std::vector<disk::StatusCode>& status, std::vector<std::string>& messages) noexcept
{
    Group& g = groups_[size_t(group)];
    thread_local std::vector<disk::Ticket> tickets;
    tickets.assign(count, 0);
    status.assign(count, disk::StatusCode::kIoError);
    messages.assign(count, std::string());
    for (size_t i = 0; i < count; ++i)
    {
        try
        {
            tickets[i] = g.region->submitRead(g.keys[size_t(slots[i])], dsts[i], g.pageBytes);
        }
        catch (std::exception const& e)
        {
            messages[i] = e.what();
        }
    }
    for (size_t i = 0; i < count; ++i)
    {
        if (tickets[i] != 0)
        {
            disk::Status const s = g.region->wait(tickets[i]);
            status[i] = s.code;
            messages[i] = s.message;
        }
    }
}

void DiskColdLevel::release(PoolGroupIndex group, int32_t slot) noexcept
{
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
    try
    {
        runtime_.synchronize(stream);
    }
    catch (std::exception const& e)
    {
        error = e.what();
        return false;
    }
    std::vector<disk::StatusCode> status;
    std::vector<std::string> messages;
    read(group, slots, dsts, count, status, messages);
    for (size_t i = 0; i < count; ++i)
    {
        if (status[i] != disk::StatusCode::kOk)
        {
            error = "disk read of cold pool group " + std::to_string(group) + " failed ("
                + disk::statusName(status[i]) + "): " + messages[i];
            return false;
        }
    }
    return true;
}

bool DiskColdLevel::copyIn(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count,
    Stream stream, std::string& error) noexcept
{
    try
    {
        runtime_.synchronize(stream);
    }
    catch (std::exception const& e)
    {
        error = e.what();
        return false;
    }
    return write(group, slots, srcs, count, error);
}

} // namespace kvcodec::kvcm

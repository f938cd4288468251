// SPDX-License-Identifier: Apache-2.0
//
// Resize and defragmentation. Hot and addressable levels move the pages beyond the new slot
// count with the migration transaction (compact()); a staged level places its blobs itself, so
// the manager only renumbers its logical slots and the level moves its bytes (renumberStaged()).
#include "kvcm/manager.h"

#include <algorithm>

namespace kvcodec::kvcm {

uint64_t KvCacheManager::hotCapacitySlots(PoolGroupIndex group) const
{
    CallGuard guard(*this, "hotCapacitySlots");
    auto const& groups = storage_->hotGroups();
    if (group < 0 || size_t(group) >= groups.size())
    {
        throw std::invalid_argument("pool group is " + std::to_string(group) + "; the hot level has "
            + std::to_string(groups.size()) + " pool groups");
    }
    return groups[size_t(group)].capacitySlots;
}

void KvCacheManager::checkResizable(CacheLevel level) const
{
    ColdLevel const* cold = storage_->coldLevel(level);
    if (char const* why = cold != nullptr ? cold->fixedGeometry() : nullptr)
    {
        throw std::invalid_argument(why);
    }
}

uint64_t KvCacheManager::compact(CacheLevel level, std::vector<uint64_t> const& limits, Stream stream)
{
    // Page indices in slots at or above their group's limit; every other free slot of the group
    // is withheld so the relocation can only land below the limit.
    std::vector<PageId> ids;
    for (uint32_t index = 0; index < pages_.size(); ++index)
    {
        Page const& p = pages_[index];
        if (p.level == int8_t(level) && uint64_t(p.slot) >= limits[size_t(storage_->poolGroup(level, p.lifeCycle))])
        {
            ids.push_back(pages_.id(index));
        }
    }
    if (ids.empty())
    {
        return 0;
    }
    size_t const groups = storage_->numPoolGroups(level);
    for (size_t g = 0; g < groups; ++g)
    {
        storage_->slots(level, PoolGroupIndex(g)).withhold(limits[g]);
    }
    MigrationResult moved;
    try
    {
        moved = migrate(ids.data(), ids.size(), level, stream);
    }
    catch (...)
    {
        for (size_t g = 0; g < groups; ++g)
        {
            storage_->slots(level, PoolGroupIndex(g)).restore();
        }
        throw;
    }
    for (size_t g = 0; g < groups; ++g)
    {
        storage_->slots(level, PoolGroupIndex(g)).restore();
    }
    return moved.moved;
}

void KvCacheManager::resize(CacheLevel level, uint64_t quotaBytes, std::optional<Stream> stream)
{
    CallGuard guard(*this, "resize");
    waitJobs(nullptr);          // No staged transfer may hold a page or slot that moves.
    checkLevel(level, "level"); // Every level the manager has can be resized.
    checkResizable(level);
    if (quotaBytes == 0)
    {
        throw std::invalid_argument(std::string("quota_bytes is 0; a level's quota must be positive (the ")
            + levelName(level) + " level cannot be removed at run time)");
    }
    if (kindOf(level) == LevelKind::kStaged)
    {
        resizeStaged(level, quotaBytes, stream ? *stream : stream_);
        return;
    }
    std::vector<uint64_t> const target = storage_->projectSlots(level, quotaBytes);
    size_t const groups = storage_->numPoolGroups(level);
    // Everything is checked before anything changes.
    for (size_t g = 0; g < groups; ++g)
    {
        SlotPool& pool = storage_->slots(level, PoolGroupIndex(g));
        if (level == CacheLevel::kHot && target[g] > storage_->hotGroups()[g].capacitySlots)
        {
            throw std::invalid_argument("quota_bytes is " + std::to_string(quotaBytes) + ": hot pool group "
                + std::to_string(g) + " would need " + std::to_string(target[g])
                + " slots but its pools were reserved for " + std::to_string(storage_->hotGroups()[g].capacitySlots)
                + " (config.maxGpuQuotaBytes is "
                + std::to_string(std::max(storage_->config().maxGpuQuotaBytes, storage_->config().gpuQuotaBytes))
                + "); the hot pools never move, so raise max_gpu_quota at construction");
        }
        uint64_t const used = pool.usedSlots();
        size_t const candidates = lru_.live(level, PoolGroupIndex(g));
        if (used > target[g] && used - target[g] > candidates)
        {
            throw CapacityError("cannot resize the " + std::string(levelName(level)) + " level to "
                + std::to_string(quotaBytes) + " bytes: its pool group " + std::to_string(g) + " would have "
                + std::to_string(target[g]) + " slots but holds " + std::to_string(used) + " pages of which only "
                + std::to_string(candidates) + " are evictable (the others are pinned); nothing was changed");
        }
    }
    Stream const s = stream ? *stream : stream_;
    // Shrinking: evict what no longer fits, then move the pages beyond the new count below it.
    bool shrinks = false;
    for (size_t g = 0; g < groups; ++g)
    {
        SlotPool& pool = storage_->slots(level, PoolGroupIndex(g));
        if (target[g] < pool.numSlots())
        {
            shrinks = true;
            makeRoom(level, PoolGroupIndex(g), pool.numSlots() - target[g], s);
        }
    }
    if (shrinks)
    {
        std::vector<uint64_t> limits(groups);
        for (size_t g = 0; g < groups; ++g)
        {
            limits[g] = std::min(target[g], storage_->slots(level, PoolGroupIndex(g)).numSlots());
        }
        compact(level, limits, s);
    }
    if (level == CacheLevel::kHot)
    {
        for (size_t g = 0; g < groups; ++g)
        {
            storage_->hotGroup(PoolGroupIndex(g)).slots.setNumSlots(target[g]);
        }
    }
    else
    {
        storage_->coldLevel(level)->applyQuota(target, quotaBytes);
    }
    storage_->setQuota(level, quotaBytes);
}

uint64_t KvCacheManager::defragment(CacheLevel level, std::optional<Stream> stream)
{
    CallGuard guard(*this, "defragment");
    waitJobs(nullptr);          // No staged transfer may hold a page or slot that moves.
    checkLevel(level, "level"); // Every level the manager has can be defragmented.
    checkResizable(level);
    if (kindOf(level) == LevelKind::kStaged)
    {
        return defragmentStaged(level);
    }
    size_t const groups = storage_->numPoolGroups(level);
    std::vector<uint64_t> limits(groups);
    for (size_t g = 0; g < groups; ++g)
    {
        limits[g] = storage_->slots(level, PoolGroupIndex(g)).usedSlots();
    }
    uint64_t const moved = compact(level, limits, stream ? *stream : stream_);
    for (size_t g = 0; g < groups; ++g)
    {
        SlotPool& pool = storage_->slots(level, PoolGroupIndex(g));
        pool.setNumSlots(pool.numSlots()); // The free list restarts at the lowest free slot.
    }
    return moved;
}

void KvCacheManager::renumberStaged(CacheLevel level, std::vector<uint64_t> const& limits)
{
    // Logical slots only: a staged page's bytes live wherever its level put them, under its name.
    ColdLevel* cold = storage_->coldLevel(level);
    size_t const groups = limits.size();
    std::vector<std::vector<int32_t>> vacated(groups);
    for (size_t g = 0; g < groups; ++g)
    {
        cold->slots(PoolGroupIndex(g)).withhold(limits[g]);
    }
    for (uint32_t index = 0; index < pages_.size(); ++index)
    {
        Page& p = pages_[index];
        if (p.level != int8_t(level))
        {
            continue;
        }
        auto const g = size_t(storage_->poolGroup(level, p.lifeCycle));
        if (uint64_t(p.slot) < limits[g])
        {
            continue;
        }
        SlotPool& pool = cold->slots(PoolGroupIndex(g));
        int32_t const to = pool.take(); // Free slots below the limit >= pages above it (checked by the caller).
        cold->moveSlot(PoolGroupIndex(g), p.slot, to);
        vacated[g].push_back(p.slot);
        p.slot = to;
    }
    for (size_t g = 0; g < groups; ++g)
    {
        std::vector<int32_t> const more = cold->renumberUnclaimed(PoolGroupIndex(g), limits[g]);
        vacated[g].insert(vacated[g].end(), more.begin(), more.end());
        SlotPool& pool = cold->slots(PoolGroupIndex(g));
        pool.restore();
        for (int32_t s : vacated[g])
        {
            pool.give(s, nullptr);
        }
    }
}

void KvCacheManager::resizeStaged(CacheLevel level, uint64_t quotaBytes, Stream stream)
{
    ColdLevel* cold = storage_->coldLevel(level);
    std::vector<uint64_t> const target = storage_->projectSlots(level, quotaBytes);
    size_t const groups = cold->numPoolGroups();
    for (size_t g = 0; g < groups; ++g)
    {
        SlotPool& pool = cold->slots(PoolGroupIndex(g));
        uint64_t const used = pool.usedSlots();
        size_t const candidates = lru_.live(level, PoolGroupIndex(g)) + cold->numUnclaimed(PoolGroupIndex(g));
        if (used > target[g] && used - target[g] > candidates)
        {
            throw CapacityError("cannot resize the " + std::string(levelName(level)) + " level to "
                + std::to_string(quotaBytes) + " bytes: its pool group " + std::to_string(g) + " would have "
                + std::to_string(target[g]) + " slots but holds " + std::to_string(used) + " pages of which only "
                + std::to_string(candidates) + " are evictable (the others are pinned); nothing was changed");
        }
    }
    // What does not fit is evicted (dropped at the last level), unclaimed blobs kept from a
    // previous manager first (nobody asked for them), then the least recently used.
    std::vector<uint64_t> limits(groups);
    for (size_t g = 0; g < groups; ++g)
    {
        SlotPool& pool = cold->slots(PoolGroupIndex(g));
        if (target[g] < pool.numSlots())
        {
            uint64_t const need = pool.numSlots() - target[g];
            if (pool.freeSlots() < need)
            {
                cold->dropUnclaimed(PoolGroupIndex(g), size_t(need - pool.freeSlots()));
            }
            makeRoom(level, PoolGroupIndex(g), need, stream);
        }
        limits[g] = std::min(target[g], pool.numSlots());
    }
    renumberStaged(level, limits);
    cold->applyQuota(target, quotaBytes);
}

uint64_t KvCacheManager::defragmentStaged(CacheLevel level)
{
    ColdLevel* cold = storage_->coldLevel(level);
    size_t const groups = cold->numPoolGroups();
    std::vector<uint64_t> limits(groups);
    for (size_t g = 0; g < groups; ++g)
    {
        limits[g] = cold->slots(PoolGroupIndex(g)).usedSlots();
    }
    renumberStaged(level, limits);
    for (size_t g = 0; g < groups; ++g)
    {
        SlotPool& pool = cold->slots(PoolGroupIndex(g));
        pool.setNumSlots(pool.numSlots()); // The free list restarts at the lowest free slot.
    }
    return cold->defragmentBlobs();
}

} // namespace kvcodec::kvcm

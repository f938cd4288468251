// SPDX-License-Identifier: Apache-2.0
//
// Eviction: recency (touch), pins and priorities, and makeRoom(), which evicts a pool group's
// next victims to the next colder level with the migration transaction (the last level drops).
// The remote level is never an automatic target: pages reach a shared store only when a caller
// migrates them there (a store write per eviction under pressure would surprise an engine).
#include "kvcm/manager.h"

namespace kvcodec::kvcm {

std::optional<CacheLevel> KvCacheManager::colderLevel(CacheLevel level) const noexcept
{
    for (int l = int(level) + 1; l < kNumLevels; ++l)
    {
        if (CacheLevel(l) != CacheLevel::kRemote && storage_->hasLevel(CacheLevel(l)))
        {
            return CacheLevel(l);
        }
    }
    return std::nullopt;
}

void KvCacheManager::touch(PageId const* ids, size_t count)
{
    CallGuard guard(*this, "touch");
    for (size_t i = 0; i < count; ++i)
    {
        pages_.resolve(ids[i], i); // All checked before any changes.
    }
    for (size_t i = 0; i < count; ++i)
    {
        uint32_t const index = uint32_t(ids[i] & 0xffffffffu);
        lru_.erase(index);
        Page& p = pages_[index];
        p.tick = ++clock_;
        lru_.insert(index);
        ++stats_[size_t(p.level)][size_t(storage_->poolGroup(CacheLevel(p.level), p.lifeCycle))].hits;
    }
}

void KvCacheManager::pin(PageId const* ids, size_t count, bool pinned)
{
    CallGuard guard(*this, "pin");
    for (size_t i = 0; i < count; ++i)
    {
        uint32_t const index = pages_.resolve(ids[i], i);
        if (!pinned && pages_[index].pins == 0)
        {
            throw std::invalid_argument("pages[" + std::to_string(i) + "] (page " + hexId(ids[i])
                + ") is not pinned; unpin only pages pinned before (pins nest)");
        }
    }
    for (size_t i = 0; i < count; ++i)
    {
        uint32_t const index = uint32_t(ids[i] & 0xffffffffu);
        Page& p = pages_[index];
        if (pinned)
        {
            lru_.erase(index);
            ++p.pins;
        }
        else if (--p.pins == 0)
        {
            lru_.insert(index);
        }
    }
}

void KvCacheManager::setPriority(PageId const* ids, size_t count, int32_t priority)
{
    CallGuard guard(*this, "setPriority");
    for (size_t i = 0; i < count; ++i)
    {
        pages_.resolve(ids[i], i);
    }
    for (size_t i = 0; i < count; ++i)
    {
        uint32_t const index = uint32_t(ids[i] & 0xffffffffu);
        lru_.erase(index);
        pages_[index].priority = priority;
        lru_.insert(index);
    }
}

uint32_t KvCacheManager::pins(PageId id) const
{
    CallGuard guard(*this, "pins");
    return pages_[pages_.resolve(id, 0)].pins;
}

size_t KvCacheManager::evictable(CacheLevel level, PoolGroupIndex group) const
{
    CallGuard guard(*this, "evictable");
    checkLevel(level, "level");
    if (group < 0 || size_t(group) >= lru_.numGroups(level))
    {
        throw std::invalid_argument("pool group is " + std::to_string(group) + "; the " + levelName(level)
            + " level has " + std::to_string(lru_.numGroups(level)) + " pool groups");
    }
    return lru_.live(level, group);
}

void KvCacheManager::makeRoom(CacheLevel level, PoolGroupIndex group, uint64_t freeSlots, std::optional<Stream> stream)
{
    CallGuard guard(*this, "makeRoom");
    SlotPool& pool = storage_->slots(level, group);
    if (pool.freeSlots() >= freeSlots)
    {
        return;
    }
    if (hasJobs() && evictable(level, group) + pool.freeSlots() < freeSlots)
    {
        waitJobs(nullptr); // Pages in flight free their slots (or become evictable) when they land.
        if (pool.freeSlots() >= freeSlots)
        {
            return;
        }
    }
    size_t const candidates = evictable(level, group);
    uint64_t const need = freeSlots - pool.freeSlots();
    if (candidates < need)
    {
        throw CapacityError(std::string("cannot free ") + std::to_string(freeSlots) + " slots in the "
            + levelName(level) + " level's pool group " + std::to_string(group) + ": it has "
            + std::to_string(pool.freeSlots()) + " free of " + std::to_string(pool.numSlots()) + " slots and "
            + std::to_string(candidates) + " evictable pages (the others are pinned)");
    }
    // Victims are copied out first: the cascade below changes other levels' orders only.
    std::vector<uint32_t> victims;
    lru_.victims(lru_.queue(level, group), size_t(need), victims);
    auto& stats = stats_[size_t(level)][size_t(group)];
    std::optional<CacheLevel> const next = colderLevel(level);
    if (!next)
    {
        // The last level drops: the page is gone, its handles stale (the engine sees a miss).
        for (uint32_t index : victims)
        {
            Page const& p = pages_[index];
            if (ColdLevel* cold = tracking(level))
            {
                cold->release(group, p.slot);
            }
            pool.give(p.slot, pool.ready(p.slot));
            releasePage(index);
        }
        stats.drops += need;
        return;
    }
    std::vector<uint64_t> needs(storage_->numPoolGroups(*next), 0);
    for (uint32_t index : victims)
    {
        ++needs[size_t(storage_->poolGroup(*next, pages_[index].lifeCycle))];
    }
    for (size_t g = 0; g < needs.size(); ++g)
    {
        if (needs[g] > 0)
        {
            makeRoom(*next, PoolGroupIndex(g), needs[g], stream);
        }
    }
    std::vector<PageId> ids;
    ids.reserve(victims.size());
    for (uint32_t index : victims)
    {
        ids.push_back(pages_.id(index));
    }
    // The normal migration transaction; ordered after the caller's work on `stream`.
    MigrationResult const moved = migrate(ids.data(), ids.size(), *next, stream ? *stream : stream_);
    stats.evictions += moved.moved;
}

} // namespace kvcodec::kvcm

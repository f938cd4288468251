// SPDX-License-Identifier: Apache-2.0
//
// Eviction queues of the KV-cache manager: per level, per pool group of that level's grouping,
// the unpinned live pages in eviction order (lowest priority first, then least recently used).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "kvcm/page_table.h"
#include "kvcm/storage.h"

namespace kvcodec::kvcm {

// One entry of a pool group's eviction queue. Entries are never searched for: a page leaves
// its queue by clearing its stamp (O(1)), and stale entries are skipped when victims are taken
// or swept out when they outnumber the live ones.
struct LruEntry
{
    int32_t priority;
    uint32_t index;
    uint64_t tick;
    uint64_t stamp;
};

// Eviction order of one pool group: a binary min-heap on (priority, tick, index), front = next
// victim. A page inserted with a new tick (allocation, touch, onboarding) lands at a leaf and
// stays there, so the migration path pays a push_back and one comparison per page.
struct LruQueue
{
    std::vector<LruEntry> heap;
    size_t live = 0; ///< Entries whose page is still queued here (the evictable pages).
};

inline bool laterVictimOf(LruEntry const& a, LruEntry const& b) noexcept
{
    if (a.priority != b.priority)
    {
        return a.priority > b.priority;
    }
    if (a.tick != b.tick)
    {
        return a.tick > b.tick;
    }
    return a.index > b.index;
}

class EvictionQueues
{
public:
    explicit EvictionQueues(PageTable& pages) noexcept
        : pages_(pages)
    {
    }

    /// One queue per pool group of every level `storage` has (called once, at construction).
    void attach(StorageManager const& storage);

    [[nodiscard]] LruQueue& queue(CacheLevel level, PoolGroupIndex group) noexcept
    {
        return queues_[size_t(level)][size_t(group)];
    }
    /// Pool groups of `level` with a queue (0 once the level was closed).
    [[nodiscard]] size_t numGroups(CacheLevel level) const noexcept
    {
        return queues_[size_t(level)].size();
    }
    /// Evictable pages of one pool group.
    [[nodiscard]] size_t live(CacheLevel level, PoolGroupIndex group) const noexcept
    {
        return queues_[size_t(level)][size_t(group)].live;
    }
    /// Drops the queues of a level that is closed.
    void clear(CacheLevel level) noexcept
    {
        queues_[size_t(level)].clear();
    }

    /// (Re)queues a page at its level and group unless it is free or pinned.
    void insert(uint32_t index);
    /// Takes a page out of its queue (O(1): its entry goes stale).
    void erase(uint32_t index) noexcept;
    /// Queues an unpinned page that is in no queue (its level and group are q's).
    inline void push(LruQueue& q, Page& p, uint32_t index);
    /// The `count` next victims of a queue in eviction order; they stay queued (stale entries
    /// met on the way are dropped).
    void victims(LruQueue& q, size_t count, std::vector<uint32_t>& out);

private:
    void sweep(LruQueue& q);

    PageTable& pages_;
    StorageManager const* storage_ = nullptr;
    std::array<std::vector<LruQueue>, kNumLevels> queues_;
    uint64_t serial_ = 0; ///< Last stamp given to a queue entry.
};

// Inline: the migration commit loop calls it per page.
inline void EvictionQueues::push(LruQueue& q, Page& p, uint32_t index)
{
    if (q.heap.size() >= 2 * q.live + 64)
    {
        sweep(q); // Stale entries outnumber the live ones (amortized O(1) per insert).
    }
    LruEntry const entry{p.priority, index, p.tick, serial_ + 1};
    // Sift up by hand (std::push_heap re-reads the entry it just stored): a new tick is the
    // largest of its priority, so this usually stops at the first parent.
    size_t i = q.heap.size();
    q.heap.emplace_back();
    LruEntry* heap = q.heap.data();
    while (i > 0)
    {
        size_t const parent = (i - 1) / 2;
        if (!laterVictimOf(heap[parent], entry))
        {
            break;
        }
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = entry;
    p.lruStamp = ++serial_;
    ++q.live;
}

} // namespace kvcodec::kvcm

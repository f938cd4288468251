// SPDX-License-Identifier: Apache-2.0
#include "kvcm/eviction_queues.h"

namespace kvcodec::kvcm {

void EvictionQueues::attach(StorageManager const& storage)
{
    storage_ = &storage;
    for (int l = 0; l < kNumLevels; ++l)
    {
        queues_[size_t(l)].resize(storage.numPoolGroups(CacheLevel(l)));
    }
}

void EvictionQueues::sweep(LruQueue& q)
{
    if (q.live == 0)
    {
        q.heap.clear(); // All stale (every page left, as after migrating a whole batch away).
        return;
    }
    auto const stale = [&](LruEntry const& e) { return pages_[e.index].lruStamp != e.stamp; };
    q.heap.erase(std::remove_if(q.heap.begin(), q.heap.end(), stale), q.heap.end());
    std::make_heap(q.heap.begin(), q.heap.end(), laterVictimOf);
}

void EvictionQueues::insert(uint32_t index)
{
    erase(index); // At most one live entry per page.
    Page& p = pages_[index];
    if (p.level < 0 || p.pins > 0 || p.inFlight)
    {
        return;
    }
    auto const level = CacheLevel(p.level);
    push(queues_[size_t(level)][size_t(storage_->poolGroup(level, p.lifeCycle))], p, index);
}

void EvictionQueues::erase(uint32_t index) noexcept
{
    Page& p = pages_[index];
    if (p.lruStamp == 0)
    {
        return;
    }
    p.lruStamp = 0; // Its entry is stale from now on.
    auto const level = CacheLevel(p.level);
    auto& groups = queues_[size_t(level)];
    auto const g = size_t(storage_->mapping(level).empty() ? -1 : storage_->poolGroup(level, p.lifeCycle));
    if (g < groups.size())
    {
        --groups[g].live;
    }
}

void EvictionQueues::victims(LruQueue& q, size_t count, std::vector<uint32_t>& out)
{
    // Pops the next live entries (dropping the stale ones met on the way), then pushes the live
    // ones back: the queue keeps every page until a migration actually moves it out.
    out.clear();
    out.reserve(count);
    thread_local std::vector<LruEntry> taken;
    taken.clear();
    taken.reserve(count);
    while (taken.size() < count && !q.heap.empty())
    {
        std::pop_heap(q.heap.begin(), q.heap.end(), laterVictimOf);
        LruEntry const e = q.heap.back();
        q.heap.pop_back();
        if (pages_[e.index].lruStamp == e.stamp)
        {
            taken.push_back(e);
            out.push_back(e.index);
        }
    }
    for (LruEntry const& e : taken)
    {
        q.heap.push_back(e); // Within the capacity just popped: cannot throw.
        std::push_heap(q.heap.begin(), q.heap.end(), laterVictimOf);
    }
}

} // namespace kvcodec::kvcm

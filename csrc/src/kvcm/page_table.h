// SPDX-License-Identifier: Apache-2.0
//
// The KV-cache manager's page table: one record per page handle (level, slot, lifecycle,
// generation, pins, eviction state), a free list of records, and the id scheme that tells a live
// handle from a stale one.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvcm/config.h"

namespace kvcodec::kvcm {

/// A page handle: low 32 bits index the page table, high 32 bits its generation. A page keeps
/// its id across migrations; freeing (or dropping) it bumps the generation, so an old id is
/// recognized as stale.
using PageId = uint64_t;

/// A page id is stale (freed, dropped) or was never issued.
class StalePageError : public std::invalid_argument
{
public:
    using std::invalid_argument::invalid_argument;
};

/// One page record.
struct Page
{
    LifeCycleId lifeCycle = -1;
    int32_t slot = -1;
    uint32_t generation = 1;
    uint32_t mark = 0; ///< Epoch of the last duplicate check that saw the page.
    int8_t level = -1; ///< -1: free.
    uint32_t pins = 0;
    int32_t priority = 0;
    uint64_t tick = 0;     ///< Recency: larger is more recent.
    uint64_t lruStamp = 0; ///< Stamp of the page's live eviction-queue entry; 0: not queued.
    /// A staged transfer (a disk write or read on the manager's I/O thread) holds the page: it
    /// stays at its source level, out of the eviction queues, until the transfer is committed.
    bool inFlight = false;
    bool prefetched = false; ///< Brought to the host level by prefetch() and not used since.
};

/// "0x..." of a page id, for messages.
std::string hexId(PageId id);

inline PageId makeId(uint32_t index, uint32_t generation) noexcept
{
    return (PageId(generation) << 32) | index;
}

class PageTable
{
public:
    /// Generations start at a per-table random value, so an id of one manager is (with
    /// probability 1 - 2^-31) refused by another instead of naming its page.
    PageTable();

    [[nodiscard]] Page& operator[](uint32_t index) noexcept
    {
        return pages_[index];
    }
    [[nodiscard]] Page const& operator[](uint32_t index) const noexcept
    {
        return pages_[index];
    }
    [[nodiscard]] size_t size() const noexcept
    {
        return pages_.size();
    }
    [[nodiscard]] PageId id(uint32_t index) const noexcept
    {
        return makeId(index, pages_[index].generation);
    }

    /// The index of a live page; throws StalePageError naming `pages[position]` otherwise.
    uint32_t resolve(PageId id, size_t position) const;
    [[nodiscard]] bool isLive(PageId id) const noexcept;

    /// A free record (reused first), not yet live: the caller sets its level and slot.
    uint32_t add();
    /// Frees a record: level -1, pins and priority reset, generation bumped (old ids go stale).
    void release(uint32_t index) noexcept;

    /// Starts a duplicate check: every page marked with the returned epoch was seen by it.
    uint32_t nextEpoch() noexcept
    {
        if (++epoch_ == 0)
        {
            for (auto& p : pages_)
                p.mark = 0;
            epoch_ = 1;
        }
        return epoch_;
    }

private:
    std::vector<Page> pages_;
    std::vector<uint32_t> free_;
    uint32_t generationBase_ = 1; ///< First generation of every record.
    uint32_t epoch_ = 0;
};

} // namespace kvcodec::kvcm

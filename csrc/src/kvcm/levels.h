// SPDX-License-Identifier: Apache-2.0
//
// Storage levels: slot allocators, the hot pool groups, and the cold-level interface with its
// host-memory implementation. A cold level is one pool per cold pool group; whether its bytes
// are GPU-accessible (host tier) or not (a disk tier) is a property of the level, not a branch
// in the manager.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvcm/config.h"
#include "runtime/device_runtime.h"

namespace kvcodec::kvcm {

using runtime::EventPtr;
using runtime::Stream;

/// Fixed-size slots of one pool group. Each slot keeps the event after which its bytes may be
/// reused or read (the last transfer that touched it).
class SlotPool
{
public:
    explicit SlotPool(uint64_t numSlots);

    [[nodiscard]] uint64_t numSlots() const noexcept
    {
        return count_;
    }
    [[nodiscard]] uint64_t freeSlots() const noexcept
    {
        return free_.size();
    }
    [[nodiscard]] uint64_t usedSlots() const noexcept
    {
        return numSlots() - freeSlots() - withheld_.size();
    }
    [[nodiscard]] uint64_t peakUsedSlots() const noexcept
    {
        return peak_;
    }
    /// Returns the iteration peak and restarts it at the current use.
    uint64_t resetPeak() noexcept;

    /// Takes one free slot (lowest released first in LIFO order); the caller checked freeSlots().
    int32_t take() noexcept;
    /// Returns a slot; `ready` protects its bytes until the last transfer using them completed.
    void give(int32_t slot, EventPtr ready) noexcept;

    [[nodiscard]] EventPtr const& ready(int32_t slot) const noexcept
    {
        return ready_[size_t(slot)];
    }
    void setReady(int32_t slot, EventPtr ready) noexcept
    {
        ready_[size_t(slot)] = std::move(ready);
    }

    /// Withholds the free slots at or above `limit` from take() until restore(): a compaction
    /// then moves pages only into slots below `limit`.
    void withhold(uint64_t limit);
    void restore();
    [[nodiscard]] std::vector<int32_t> const& freeList() const noexcept
    {
        return free_;
    }
    /// Free slots at or above `limit` (withheld ones included).
    [[nodiscard]] uint64_t freeAtOrAbove(uint64_t limit) const noexcept;
    /// Changes the slot count (nothing withheld; every slot at or above the new count is free).
    /// The free list is rebuilt so take() returns the lowest free slot first; every slot keeps
    /// its ready event (also across a shrink and a later grow).
    void setNumSlots(uint64_t numSlots);

private:
    std::vector<int32_t> free_;
    std::vector<int32_t> withheld_;
    // Ready events of every slot the pool ever had: a slot cut off by a shrink keeps the event
    // of the copy that vacated it, so a later grow cannot hand it out before that copy finished.
    std::vector<EventPtr> ready_;
    uint64_t count_ = 0;
    uint64_t peak_ = 0;
};

/// One hot pool group: pools allocated together (slot s of every pool is one page). The pools
/// hold `capacitySlots` slots (the codec is configured with them once); `slots` is the usable
/// part, which a resize changes without moving the pools.
struct HotPoolGroup
{
    std::vector<runtime::Allocation> pools;
    uint64_t capacitySlots = 0;
    std::vector<uint64_t> slotBytes;
    std::vector<LifeCycleId> lifeCycles;
    uint64_t pageBytes = 0;
    SlotPool slots{0};
};

/// A cold storage level: one pool of fixed-size blobs per cold pool group.
class ColdLevel
{
public:
    virtual ~ColdLevel() = default;

    [[nodiscard]] virtual CacheLevel level() const noexcept = 0;
    [[nodiscard]] virtual size_t numPoolGroups() const noexcept = 0;
    [[nodiscard]] virtual uint64_t pageBytes(PoolGroupIndex group) const noexcept = 0;
    virtual SlotPool& slots(PoolGroupIndex group) noexcept = 0;

    /// GPU-accessible base of the group's pool (blob s at base + s * pageBytes), or null when the
    /// level is not addressable by the codec (a disk tier).
    [[nodiscard]] virtual std::byte* accessibleBase(PoolGroupIndex group) const noexcept = 0;

    /// An owner that keeps a group's GPU-accessible memory allocated while held (views of it),
    /// or null when the level has none.
    [[nodiscard]] virtual std::shared_ptr<void const> memoryOwner(PoolGroupIndex group) const
    {
        (void)group;
        return nullptr;
    }

    /// Host-readable address of one blob, for envelope checks, or null.
    [[nodiscard]] virtual std::byte const* hostBlob(PoolGroupIndex group, int32_t slot) const noexcept = 0;

    /// Raw blob copies out of this level into GPU-accessible addresses, ordered on `stream`.
    virtual bool copyOut(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count,
        Stream stream, std::string& error) noexcept
        = 0;

    /// Raw blob copies from GPU-accessible addresses into this level, ordered on `stream`.
    virtual bool copyIn(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count,
        Stream stream, std::string& error) noexcept
        = 0;
};

/// The host tier: one pinned, GPU-mapped pool per cold pool group.
class HostColdLevel final : public ColdLevel
{
public:
    /// `groups[g]` = (page bytes, slot count).
    HostColdLevel(runtime::DeviceRuntime& runtime, std::vector<std::pair<uint64_t, uint64_t>> const& groups);

    [[nodiscard]] CacheLevel level() const noexcept override
    {
        return CacheLevel::kHost;
    }
    [[nodiscard]] size_t numPoolGroups() const noexcept override
    {
        return pools_.size();
    }
    [[nodiscard]] uint64_t pageBytes(PoolGroupIndex group) const noexcept override
    {
        return pools_[size_t(group)].pageBytes;
    }
    SlotPool& slots(PoolGroupIndex group) noexcept override
    {
        return pools_[size_t(group)].slots;
    }
    [[nodiscard]] std::byte* accessibleBase(PoolGroupIndex group) const noexcept override
    {
        return pools_[size_t(group)].memory->data();
    }
    [[nodiscard]] std::byte const* hostBlob(PoolGroupIndex group, int32_t slot) const noexcept override
    {
        return pools_[size_t(group)].memory->data() + uint64_t(slot) * pools_[size_t(group)].pageBytes;
    }
    bool copyOut(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count, Stream stream,
        std::string& error) noexcept override;
    bool copyIn(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count, Stream stream,
        std::string& error) noexcept override;

    /// An owner of the group's pool memory (kept by views of it across resizes).
    [[nodiscard]] std::shared_ptr<void const> memoryOwner(PoolGroupIndex group) const override
    {
        return pools_[size_t(group)].memory;
    }

    /// Reallocates a group's pool with `numSlots` slots and copies the used blobs over (same
    /// slots). Every used slot is below `numSlots`; the host waits for every slot's last transfer
    /// first (the codec never keeps cold addresses, so nothing else refers to the old pool).
    void resize(PoolGroupIndex group, uint64_t numSlots);

private:
    struct Pool
    {
        // Shared: Python views of the pool hold it too, so a resize never frees memory a view
        // still reads (the view then shows the old pool).
        std::shared_ptr<runtime::HostMem> memory;
        uint64_t pageBytes;
        SlotPool slots;
    };

    bool copy(PoolGroupIndex group, int32_t const* slots, std::byte* const* others, size_t count, bool out,
        Stream stream, std::string& error) noexcept;

    runtime::DeviceRuntime& runtime_;
    std::vector<Pool> pools_;
};

} // namespace kvcodec::kvcm

// SPDX-License-Identifier: Apache-2.0
//
// Storage levels: slot allocators, the hot pool groups, and the cold-level interface with its
// host-memory implementation. A cold level is one pool per cold pool group; how a migration
// reaches its blobs (addressed directly, or staged through host buffers by submitted reads and
// writes) is a property of the level (ColdAccess), never a branch on a concrete level in the
// manager. Host memory, a disk tier, a remote store and a per-host daemon's client are all
// implementations of ColdLevel.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvcm/config.h"
#include "kvcm/staging.h"
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

    // --- Slots shared with other processes (a level whose slots a daemon hands out) ----------
    // Of such a pool's slots only those this manager holds are its own: the others stay withheld
    // (never taken, not counted as used) until adopted.

    /// Only `mine` are free; every other slot is withheld.
    void ownOnly(std::vector<int32_t> const& mine);
    /// Withheld slots become free (`asFree`) or used (a page already lies in them).
    void adopt(std::vector<int32_t> const& slots, bool asFree) noexcept;
    /// One withheld slot becomes free; false when it was not withheld.
    bool adoptOne(int32_t slot) noexcept;
    /// The next give() of `slot` withholds it instead of freeing it and lists it in retired().
    void retireOnGive(int32_t slot);
    /// Slots withheld by give() since the last call (with their ready events), emptied.
    std::vector<std::pair<int32_t, EventPtr>> takeRetired();

private:
    std::vector<int32_t> free_;
    std::vector<int32_t> withheld_;
    std::vector<uint8_t> retireOnGive_;
    std::vector<std::pair<int32_t, EventPtr>> retired_;
    std::vector<int64_t> withheldAt_; // After ownOnly(): each slot's index in withheld_, or -1.

    void withholdOne(int32_t slot) noexcept;
    bool unwithholdOne(int32_t slot) noexcept;
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

/// How a migration reaches a cold level's blobs. With the hot level this is what the manager's
/// (source, destination) migration-path table is indexed by.
enum class ColdAccess : uint8_t
{
    /// Blobs lie in memory both the codec and the host address directly (accessibleBase()): the
    /// codec encodes into and decodes from them, raw copies are copyBatch() calls.
    kAddressable,
    /// Blobs move through host buffers by submitted reads and writes (a disk tier, a remote
    /// store): a codec transfer goes through a staging slice (stage()), a raw copy reads into or
    /// writes from an addressable level's slots. The level places its blobs itself, so a page is
    /// never relocated inside it; a resize renumbers its logical slots (moveSlot()).
    kStaged,
};

/// Outcome of one blob of a staged read.
enum class BlobStatus : uint8_t
{
    kOk,
    kMissing, ///< The level holds no blob for the page any more: a cache miss, not a failure.
    kCorrupt, ///< The blob failed the level's own integrity check: a cache miss, not a failure.
    kFailed,  ///< The read failed (I/O): the transfer fails and nothing changes.
};

/// The name a staged blob is written under: the page's content key (empty: anonymous; a level
/// may keep keyed blobs across restarts, see claim()) and its lifecycle.
struct BlobName
{
    std::string const* contentKey;
    LifeCycleId lifeCycle;
};

/// A content-keyed blob a level kept from a previous manager, claimable by a new page.
struct ClaimedBlob
{
    PoolGroupIndex group;
    int32_t slot;
    LifeCycleId lifeCycle;
};

/// A staged read or write batch submitted to a level and not yet completed (ColdLevel::complete()).
/// Zero is never a valid handle.
struct BlobIo
{
    uint64_t id = 0;
};

/// A cold storage level: one pool of fixed-size blobs per cold pool group.
///
/// Every level implements the slot and raw-copy methods. An addressable level (access()) gives
/// accessibleBase(); a staged level implements stage(), submitRead(), submitWrite() and
/// complete() instead. The remaining virtuals have neutral defaults (nothing to release, no
/// keyed blobs kept across restarts, nothing to renumber) that a level overrides as it needs.
class ColdLevel
{
public:
    virtual ~ColdLevel() = default;

    [[nodiscard]] virtual CacheLevel level() const noexcept = 0;
    [[nodiscard]] virtual ColdAccess access() const noexcept
    {
        return ColdAccess::kAddressable;
    }
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
        Stream stream, std::string& error) noexcept = 0;

    /// Raw blob copies from GPU-accessible addresses into this level, ordered on `stream`.
    virtual bool copyIn(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count,
        Stream stream, std::string& error) noexcept = 0;

    // --- Blobs named per slot -------------------------------------------------------------

    /// True when the level must be told that a page left a slot (release()); the manager calls
    /// release() only for such levels, so a level that keeps nothing per slot costs nothing.
    [[nodiscard]] virtual bool tracksBlobs() const noexcept
    {
        return false;
    }
    /// The page left `slot` (freed, dropped, migrated away): its blob may be retired. The slot
    /// itself goes back to slots(group) separately.
    virtual void release(PoolGroupIndex group, int32_t slot) noexcept
    {
        (void)group;
        (void)slot;
    }

    // --- Staged I/O (access() == kStaged) ---------------------------------------------------

    /// A host staging slice for `count` blobs of `group` (blob i at data() + i * pageBytes):
    /// codec transfers encode into it before a write or decode from it after a read. `owner` is
    /// the stream whose work uses the slice (released after it), nullopt to acquire it
    /// synchronously (the host writes it first). Null with `error` when no slice is free.
    virtual std::optional<StagingBuffer> stage(
        PoolGroupIndex group, size_t count, std::optional<Stream> owner, std::string& error);
    /// Most blobs of `group` one staging slice should carry so that stage() always succeeds with
    /// no other slice live (0: the level does not stage).
    [[nodiscard]] virtual size_t maxStagedPages(PoolGroupIndex group) const noexcept
    {
        (void)group;
        return 0;
    }
    /// Submits reads of `count` blobs into host-writable `dsts`; `status[i]` is written by
    /// complete() (the array and `dsts` stay valid until then). Submission never fails: a page
    /// that cannot be submitted completes as kFailed.
    virtual BlobIo submitRead(
        PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count, BlobStatus* status) noexcept;
    /// Submits writes of `count` host-readable blobs into the (free, just taken) `slots`, each
    /// under `names[i]` (the arrays and `srcs` stay valid until complete()). All or nothing:
    /// when any write fails, complete() retires the ones that succeeded.
    virtual BlobIo submitWrite(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs,
        BlobName const* names, size_t count) noexcept;
    /// Waits for a submitted batch. A read returns false with `error` when a page failed (its
    /// status kFailed; a miss is not a failure); a write returns false with `error` when any page
    /// failed (then none of them is stored). Every handle is completed exactly once. On the CPU
    /// backend the manager's I/O thread completes reads itself, without the manager's lock, after
    /// awaitIo() (it decodes them there): a staged level guards the state complete() touches.
    virtual bool complete(BlobIo io, std::string& error) noexcept;
    /// Blocks until a submitted batch's I/O has finished, without completing it (complete() then
    /// returns at once). The one call a level must take from a thread other than the manager's
    /// callers (the manager's I/O thread, without the manager's lock), once per handle, while the
    /// manager goes on calling the level: a staged level guards its own state. Default: nothing.
    virtual void awaitIo(BlobIo io) noexcept
    {
        (void)io;
    }

    /// A page of `lifeCycle` landed in `slot` (its transfer complete after `written`), under
    /// content key `key` (empty: none). Called for every migration into the level.
    virtual void landed(
        PoolGroupIndex group, int32_t slot, LifeCycleId lifeCycle, std::string const& key, EventPtr const& written)
    {
        (void)group;
        (void)slot;
        (void)lifeCycle;
        (void)key;
        (void)written;
    }
    /// Work the level does between the manager's calls (the manager calls it at the start of
    /// its migrations and lookups, under its lock); with `waitWrites`, it first waits for the
    /// transfers still writing blobs it would act on (the end of a blocking call). Default: nothing.
    virtual void maintain(bool waitWrites)
    {
        (void)waitWrites;
    }
    /// True when blobs must pass verifyBlobs() before a decode reads them.
    [[nodiscard]] virtual bool verifiesBlobs() const noexcept
    {
        return false;
    }
    /// Per slot, `ok[i]` = 1 when it still holds the blob its page put or found there, else 0
    /// (a miss). Only slots whose writers completed are checked, so nothing is waited for.
    virtual void verifyBlobs(PoolGroupIndex group, int32_t const* slots, size_t count, uint8_t* ok) const noexcept
    {
        (void)group;
        (void)slots;
        std::fill(ok, ok + count, uint8_t(1));
    }
    /// verifyBlobs() without reading the blobs, for a caller that checksums them where it copies
    /// them (a GPU): `ok[i]` = 0 (the slot fails), 1 (it passes), or 2 (it passes once the first
    /// `length[i]` bytes of its blob have the CRC-32C `crc[i]`). Default: every slot passes.
    virtual void checkHeaders(PoolGroupIndex group, int32_t const* slots, size_t count, uint8_t* ok, uint32_t* crc,
        uint32_t* length) const noexcept
    {
        (void)group;
        (void)slots;
        (void)crc;
        (void)length;
        std::fill(ok, ok + count, uint8_t(1));
    }
    /// Why the level's slots cannot be resized or compacted, or null when they can.
    [[nodiscard]] virtual char const* fixedGeometry() const noexcept
    {
        return nullptr;
    }

    // --- Content-keyed blobs kept across restarts -------------------------------------------

    /// True when a page's blob is written under its content key, which the page then keeps.
    [[nodiscard]] virtual bool keepsKeys() const noexcept
    {
        return false;
    }
    /// Claims the unclaimed blob a previous manager left under content key `key`, or nullopt.
    virtual std::optional<ClaimedBlob> claim(std::string const& key)
    {
        (void)key;
        return std::nullopt;
    }
    /// claim() for `count` keys at once; `lifeCycles[i]` (or every lifecycle when negative or
    /// when `lifeCycles` is null) is the lifecycle the page is looked for under.
    virtual std::vector<std::optional<ClaimedBlob>> claimMany(
        std::string const* keys, int32_t const* lifeCycles, size_t count)
    {
        (void)lifeCycles;
        std::vector<std::optional<ClaimedBlob>> out;
        out.reserve(count);
        for (size_t i = 0; i < count; ++i)
        {
            out.push_back(claim(keys[i]));
        }
        return out;
    }
    /// Unclaimed blobs left by a previous manager (all groups, or one).
    [[nodiscard]] virtual size_t numUnclaimed() const noexcept
    {
        return 0;
    }
    [[nodiscard]] virtual size_t numUnclaimed(PoolGroupIndex group) const noexcept
    {
        (void)group;
        return 0;
    }
    /// Erases every unclaimed blob and frees its slot; returns how many.
    virtual size_t forgetUnclaimed()
    {
        return 0;
    }
    /// Erases up to `count` unclaimed blobs of `group` and frees their slots; returns how many.
    virtual size_t dropUnclaimed(PoolGroupIndex group, size_t count)
    {
        (void)group;
        (void)count;
        return 0;
    }

    // --- Resize and defragmentation -----------------------------------------------------------

    /// Slots per group for a quota when the level decides its own geometry (nullopt: the
    /// manager's projection of the construction split applies).
    [[nodiscard]] virtual std::optional<std::vector<uint64_t>> ownSlotCounts(uint64_t quota) const
    {
        (void)quota;
        return std::nullopt;
    }
    /// Staged levels: moves the name of the page in logical slot `from` to the free slot `to`
    /// (no I/O; the level keeps its bytes wherever it placed them).
    virtual void moveSlot(PoolGroupIndex group, int32_t from, int32_t to)
    {
        (void)group;
        (void)from;
        (void)to;
    }
    /// Staged levels: renumbers the unclaimed blobs of `group` at or above `limit` into slots
    /// taken from slots(group) (which withholds the slots at or above it); returns the vacated ones.
    virtual std::vector<int32_t> renumberUnclaimed(PoolGroupIndex group, uint64_t limit)
    {
        (void)group;
        (void)limit;
        return {};
    }
    /// Gives each group `slots[g]` slots for the quota `quota`; every used slot already lies
    /// below its group's new count. Throws when the level cannot (it keeps its old geometry).
    virtual void applyQuota(std::vector<uint64_t> const& slots, uint64_t quota) = 0;
    /// Compacts the blobs the level placed itself (staged levels); returns the blobs moved.
    virtual uint64_t defragmentBlobs()
    {
        return 0;
    }
};

/// A cold level that keeps one `Group` per cold pool group, each with a `pageBytes` and a `slots`
/// (SlotPool) member.
template <class Group>
class GroupedColdLevel : public ColdLevel
{
public:
    [[nodiscard]] size_t numPoolGroups() const noexcept override
    {
        return groups_.size();
    }
    [[nodiscard]] uint64_t pageBytes(PoolGroupIndex group) const noexcept override
    {
        return groups_[size_t(group)].pageBytes;
    }
    SlotPool& slots(PoolGroupIndex group) noexcept override
    {
        return groups_[size_t(group)].slots;
    }

protected:
    std::vector<Group> groups_;
};

/// A staged cold level (not addressable by codecs: blobs move by staged reads and writes) whose
/// codec transfers stage blobs in a pinned page ring that the caller keeps and destroys after it.
template <class Group>
class StagedColdLevel : public GroupedColdLevel<Group>
{
public:
    [[nodiscard]] ColdAccess access() const noexcept override
    {
        return ColdAccess::kStaged;
    }
    [[nodiscard]] std::byte* accessibleBase(PoolGroupIndex) const noexcept override
    {
        return nullptr;
    }
    [[nodiscard]] std::byte const* hostBlob(PoolGroupIndex, int32_t) const noexcept override
    {
        return nullptr;
    }
    /// A slice of the pinned page ring for `count` blobs of `group`.
    std::optional<StagingBuffer> stage(
        PoolGroupIndex group, size_t count, std::optional<Stream> owner, std::string& error) override
    {
        return stageBlobs(ring_, this->groups_[size_t(group)].pageBytes, count, owner, ringName_, error);
    }
    /// Half the ring's blobs of `group`: with no slice live, a slice this size always fits.
    [[nodiscard]] size_t maxStagedPages(PoolGroupIndex group) const noexcept override
    {
        return maxStagedBlobs(ring_, this->groups_[size_t(group)].pageBytes);
    }
    /// A staged level names its blobs per slot and finds pages by content key.
    [[nodiscard]] bool tracksBlobs() const noexcept override
    {
        return true;
    }
    [[nodiscard]] bool keepsKeys() const noexcept override
    {
        return true;
    }

protected:
    /// `ringName` names the ring in errors (a static string).
    StagedColdLevel(StagingManager& ring, char const* ringName) noexcept
        : ring_(ring)
        , ringName_(ringName)
    {
    }

    StagingManager& ring_;
    char const* ringName_;
};

/// Raw copies of `count` blobs of an addressable pool (blob s at base + s * pageBytes): out of it
/// into `dsts`, or into it from `srcs` (exactly one is given), ordered on `stream`. Blobs in
/// neighbouring slots whose other addresses are neighbours too go as one copy, so those addresses
/// must lie in one allocation (a pool or a staging area, as every caller's do).
bool copyBlobs(runtime::DeviceRuntime& runtime, std::byte* base, uint64_t pageBytes, int32_t const* slots,
    std::byte* const* dsts, std::byte const* const* srcs, size_t count, Stream stream, std::string& error) noexcept;

/// One cold pool group of the host level: its pinned pool.
struct HostLevelPool
{
    // Shared: Python views of the pool hold it too, so a resize never frees memory a view still
    // reads (the view then shows the old pool).
    std::shared_ptr<runtime::HostMem> memory;
    uint64_t pageBytes;
    SlotPool slots;
};

/// The host tier: one pinned, GPU-mapped pool per cold pool group.
class HostColdLevel final : public GroupedColdLevel<HostLevelPool>
{
public:
    /// `groups[g]` = (page bytes, slot count).
    HostColdLevel(runtime::DeviceRuntime& runtime, std::vector<std::pair<uint64_t, uint64_t>> const& groups);

    [[nodiscard]] CacheLevel level() const noexcept override
    {
        return CacheLevel::kHost;
    }
    [[nodiscard]] std::byte* accessibleBase(PoolGroupIndex group) const noexcept override
    {
        return groups_[size_t(group)].memory->data();
    }
    [[nodiscard]] std::byte const* hostBlob(PoolGroupIndex group, int32_t slot) const noexcept override
    {
        return groups_[size_t(group)].memory->data() + uint64_t(slot) * groups_[size_t(group)].pageBytes;
    }
    bool copyOut(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count, Stream stream,
        std::string& error) noexcept override;
    bool copyIn(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count, Stream stream,
        std::string& error) noexcept override;

    /// An owner of the group's pool memory (kept by views of it across resizes).
    [[nodiscard]] std::shared_ptr<void const> memoryOwner(PoolGroupIndex group) const override
    {
        return groups_[size_t(group)].memory;
    }

    /// Reallocates a group's pool with `numSlots` slots and copies the used blobs over (same
    /// slots). Every used slot is below `numSlots`; the host waits for every slot's last transfer
    /// first (the codec never keeps cold addresses, so nothing else refers to the old pool).
    void resize(PoolGroupIndex group, uint64_t numSlots);
    /// Resizes every group whose slot count changes.
    void applyQuota(std::vector<uint64_t> const& slots, uint64_t quota) override;

private:
    using Pool = HostLevelPool;

    bool copy(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, std::byte const* const* srcs,
        size_t count, Stream stream, std::string& error) noexcept;

    runtime::DeviceRuntime& runtime_;
};

} // namespace kvcodec::kvcm

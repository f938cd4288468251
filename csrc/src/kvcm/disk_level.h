// SPDX-License-Identifier: Apache-2.0
//
// The disk cold level: one DiskRegion (tiers/disk) per cold pool group, with the host tier's
// cold pool groups and cold-page sizes. It is a staged level (ColdAccess::kStaged): its bytes are
// not GPU-accessible, so migrations move blobs through host buffers (slices of the pinned page
// ring it stages into, or host-tier slots for raw copies). Reads and writes are submitted to the
// regions' I/O workers and completed by complete(); the manager completes every batch before the
// migration commits, so a failure is known in time (the transaction rolls back instead of
// losing pages).
//
// Region keys: a page with a content key K is stored under "k" + K, so it can be found again
// after a restart; a page without one under "a" + a number unique in this level's lifetime
// (anonymous pages are erased when the level opens: nothing can claim them after a restart).
//
// Slots: the manager's slot of a disk page is a logical number (its SlotPool); the region picks
// the physical slot. A resize renumbers the logical slots in RAM and has each region move its
// blobs physically (journaled, see DiskRegion::resize). The quota in force is recorded in
// `path`/quota.json next to the configured one, so a restart with the same configuration opens
// the regions with the resized geometry.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvcm/levels.h"
#include "kvcm/staging.h"
#include "tiers/disk/disk_region.h"

namespace kvcodec::kvcm {

/// The pinned page ring size for the largest cold page: max(64 MiB, 3 * maxColdPageBytes).
/// Throws std::overflow_error when the product does not fit 64 bits.
uint64_t pageRingBytes(uint64_t maxColdPageBytes);

/// One cold pool group of the disk level: its region and the names of its slots.
struct DiskLevelGroup
{
    uint64_t pageBytes;
    std::unique_ptr<disk::DiskRegion> region;
    SlotPool slots{0};
    std::vector<std::string> keys;     ///< Region key per slot.
    std::vector<uint32_t> tags;        ///< Lifecycle per slot.
    std::vector<disk::Ticket> erasing; ///< Retirements not yet waited for.
    uint64_t weight = 0;               ///< Its construction share of config.maxBytes.
    uint64_t containerBytes = 0;       ///< Configured bytes per container file.
};

class DiskColdLevel final : public StagedColdLevel<DiskLevelGroup>
{
public:
    /// The file under the level's path that records a resized quota.
    static constexpr char const* kQuotaFile = "quota.json";
    /// The most containers one pool group's region may span.
    static constexpr uint64_t kMaxContainers = 9999;

    struct GroupSpec
    {
        uint64_t pageBytes = 0;
        uint64_t maxBytes = 0;               ///< This group's share of the disk quota.
        std::vector<LifeCycleId> lifeCycles; ///< Lifecycles mapped to this cold pool group.
    };

    /// A content-keyed page found in a region when it opened, not yet claimed by a page.
    using Found = ClaimedBlob;

    /// Opens (creating, recovering or invalidating) one region per group under `config.path`.
    /// `ring` (kept by the caller, destroyed after this level) is the pinned page ring that
    /// codec transfers stage blobs in.
    DiskColdLevel(runtime::DeviceRuntime& runtime, DiskTierConfig const& config, std::vector<GroupSpec> const& groups,
        StagingManager& ring);
    ~DiskColdLevel() override;

    [[nodiscard]] CacheLevel level() const noexcept override
    {
        return CacheLevel::kDisk;
    }
    /// Raw copies with host-addressable buffers; `stream` is synchronized first (the buffers
    /// may still be in use by work on it).
    bool copyOut(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count, Stream stream,
        std::string& error) noexcept override;
    bool copyIn(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count, Stream stream,
        std::string& error) noexcept override;

    /// Names the blob that `slot` will hold: the page's content key (empty: anonymous) and its
    /// lifecycle (the region tag). An unclaimed found page with the same key is replaced once the
    /// write of `slot` is durable, never before (finishWrite): a crash in between leaves the old
    /// page, not none.
    void assign(PoolGroupIndex group, int32_t slot, std::string const& contentKey, LifeCycleId lifeCycle);

    /// Submits region reads; complete() maps kNotFound to kMissing, kChecksumMismatch to kCorrupt
    /// and anything else to kFailed (the error names the region's status).
    BlobIo submitRead(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count,
        BlobStatus* status) noexcept override;
    /// Assigns the names, waits for pending retirements, and submits region writes; complete()
    /// waits until they are durable (all or nothing: on failure the blobs written are erased again).
    BlobIo submitWrite(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, BlobName const* names,
        size_t count) noexcept override;
    bool complete(BlobIo io, std::string& error) noexcept override;
    /// Waits for the batch's region tickets and keeps their statuses for complete().
    void awaitIo(BlobIo io) noexcept override;

    /// The page left `slot`: its blob is retired (asynchronously; the next write waits for it).
    void release(PoolGroupIndex group, int32_t slot) noexcept override;

    /// Claims the unclaimed found page with content key `key`, or nullopt.
    std::optional<Found> claim(std::string const& key) override;
    [[nodiscard]] size_t numUnclaimed() const noexcept override
    {
        std::lock_guard<std::recursive_mutex> lock(mu_);
        return found_.size();
    }
    /// Erases every unclaimed found page and frees its slot; returns how many.
    size_t forgetUnclaimed() override;

    [[nodiscard]] disk::DiskRegion const& region(PoolGroupIndex group) const noexcept
    {
        return *groups_[size_t(group)].region;
    }

    /// The quota in force (config.maxBytes until a resize, also across restarts).
    [[nodiscard]] uint64_t quota() const noexcept
    {
        return quota_;
    }
    /// Slots per group for a quota: its share (split like construction: proportional to each
    /// group's slot-count weight) in whole containers, at least one per group. Throws
    /// std::invalid_argument naming quota_bytes when a group would exceed the region limits.
    [[nodiscard]] std::vector<uint64_t> slotsFor(uint64_t quota) const;
    [[nodiscard]] std::optional<std::vector<uint64_t>> ownSlotCounts(uint64_t quota) const override
    {
        return slotsFor(quota);
    }
    /// Moves the name of the page in logical slot `from` to the free slot `to` (no I/O).
    void moveSlot(PoolGroupIndex group, int32_t from, int32_t to) override;
    /// Renumbers the unclaimed found pages of `group` at or above `limit` into slots taken from
    /// the group's pool (which withholds the slots at or above the limit); returns the vacated ones.
    std::vector<int32_t> renumberUnclaimed(PoolGroupIndex group, uint64_t limit) override;
    [[nodiscard]] size_t numUnclaimed(PoolGroupIndex group) const noexcept override;
    /// Erases up to `count` unclaimed found pages of `group` and frees their slots; returns how many.
    size_t dropUnclaimed(PoolGroupIndex group, size_t count) override;
    /// Resizes every region to its share of `quota` (every used logical slot must already lie
    /// below the new count) and records the quota. On failure the regions already resized are
    /// resized back and disk::ResizeError / std::runtime_error says so; the old quota stays.
    void resize(uint64_t quota);
    /// resize(quota) (`slots` is slotsFor(quota)).
    void applyQuota(std::vector<uint64_t> const& slots, uint64_t quota) override;
    /// Compacts every region's blobs into its first slots; returns the pages moved.
    uint64_t defragment();
    uint64_t defragmentBlobs() override
    {
        return defragment();
    }

private:
    using Group = DiskLevelGroup;

    // One submitted read or write batch, until complete().
    /// An unclaimed found page that a write under its key replaces (see assign()).
    struct Replaced
    {
        std::string contentKey;
        Found page;
    };
    struct Pending
    {
        uint64_t id = 0;
        PoolGroupIndex group = 0;
        bool write = false;
        size_t count = 0;
        std::vector<disk::Ticket> tickets; ///< 0: not submitted (see messages / submitError).
        std::vector<std::string> messages; ///< Per page: why a read was not submitted.
        std::vector<std::string> keys;     ///< Writes: the region key of each submitted blob.
        BlobStatus* status = nullptr;      ///< Reads: the caller's per-page outcome array.
        std::string submitError;           ///< Writes: why submission stopped early.
        std::vector<disk::Status> results; ///< Per ticket, once awaitIo() waited for them.
        bool awaited = false;
        std::vector<Replaced> replaced; ///< Writes: unclaimed pages they replace once durable.
    };
    /// Settles the pages a write batch replaces, given which of its blobs are on disk now.
    void settleReplaced(Pending& p, std::vector<bool> const& onDisk, bool ok) noexcept;

    // Waits for a read batch: the region's status per page (codes) and its message.
    void finishRead(Pending& p, std::vector<disk::StatusCode>& codes, std::vector<std::string>& messages) noexcept;
    bool finishWrite(Pending& p, std::string& error) noexcept;
    // Submits writes under the names already assigned to `slots`.
    BlobIo submitAssigned(
        PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count) noexcept;
    Pending* pending(BlobIo io) noexcept;
    // Waits for `stream` (raw copies: its work may still use the buffers); false with `error`.
    bool synchronize(Stream stream, std::string& error) noexcept;
    void waitErases(Group& g) noexcept;
    [[nodiscard]] std::vector<uint32_t> containersFor(uint64_t quota) const;
    void writeQuotaFile(uint64_t quota) const;
    bool eraseNow(Group& g, std::string const& regionKey, std::string& error) noexcept;

    runtime::DeviceRuntime& runtime_;
    std::list<Pending> pending_; ///< Submitted batches (stable addresses: awaitIo() waits outside mu_).
    // Guards every member against the manager's I/O thread, which submits and awaits batches
    // while the manager's callers go on (recursive: public methods call each other).
    mutable std::recursive_mutex mu_;
    uint64_t nextIo_ = 1;
    std::string path_;
    uint64_t configured_ = 0; ///< config.maxBytes.
    uint64_t quota_ = 0;
    uint64_t nextAnonymous_ = 0;
    std::unordered_map<std::string, Found> found_; ///< Content key -> unclaimed page.
    std::vector<Replaced> replacing_;              ///< assign()'s, until submitAssigned() takes them.
};

} // namespace kvcodec::kvcm

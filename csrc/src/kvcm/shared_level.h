// SPDX-License-Identifier: Apache-2.0
//
// The shared host level: the host tier in the per-host daemon's L2 arena instead of this
// process's own pinned memory, so every manager on the host (same codec and layer groups) finds
// the pages the others evicted and decodes them in place.
//
// Each cold pool group is one packed region of the arena (slot s at data + s * page bytes, the
// layout codecs address), registered with the device runtime as pinned, device-mapped memory.
// The manager's slot numbers are the region's: of them, only the slots the daemon leased to this
// manager are its own (SlotPool::ownOnly); the others stay withheld.
//
// - **Evicting** encodes into a leased slot, as into the private host tier. Once the encode has
//   completed, a page with a content key is published: committed under its key with the CRC-32C
//   of its bytes and kept pinned for this manager, so no other client's lease can take the slot
//   while the page lives here.
// - **Finding** (findShared) asks the daemon where each key is: a hit is pinned for this manager
//   and becomes a host-level page in that very slot; no byte is copied.
// - **Onboarding** a published or found page first checks its slot's header (version, region,
//   key digest) and, unless switched off, the bytes' CRC-32C: a slot another process reused or
//   scribbled over is a miss (the page is dropped), never decoded.
// - **A page leaving** a published or found slot gives the slot up: once the last transfer that
//   read it completed, the pin is released (the page stays in L2 for others, least recently used
//   first to go). A published slot is replaced at once by a spare lease (refilled in batches), so
//   the manager's share of the arena stays whole; found pages count on top of it while they stay.
//
// A keyed page's CRC-32C (what a reader checks its bytes against) is computed on the level's
// checksum thread once its encode completed, so the call that publishes it pays only the commit;
// the end of a blocking call (maintain(true)) waits for it, computing what was not started.
//
// Round trips to the daemon happen in maintain() (batched, at the start of the manager's calls)
// and in claimMany(); a daemon that went away stops the sharing, not the manager: the mapping
// stays valid, the leased slots go on serving as a private host tier, until reattach() moves the
// level into the arena of the daemon answering at the socket again (its pages copied there).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/client.h"
#include "kvcm/levels.h"

namespace kvcodec::kvcm {

/// The CRC-32C of a batch of landed blobs, computed on the shared level's checksum thread.
struct SharedCrcBatch
{
    std::shared_ptr<daemon::Mapping> arena; ///< Keeps the blobs mapped while they are read.
    std::vector<uint8_t const*> blobs;
    uint64_t bytes = 0; ///< Per blob.
    std::vector<uint32_t> crcs;
    bool done = false; ///< Guarded by the level's checksum mutex.
};

/// One cold pool group of the shared level: its arena region and what this manager holds of it.
struct SharedLevelGroup
{
    daemon::RegionLayout layout;
    uint64_t pageBytes = 0;
    SlotPool slots{0};
    uint64_t quotaSlots = 0; ///< Leased slots this manager keeps (its share of the host quota).
    std::vector<LifeCycleId> members;
    /// Per slot: kPublished (one of this manager's leases, committed) or kFound (another's page,
    /// found) while pinned for this manager, else 0; with the header a read expects.
    std::vector<uint8_t> pinned;
    static constexpr uint8_t kPublished = 1;
    static constexpr uint8_t kFound = 2;
    std::vector<daemon::Found> expected;
    std::vector<daemon::KeyDigest> digest;
    /// Per slot, bumped when its page leaves: a pending publication of an older page is stale.
    std::vector<uint32_t> generation;
    struct Pending
    {
        int32_t slot;
        uint32_t generation; ///< The slot's generation when the page landed.
        std::string key;     ///< The daemon key ("L<lifecycle>/<content key>").
        EventPtr written;
        std::shared_ptr<SharedCrcBatch> crc; ///< Its checksum in flight or computed (index `crcAt`).
        size_t crcAt = 0;
    };
    std::vector<Pending> publish;                    ///< Landed keyed pages, not yet committed.
    std::vector<std::pair<int32_t, EventPtr>> unpin; ///< Given-up slots, pins not yet released.
    /// Leased slots held back (withheld in `slots`): a published slot given up is replaced by one
    /// at once, so the level's free slots grow as pages leave it, like the private host tier's.
    std::vector<int32_t> spare;
    uint64_t spareTarget = 0;
    uint64_t givenUp = 0; ///< Published slots given up since the last maintain().
};

class SharedColdLevel final : public GroupedColdLevel<SharedLevelGroup>
{
public:
    struct GroupSpec
    {
        uint64_t pageBytes;
        uint64_t slots; ///< This manager's share of the host quota.
        std::vector<LifeCycleId> members;
    };
    SharedColdLevel(runtime::DeviceRuntime& runtime, SharedTierConfig const& config, std::vector<GroupSpec> groups);
    ~SharedColdLevel() override;

    [[nodiscard]] CacheLevel level() const noexcept override
    {
        return CacheLevel::kHost;
    }
    [[nodiscard]] std::byte* accessibleBase(PoolGroupIndex group) const noexcept override;
    [[nodiscard]] std::shared_ptr<void const> memoryOwner(PoolGroupIndex group) const override;
    [[nodiscard]] std::byte const* hostBlob(PoolGroupIndex group, int32_t slot) const noexcept override;
    bool copyOut(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count, Stream stream,
        std::string& error) noexcept override;
    bool copyIn(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count, Stream stream,
        std::string& error) noexcept override;

    [[nodiscard]] bool tracksBlobs() const noexcept override
    {
        return true;
    }
    void release(PoolGroupIndex group, int32_t slot) noexcept override;
    void landed(PoolGroupIndex group, int32_t slot, LifeCycleId lifeCycle, std::string const& key,
        EventPtr const& written) override;
    void maintain(bool waitWrites) override;
    std::vector<std::optional<ClaimedBlob>> claimMany(
        std::string const* keys, int32_t const* lifeCycles, size_t count) override;
    [[nodiscard]] bool verifiesBlobs() const noexcept override
    {
        return true;
    }
    /// Header checks on this thread; the CRC-32C passes (verify_crc) split over up to 8 threads
    /// when the blobs are large enough to pay for them.
    void verifyBlobs(PoolGroupIndex group, int32_t const* slots, size_t count, uint8_t* ok) const noexcept override;
    void checkHeaders(PoolGroupIndex group, int32_t const* slots, size_t count, uint8_t* ok, uint32_t* crc,
        uint32_t* length) const noexcept override;
    [[nodiscard]] char const* fixedGeometry() const noexcept override;
    void applyQuota(std::vector<uint64_t> const& slots, uint64_t quota) override;

    /// The daemon's client (null once the daemon went away).
    [[nodiscard]] bool connected() const noexcept
    {
        return client_ != nullptr;
    }
    /// True when the daemon went away, re-attaching by itself is on (reattachEveryS >= 0) and
    /// the last try was at least that long ago; the try counts from now.
    [[nodiscard]] bool reattachDue() noexcept;
    struct Counters
    {
        uint64_t published = 0, found = 0, missed = 0, rejected = 0, released = 0, leased = 0, short_ = 0;
    };
    [[nodiscard]] Counters const& counters() const noexcept
    {
        return counters_;
    }
    [[nodiscard]] std::string const& socketPath() const noexcept
    {
        return socketPath_;
    }

    /// After the daemon went away: connects to the daemon answering at the socket now and moves
    /// the level into its arena. `held[g]` are pool group g's slots that hold pages (no transfer
    /// may use them meanwhile); on success `moved[g][i]` is the slot held[g][i]'s bytes were
    /// copied to, every page becomes this manager's own (unpublished) and the old arena is let go.
    /// False, nothing changed, while connected, while no daemon answers, or when its regions
    /// cannot take the pages (too few slots to lease, or made by a client of another kind).
    bool reattach(std::vector<std::vector<int32_t>> const& held, std::vector<std::vector<int32_t>>& moved);
    [[nodiscard]] uint64_t reattached() const noexcept
    {
        return reattached_;
    }
    /// Asks the daemon to read the keys' pages from its long tier into L2 in the background (for
    /// each key, under `lifeCycles[i]`, or every lifecycle when negative or null), so a later
    /// claimMany() finds them there; returns how many reads were queued (0 without a daemon or
    /// without a long tier).
    uint64_t prefetch(std::string const* keys, int32_t const* lifeCycles, size_t count);

private:
    /// Group `gi`'s packed region of `client`'s arena, populated and registered as pinned
    /// (appended to `registered`).
    daemon::RegionLayout openRegion(daemon::Client& client, daemon::Mapping& arena, size_t gi, uint64_t pageBytes,
        uint64_t want, std::vector<std::pair<void*, size_t>>& registered);
    /// A group's per-slot state for a region of `slots` slots, of which `free` are leased to this
    /// manager and free and `used` hold its pages.
    static void resetSlots(
        SharedLevelGroup& g, uint32_t slots, std::vector<int32_t> const& free, std::vector<int32_t> const& used);
    /// The daemon's name of group `gi`'s region.
    [[nodiscard]] std::string regionName(size_t gi) const;
    /// Unregisters and forgets every mapping in `registered`.
    void unregisterAll(std::vector<std::pair<void*, size_t>>& registered) noexcept;
    void lostDaemon(std::exception const& e) noexcept;
    void publish(SharedLevelGroup& g, bool waitWrites);
    /// Queues a batch for the checksum thread (started on first use); false when it cannot start.
    bool checksumLater(std::shared_ptr<SharedCrcBatch> const& batch) noexcept;
    /// Waits until the checksum thread finished `batch`.
    void awaitChecksum(SharedCrcBatch const& batch);
    void checksumLoop() noexcept;
    void giveUp(SharedLevelGroup& g);
    void refillSpares(SharedLevelGroup& g);

    runtime::DeviceRuntime& runtime_;
    std::string socketPath_;
    std::string identity_;
    bool verifyCrc_;
    double timeoutS_;
    double reattachEveryS_;
    std::optional<std::chrono::steady_clock::time_point> lastReattachTry_;
    uint64_t reattached_ = 0;
    std::unique_ptr<daemon::Client> client_;
    std::shared_ptr<daemon::Mapping> arena_;
    std::vector<std::pair<void*, size_t>> registered_;
    std::vector<PoolGroupIndex> groupOf_; ///< Per lifecycle.
    Counters counters_;
    // The checksum thread and its queue (declared last: stopped and joined first).
    std::mutex crcMu_;
    std::condition_variable crcCv_;
    std::deque<std::shared_ptr<SharedCrcBatch>> crcQueue_;
    bool crcStop_ = false;
    std::thread crcThread_;
};

} // namespace kvcodec::kvcm

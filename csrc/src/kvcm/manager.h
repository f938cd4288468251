// SPDX-License-Identifier: Apache-2.0
//
// KvCacheManager: the C++ core of the KV-cache manager. Owns the device runtime, the
// StorageManager (codec, levels, staging) and the page table; allocates, frees and migrates
// pages. Public calls are safe from several threads: each holds the manager's mutex (one per
// manager, as the seed prescribes) for its whole duration; a migration observer that calls back
// into the same manager is refused with an error instead of deadlocking.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvcm/config.h"
#include "kvcm/content_keys.h"
#include "kvcm/eviction_queues.h"
#include "kvcm/page_table.h"
#include "kvcm/shared_level.h"
#include "kvcm/storage.h"
#include "runtime/device_runtime.h"
#include "runtime/owned_codec.h"

namespace kvcodec::kvcm {

/// A destination level has too few free slots for a request.
class CapacityError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

/// A transfer failed synchronously. Transfers submitted before it stay committed
/// (committedPages); the failed one and every later one were rolled back: their destination
/// slots released, their pages left where they were, retryable.
class MigrationError : public std::runtime_error
{
public:
    MigrationError(std::string const& message, size_t committed)
        : std::runtime_error(message)
        , committedPages(committed)
    {
    }
    size_t committedPages;
};
/// The former name of MigrationError.
using MigrationFailure [[deprecated("use MigrationError")]] = MigrationError;

/// One submitted transfer, as migration observers see it.
struct MigrationRecord
{
    CacheLevel srcLevel;
    CacheLevel dstLevel;
    PoolGroupIndex srcPoolGroup;
    PoolGroupIndex dstPoolGroup;
    LifeCycleId batchingRepresentative; ///< Batching representative of a codec transfer, else -1.
    uint64_t pages;
    uint64_t bytes; ///< Bytes written at the destination.
};

/// Why a cold page was dropped instead of onboarded: 1-7 are the codec's PageStatus values
/// (or the host envelope check's EnvelopeStatus, the same numbers), then a staged level's own
/// (BlobStatus kMissing / kCorrupt; the disk tier's are the ones reported today).
enum DropReason : int
{
    kDropBlobMissing = 8,                 ///< The level holds no blob for the page any more.
    kDropBlobCorrupt = 9,                 ///< The level's own blob check failed on read.
    kDropDiskMissing = kDropBlobMissing,  ///< The disk tier holds no blob for the page any more.
    kDropDiskChecksum = kDropBlobCorrupt, ///< The disk tier's slot checksum failed on read.
};
inline constexpr int kNumDropReasons = 10; ///< Index 0 (kPageOk) is never counted.

/// Counters of one pool group of one level.
struct PoolGroupStats
{
    uint64_t pagesOffloaded = 0; ///< Pages encoded hot -> cold through this group.
    uint64_t bytesOffloaded = 0; ///< Cold-page bytes of those pages.
    uint64_t pagesOnboarded = 0; ///< Pages decoded cold -> hot through this group.
    uint64_t bytesOnboarded = 0;
    uint64_t pagesCopied = 0;  ///< Same-level relocations (hot -> hot, cold -> cold) into this group.
    uint64_t pagesDropped = 0; ///< Cold pages dropped instead of onboarded (cold groups).
    std::array<uint64_t, kNumDropReasons> droppedBy{}; ///< pagesDropped per DropReason / PageStatus.
    uint64_t evictions = 0;                            ///< Pages the eviction controller moved out of this group.
    uint64_t drops = 0; ///< Pages the eviction controller dropped here (last level only).
    uint64_t hits = 0;  ///< touch() calls on pages in this group.
    uint64_t codecCalls = 0;
    double codecSeconds = 0; ///< Host time spent inside encode()/decode() calls.
    // The codec's work by direction (the sums above split): encode = offloads, decode = onboards.
    uint64_t hotBytesOffloaded = 0; ///< Hot page bytes of the pages offloaded (what the codec read).
    uint64_t hotBytesOnboarded = 0; ///< Hot page bytes of the pages onboarded (what the codec wrote).
    uint64_t encodeCalls = 0;
    uint64_t decodeCalls = 0;
    double encodeSeconds = 0; ///< Host time inside encode() calls.
    double decodeSeconds = 0; ///< Host time inside decode()/decodeChecked() calls.
    // GPU time between timed events around the codec calls (setCodecGpuTiming; CUDA backend),
    // added once both events completed: the calls timed so far and their device seconds.
    uint64_t encodeGpuCalls = 0;
    uint64_t decodeGpuCalls = 0;
    double encodeGpuSeconds = 0;
    double decodeGpuSeconds = 0;
};

struct MigrationResult
{
    uint64_t moved = 0;
    std::vector<PageId> dropped; ///< Pages dropped instead of onboarded (now stale), see DropReason.
    /// Pages of an asynchronous migration whose transfer failed: they stay at their source level.
    std::vector<PageId> failed;
    std::string error; ///< The first failure's message ("" when nothing failed).
};

class KvCacheManager;

/// A migration whose staged transfers (disk writes and reads) finish on the manager's I/O
/// thread: KvCacheManager::submit() returns once the work is submitted. The pages of those
/// transfers are in flight (PageInfo::inFlight) until their transfer is committed: they stay at
/// their source level, out of the eviction queues, and a later call that frees, migrates or
/// re-keys one of them first waits for it. Shared by the caller's handle and the manager; it
/// must not outlive the manager.
class PendingMigration
{
public:
    explicit PendingMigration(KvCacheManager& manager, size_t requested)
        : manager_(manager)
        , requested_(requested)
    {
    }
    /// True once every transfer was committed or rolled back (never blocks).
    [[nodiscard]] bool done() const;
    /// Blocks until done(), committing finished transfers itself when the I/O thread has not yet
    /// (so it never waits for another caller); then the result: pages moved and dropped, and the
    /// pages whose transfer failed (still at their source) with the first error. An exception a
    /// migration observer raised on one of its commits is rethrown here, everything committed.
    MigrationResult wait();
    [[nodiscard]] size_t requested() const noexcept
    {
        return requested_;
    }
    /// Prefetch only: transfers not yet started are given up (their pages stay where they were).
    void cancel();

private:
    friend class KvCacheManager;
    KvCacheManager& manager_;
    size_t requested_;
    // Guarded by the manager's job mutex: transfers whose I/O has not finished, and those not yet
    // committed; the result is written under the manager's lock only.
    size_t ioLeft_ = 0;
    size_t commitLeft_ = 0;
    bool cancelled_ = false;
    MigrationResult result_;
    std::exception_ptr observerError_; ///< The first exception an observer raised on its commits.
};

/// Prefetch counters (disk -> host, see KvCacheManager::prefetch).
struct PrefetchStats
{
    uint64_t issued = 0;    ///< Pages submitted for reading.
    uint64_t completed = 0; ///< Pages that reached the host level.
    uint64_t used = 0;      ///< Prefetched pages migrated to the hot level before leaving the host level.
    uint64_t wasted = 0;    ///< Prefetched pages freed, dropped or evicted before any use.
    uint64_t skipped = 0;   ///< Pages not prefetched: over the budget, not at the disk level, or in flight.
    uint64_t cancelled = 0; ///< Pages whose read was given up by cancel().
    uint64_t failed = 0;    ///< Pages whose read failed or whose blob was missing or corrupt.
};

struct PageInfo
{
    LifeCycleId lifeCycle;
    CacheLevel level;
    int32_t slot;
    PoolGroupIndex poolGroup;
    bool inFlight = false; ///< A staged transfer holds the page (see PendingMigration).
};

class KvCacheManager
{
public:
    /// Holds the manager's mutex for one public call. Nested calls on the owning thread (a public
    /// method calling another) pass through; a call from a migration observer, which runs while
    /// a migration holds the mutex, throws std::logic_error; every call after closeDisk() throws.
    class CallGuard
    {
    public:
        /// Blocks until the mutex is free.
        CallGuard(KvCacheManager const& m, char const* what);
        /// Takes the mutex only when it is free now or already held by this thread; check
        /// entered() (used by callers that must do something else before blocking).
        CallGuard(KvCacheManager const& m, char const* what, std::try_to_lock_t);
        ~CallGuard();
        CallGuard(CallGuard const&) = delete;
        CallGuard& operator=(CallGuard const&) = delete;
        [[nodiscard]] bool entered() const noexcept
        {
            return entered_;
        }

    private:
        bool enterNested(char const* what);
        KvCacheManager const& m_;
        bool entered_ = false;
        bool nested_ = false;
    };

    /// Takes the runtime and the codec (consumed: destroyed if construction throws; null
    /// selects the default concat codec). `codecDevice` is the device the codec was created for.
    KvCacheManager(KvcmConfig config, std::unique_ptr<runtime::DeviceRuntime> runtime, runtime::CodecPtr codec,
        int32_t codecDevice);
    ~KvCacheManager();

    KvCacheManager(KvCacheManager const&) = delete;
    KvCacheManager& operator=(KvCacheManager const&) = delete;

    [[nodiscard]] StorageManager const& storage() const noexcept
    {
        return *storage_;
    }
    [[nodiscard]] runtime::DeviceRuntime& runtime() const noexcept
    {
        return *runtime_;
    }

    /// Allocates `count` hot pages of `lifeCycle` into `out`. The slots' previous transfers are
    /// waited for on `stream` (host-synchronized when nullopt) before a kernel may write them.
    /// `keys` (null, or one per page; empty: none) are set under the same lock, so no eviction
    /// sees a new page without its key.
    void allocate(LifeCycleId lifeCycle, size_t count, PageId* out, std::optional<Stream> stream,
        std::string const* keys = nullptr);

    /// Frees pages at whatever level they are.
    void free(PageId const* pages, size_t count);

    /// Moves every page to a newly allocated slot at `level` (a page already there is relocated:
    /// hot -> hot per-pool copy, cold -> cold raw blob copy). Null `stream` = the manager's own.
    /// With `requiredSource`, every page must currently be at that level (evict/onboard).
    /// Blocks until the disk transfers are durable (reads: landed); a failure throws
    /// MigrationError, its pages left at their source.
    MigrationResult migrate(PageId const* pages, size_t count, CacheLevel level, Stream stream,
        std::optional<CacheLevel> requiredSource = std::nullopt);
    /// migrate() that returns once everything is submitted: transfers to or from a staged
    /// (disk) level complete on the manager's I/O thread (the caller's stream need not be
    /// waited for: the I/O thread waits for the encode's event). A synchronous failure throws
    /// as migrate() does; an asynchronous one is reported by the handle.
    std::shared_ptr<PendingMigration> submit(PageId const* pages, size_t count, CacheLevel level, Stream stream,
        std::optional<CacheLevel> requiredSource = std::nullopt);
    /// Warms the host level from the disk level in the background: the pages at the disk level
    /// (others are skipped) are read into host slots while the budget allows (`maxBytes` of
    /// host blobs in flight or prefetched and not yet used; 0: no limit beyond free host slots).
    /// Never evicts. Counted in prefetchStats().
    std::shared_ptr<PendingMigration> prefetch(PageId const* pages, size_t count, uint64_t maxBytes);
    [[nodiscard]] PrefetchStats prefetchStats() const;
    /// Staged transfers submitted and not yet committed.
    [[nodiscard]] size_t inFlightTransfers() const;

    /// Sets the page's content key (1..254 bytes; empty clears it). Keys are unique among live
    /// pages; a disk page is written under its key, so it can be found after a restart. A page
    /// at the disk level keeps the key it was written with.
    void setKey(PageId page, std::string const& key);
    [[nodiscard]] std::string key(PageId page) const;

    /// For each key: the live page holding it at the disk level, or a page created for an
    /// unclaimed blob the disk tier kept from a previous manager (at the disk level, ready to be
    /// onboarded), or 0 when the disk tier has no page under that key.
    void findOnDisk(std::string const* keys, size_t count, PageId* out)
    {
        findKept(CacheLevel::kDisk, "findOnDisk", keys, count, out);
    }
    /// For each key: the live page holding it at the host level, or a page created for the blob
    /// another manager on the host published under it in the shared host level (found in the
    /// daemon's arena and pinned there, ready to be onboarded), or 0. `lifeCycles[i]` is the
    /// lifecycle to look under (negative, or null: every lifecycle in order).
    void findShared(std::string const* keys, int32_t const* lifeCycles, size_t count, PageId* out)
    {
        maybeReattachShared();
        findKept(CacheLevel::kHost, "findShared", keys, count, out, lifeCycles);
    }
    /// The shared host level's counters, or nullopt when the host tier is this process's own.
    struct SharedStats
    {
        bool connected = false;
        SharedColdLevel::Counters counters;
        uint64_t reattached = 0;
    };
    [[nodiscard]] std::optional<SharedStats> sharedStats() const;
    /// After the cache daemon went away: moves the shared host level into the arena of the daemon
    /// answering at its socket now (SharedColdLevel::reattach), every transfer waited for first
    /// and the host-level pages renumbered to the slots their bytes were copied to. True when it
    /// re-attached; false while still connected or while no daemon can take the pages.
    /// std::invalid_argument without a shared host level.
    bool reattachShared();
    /// reattachShared() when the shared host level lost its daemon and re-attaching by itself is
    /// due (SharedTierConfig::reattachEveryS). Called where a public call starts (the bindings of
    /// migrate and submit, findShared), never inside another call: the manager's own migrations
    /// (makeRoom, resize) hold slots a re-attach would renumber.
    void maybeReattachShared();
    /// SharedColdLevel::prefetch of the keys; std::invalid_argument without a shared host level.
    uint64_t prefetchShared(std::string const* keys, int32_t const* lifeCycles, size_t count);
    /// The shared host level (std::invalid_argument when the host tier is this process's own).
    [[nodiscard]] SharedColdLevel& sharedLevel() const;
    /// Erases the disk blobs kept from a previous manager that no page claimed; returns how many.
    size_t forgetUnclaimedOnDisk()
    {
        return forgetUnclaimed(CacheLevel::kDisk, "forgetUnclaimedOnDisk");
    }
    [[nodiscard]] size_t unclaimedOnDisk() const
    {
        return unclaimed(CacheLevel::kDisk, "unclaimedOnDisk");
    }

    /// Marks pages as just used (recency), counting a hit at each page's level and pool group.
    void touch(PageId const* pages, size_t count);
    /// Pins (in use: never evicted or dropped) or unpins pages; pins nest.
    void pin(PageId const* pages, size_t count, bool pinned);
    /// Eviction priority per page (lower is evicted first; default 0).
    void setPriority(PageId const* pages, size_t count, int32_t priority);
    /// Frees slots in one pool group of `level` until `freeSlots` are free, evicting its
    /// least-recently-used unpinned pages (lowest priority first) to the next colder level, which
    /// makes room the same way; the last level drops. Throws CapacityError when too few pages are
    /// evictable (evictions already done stay done: no page is lost by them).
    void makeRoom(CacheLevel level, PoolGroupIndex group, uint64_t freeSlots, std::optional<Stream> stream);
    /// Sets a level's quota at run time: each pool group's slot count is re-projected as at
    /// construction. Growing extends the pools (hot: up to the capacity reserved for
    /// config.maxGpuQuotaBytes; host: a larger pool, blobs copied; disk: new preallocated
    /// container files). Shrinking first evicts (least recently used, to the next colder level;
    /// the disk level drops, counted in its drops) what no longer fits, then moves the pages
    /// beyond the new count into free slots below it (hot -> hot per-pool copies and host -> host
    /// raw blob copies through the migration transaction; disk: journaled raw blob moves inside
    /// each region, see DiskRegion::resize) and releases the tail. Throws std::invalid_argument
    /// (hot quota above the reserve, infeasible projection) or CapacityError (too few evictable
    /// pages) before changing anything; a disk I/O failure throws disk::ResizeError and leaves
    /// the old quota working (evictions already done stay done). The disk quota persists across
    /// restarts with the same DiskTierConfig.
    void resize(CacheLevel level, uint64_t quotaBytes, std::optional<Stream> stream);
    /// Compacts every pool group of a level: used slots become a prefix (disk: also physically,
    /// each region's blobs move to its first slots, journaled). Pages keep their ids and contents.
    /// Returns the pages moved (disk: blobs moved inside the regions).
    uint64_t defragment(CacheLevel level, std::optional<Stream> stream);
    /// Usable slots of the hot level's pool groups can grow up to this (the reserve).
    [[nodiscard]] uint64_t hotCapacitySlots(PoolGroupIndex group) const;

    /// Evictable (unpinned) pages of one pool group of `level`.
    [[nodiscard]] size_t evictable(CacheLevel level, PoolGroupIndex group) const;
    [[nodiscard]] uint32_t pins(PageId page) const;

    [[nodiscard]] PageInfo info(PageId page) const;
    [[nodiscard]] bool isLive(PageId page) const;

    /// Pool-group statistics of `level`, in that level's grouping order (a copy: other threads
    /// may be migrating).
    [[nodiscard]] std::vector<PoolGroupStats> stats(CacheLevel level) const;
    /// Times every later codec call on the device (two timed events around it; their elapsed
    /// time is added to the stats' encode/decodeGpuSeconds once both completed, never waited
    /// for). Returns whether calls are timed now: false when off or where the backend keeps no
    /// event times (the host backend).
    bool setCodecGpuTiming(bool on);
    /// Per pool group of `level`: (used slots now, peak since the last call); restarts the peaks.
    std::vector<std::pair<uint64_t, uint64_t>> getAndResetIterationPeakBlockStats(CacheLevel level);

    using Observer = std::function<void(MigrationRecord const&)>;
    int64_t addObserver(Observer observer);
    bool removeObserver(int64_t id);

    /// Blocks until every transfer submitted so far completed.
    void synchronize();
    /// Synchronizes, then closes the disk regions (flushed, snapshotted, unlocked) so another
    /// manager may open the directory; the manager must not be used afterwards.
    void closeDisk()
    {
        closeLevel(CacheLevel::kDisk, "closeDisk");
    }
    /// Synchronizes, then closes the cold levels that hold outside resources (the disk regions;
    /// the remote level's queue, whose worker may then stop); the manager must not be used
    /// afterwards.
    void closeTiers();

    /// For each key with `lifeCycles[i]` >= 0 (the lifecycle its blob was found under in the
    /// remote store, by the caller's existence check): the live page holding it at the remote
    /// level, or a page created for it there (ready to be onboarded; a blob gone since reads as a
    /// miss), or 0. Keys with a negative lifecycle get the live remote page holding them, or 0.
    void findRemote(std::string const* keys, int32_t const* lifeCycles, size_t count, PageId* out);
    /// Remote offers neither claimed nor withdrawn (0 between findRemote() calls).
    [[nodiscard]] size_t remoteOffers() const;
    [[nodiscard]] Stream internalStream() const noexcept
    {
        return stream_;
    }

private:
    // A key for page `self` (none: a new page): at most 254 bytes, not another live page's (throws,
    // naming it `what`).
    void checkKey(std::string const& key, std::string const& what, std::optional<uint32_t> self) const;
    // allocate()'s keys: each 0..254 bytes, unique, none the key of a live page (throws).
    void checkNewKeys(std::string const* keys, size_t count) const;
    // findRemote()'s offers that no page claimed (see RemoteColdLevel::withdraw()).
    void withdrawRemoteOffers(std::vector<std::string> const& keys, uint64_t token) noexcept;

    // One distinct transfer of a (source level, destination level) pair, with the migration path
    // chosen for it from the (source kind, destination kind) table (manager_paths.cpp).
    struct TransferKey
    {
        CacheLevel src;
        CacheLevel dst;
        PoolGroupIndex srcGroup;
        PoolGroupIndex dstGroup;
        LifeCycleId rep; ///< Codec transfers only.
        uint8_t path;    ///< Index into the path table.
    };
    struct Transfer;
    struct Job;
    using Path = bool (KvCacheManager::*)(Transfer& t);
    /// What the path table is indexed by: the hot level, or a cold level's ColdAccess.
    enum class LevelKind : uint8_t
    {
        kHot,
        kAddressable,
        kStaged,
    };
    static constexpr int kNumKinds = 3;
    static constexpr uint8_t kNoPath = 0xff;

    // --- manager.cpp: construction, allocation, keys, observers -----------------------------
    void buildTransferKeys();
    void checkLevel(CacheLevel level, char const* what) const;
    void releasePage(uint32_t index) noexcept;
    void findKept(CacheLevel level, char const* what, std::string const* keys, size_t count, PageId* out,
        int32_t const* lifeCycles = nullptr);
    size_t forgetUnclaimed(CacheLevel level, char const* what);
    [[nodiscard]] size_t unclaimed(CacheLevel level, char const* what) const;
    void closeLevel(CacheLevel level, char const* what);
    void noteEvent(Stream stream, EventPtr const& event);
    void notify(MigrationRecord const& record);
    void synchronizeAll();
    [[nodiscard]] LevelKind kindOf(CacheLevel level) const noexcept;
    // The level to tell that a page left a slot (ColdLevel::tracksBlobs()), or null.
    [[nodiscard]] ColdLevel* tracking(CacheLevel level) const noexcept
    {
        return tracking_[size_t(level)];
    }

    // --- manager_migrate.cpp: the migration transaction ------------------------------------
    // Waits once for the checked decodes this migration submitted, then drops every page whose
    // status is not kPageOk (see transfer()).
    void finishChecks(Stream stream, MigrationResult& result);
    void dropPage(uint32_t index, CacheLevel srcLevel, PoolGroupIndex srcGroup, int reason, MigrationResult& result);

    // --- manager_paths.cpp: one function per migration path --------------------------------
    [[nodiscard]] static uint8_t pathFor(LevelKind src, LevelKind dst) noexcept;
    // Steps 2-5 of one transfer. `pages` and `dstSlots` (the migration's own scratch) are
    // compacted in place when pages are dropped; `count` is then lowered.
    bool transfer(TransferKey const& key, uint32_t* pages, int32_t* dstSlots, size_t& count, Stream stream,
        MigrationResult& result, std::string& error);
    size_t chunkPages(TransferKey const& key) const noexcept;
    bool copyHotToHot(Transfer& t);
    bool encodeToAddressable(Transfer& t);
    bool decodeFromAddressable(Transfer& t);
    bool transcodeAddressable(Transfer& t, bool encode);
    bool copyAddressable(Transfer& t);
    bool encodeToStaged(Transfer& t);
    // encodeToStaged's stage when the ring is held by jobs in flight: free host-tier slots of the
    // same page size, if there are enough (false: none taken).
    bool encodeToHostSlots(Transfer& t);
    std::unique_ptr<Job> encodeJob(Transfer& t, std::byte* base);
    std::unique_ptr<Job> writeJob(Transfer& t, uint64_t calls);
    void dropUnread(TransferKey const& key, uint32_t index, int32_t dstSlot, int reason, MigrationResult& result);
    bool decodeFromStaged(Transfer& t);
    bool writeToStaged(Transfer& t);
    bool readToAddressable(Transfer& t);
    bool checkEnvelopes(Transfer& t);
    bool verifySources(Transfer& t);
    // manager_overlap.cpp: a decode from a verifying level on the CPU backend, each chunk's checks
    // running on a helper thread while the chunk before decodes.
    [[nodiscard]] bool overlapsChecks(Transfer const& t) const noexcept;
    bool decodeWithChecksAhead(Transfer& t);
    // manager_device_checks.cpp: a decode from a verifying level on a GPU, its blobs copied into
    // device memory (and checksummed there where they need it) before the codec reads the copies.
    struct DeviceChecks
    {
        explicit DeviceChecks(runtime::DeviceRuntime& r)
            : runtime(r)
        {
        }
        ~DeviceChecks();
        DeviceChecks(DeviceChecks const&) = delete;
        DeviceChecks& operator=(DeviceChecks const&) = delete;
        runtime::DeviceRuntime& runtime;
        Stream stream = nullptr;          ///< The copies into the staging area.
        Stream kernels = nullptr;         ///< The checksums, beside the next chunk's copy.
        uint64_t pageBytes = 0;           ///< Blob size the staging area is laid out for.
        size_t chunk = 0;                 ///< Pages per region.
        runtime::Allocation stage;        ///< Device memory, regions of `chunk` blobs.
        runtime::Allocation words;        ///< Mapped host: lengths, then checksums.
        std::vector<EventPtr> regionFree; ///< After the last decode that read each region.
    };
    [[nodiscard]] bool checksOnDevice(Transfer const& t) const noexcept;
    bool decodeWithDeviceChecks(Transfer& t);
    DeviceChecks& deviceChecks(uint64_t pageBytes);
    void checkResizable(CacheLevel level) const;
    void dropChecked(Transfer& t, size_t i, int reason);
    void dropFailedChecks(Transfer& t, std::vector<uint32_t>& pages, std::vector<int32_t>& dstSlots);
    template <class Check>
    bool keepChecked(Transfer& t, Check&& check);
    void waitForSlots(Transfer& t);
    bool transcode(Transfer& t, bool encode, std::byte* coldBase, PageIndexPair const* pairs, uint8_t* status);
    void harvestGpuTimes() const noexcept;
    void commit(Transfer& t, uint64_t calls, EventPtr const& finish);
    void fillJob(Transfer& t, Job& job);
    template <class SlotOf>
    bool queueJob(Transfer& t, std::unique_ptr<Job> job, std::byte* base, uint64_t pageBytes, SlotOf const& slotOf);
    void commitPages(Job& job, size_t count, EventPtr const& finish);

    // --- manager_async.cpp: staged transfers on the I/O thread --------------------------------
    friend class PendingMigration;
    MigrationResult migrateLocked(PageId const* ids, size_t count, CacheLevel dst, Stream stream,
        std::optional<CacheLevel> requiredSource, std::shared_ptr<PendingMigration> const& pending);
    // Queues a job for the I/O thread (started lazily); its pages become in flight.
    void enqueue(std::unique_ptr<Job> job);
    void ioLoop();
    void startJob(Job& job) noexcept;
    // On the CPU backend a staged write's encode is its job's, run on the I/O thread (the codec
    // works on the calling thread there: on the caller's it would block the call for the whole
    // encode). On a GPU the encode is queued on the call's stream and the I/O thread waits for it.
    [[nodiscard]] bool encodesOnIoThread() const noexcept;
    static void deferEncode(Job& job, std::byte* base, PageIndexPair const* pairs, size_t count);
    // On the I/O thread: a deferred encode (false, job.error set, when it failed).
    bool encodeOnIoThread(Job& job) noexcept;
    // On the CPU backend a staged read's decode is the I/O thread's too, run once its blobs
    // landed (its commit would run it under the manager's lock, blocking every caller).
    [[nodiscard]] bool decodesOnIoThread(Job const& job) const noexcept;
    void decodeOnIoThread(Job& job) noexcept;
    // A read job's page `i`: EnvelopeStatus::kOk when its blob may be decoded, else the drop reason.
    [[nodiscard]] int blobReadable(Job const& job, size_t i, uint64_t blobBytes) const noexcept;
    // Under the manager's lock: commits (or rolls back) every job whose I/O finished.
    void drainJobs();
    // False when the job was queued again (a decode submitted, whose wait comes next).
    bool commitJob(Job& job);
    bool decodeJob(Job& job, size_t kept);
    void settleDecode(Job& job);
    void failJob(Job& job, size_t count, EventPtr const& after, std::string const& error);
    runtime::Allocation takeStatusBuffer(size_t bytes);
    void finishCommit(Job& job, size_t kept, EventPtr const& finish);
    // Under the manager's lock: waits for the I/O of every job (of `pending`, or all) and commits it.
    void waitJobs(PendingMigration const* pending);
    // Under the manager's lock: waits until some job's I/O finished and commits what finished.
    void waitAnyJob();
    // Under the manager's lock: gives the decode jobs waiting for a staging slice theirs, in
    // submission order, and queues them for their reads.
    void stageWaiting();
    void useSlice(Job& job, StagingBuffer lease);
    bool encodeStaged(Job& job, StagingBuffer lease, std::string& error);
    // Under the manager's lock: waits for every job holding one of the pages.
    void waitForPages(PageId const* ids, size_t count);
    void stopIoThread() noexcept;
    [[nodiscard]] bool hasJobs() const noexcept
    {
        return !jobs_.empty();
    }
    void throwIfFailed(MigrationResult const& result, CacheLevel dst, size_t count);
    // A prefetched page leaves the host level (or is freed): counted used or wasted.
    void notePrefetchLeft(Page& p, bool used) noexcept;

    // --- manager_eviction.cpp ---------------------------------------------------------------
    [[nodiscard]] std::optional<CacheLevel> colderLevel(CacheLevel level) const noexcept;

    // --- manager_resize.cpp -----------------------------------------------------------------
    // Moves the pages in slots at or above limits[g] of every pool group of `level` into free
    // slots below it with the migration transaction; returns the pages moved.
    uint64_t compact(CacheLevel level, std::vector<uint64_t> const& limits, Stream stream);
    // Staged levels: no migration transaction (a page is never relocated inside such a level;
    // the level moves its bytes itself), the manager only renumbers its logical slots.
    void resizeStaged(CacheLevel level, uint64_t quotaBytes, Stream stream);
    uint64_t defragmentStaged(CacheLevel level);
    void renumberStaged(CacheLevel level, std::vector<uint64_t> const& limits);

    // One mutex per manager; owner_ names the thread holding it (nested calls pass), and
    // inObserver_ marks the observer callbacks, which must not call back in.
    mutable std::mutex mutex_;
    mutable std::atomic<std::thread::id> owner_{};
    bool inObserver_ = false;
    bool closed_ = false;

    std::unique_ptr<runtime::DeviceRuntime> runtime_;
    std::unique_ptr<StorageManager> storage_;
    Stream stream_ = nullptr;
    // Latest finish event per stream used: synchronize() waits on events, never on streams a
    // caller may have destroyed since.
    std::vector<std::pair<Stream, EventPtr>> lastEvents_;

    PageTable pages_;
    ContentKeys keys_;
    EvictionQueues lru_{pages_};
    uint64_t clock_ = 0;
    std::array<ColdLevel*, kNumLevels> tracking_{};

    // transfers_[src][dst] and transferOf_[src][dst][lifeCycle] -> index into transfers_[src][dst].
    std::array<std::array<std::vector<TransferKey>, kNumLevels>, kNumLevels> transfers_;
    std::array<std::array<std::vector<int32_t>, kNumLevels>, kNumLevels> transferOf_;

    // mutable: stats() adds the GPU times that completed since (harvestGpuTimes).
    mutable std::array<std::vector<PoolGroupStats>, kNumLevels> stats_;
    struct TimedCall
    {
        EventPtr start, end;
        bool encode;
        CacheLevel srcLevel;
        PoolGroupIndex srcGroup;
        CacheLevel dstLevel;
        PoolGroupIndex dstGroup;
        uint64_t calls;
    };
    static constexpr size_t kMaxTimedCalls = 4096; // pending at most; later calls go untimed meanwhile
    bool gpuTiming_ = false;
    mutable std::deque<TimedCall> timedCalls_; // in submission order
    std::vector<std::pair<int64_t, Observer>> observers_;
    // Page statuses of checked decodes (mapped host memory the codec's work writes), one byte
    // per page of one migration; read after its one wait at the end of the migration.
    runtime::Allocation statusBuf_;
    size_t statusCapacity_ = 0;
    std::vector<runtime::Allocation> statusFree_; ///< Status buffers of staged decodes, for reuse.
    struct CheckRange
    {
        TransferKey key;
        size_t first; ///< Offset into the status buffer and checkPages_.
        size_t count;
    };
    std::vector<CheckRange> checkRanges_;
    std::vector<uint32_t> checkPages_;
    size_t statusUsed_ = 0;
    int64_t nextObserver_ = 1;
    std::exception_ptr observerError_;

    // Staged jobs: jobs_ holds every job not yet committed, in submission order (changed under
    // the manager's lock and jobsMu_); queue_ those the I/O thread has not started. A job's
    // ioDone and its handle's counters are guarded by jobsMu_ (jobsCv_ signals them).
    std::mutex jobsMu_;
    std::condition_variable jobsCv_;
    std::vector<std::unique_ptr<Job>> jobs_;
    std::vector<Job*> queue_;
    size_t ioDoneJobs_ = 0; ///< Jobs in jobs_ whose I/O finished (committable).
    bool stopIo_ = false;
    std::thread ioThread_;
    std::shared_ptr<PendingMigration> current_; ///< The migration whose transfers are being submitted.
    bool prefetching_ = false;                  ///< Those transfers are a prefetch's.
    PrefetchStats prefetch_;
    uint64_t prefetchBytes_ = 0;                 ///< Host bytes of prefetched pages in flight or unused.
    std::unique_ptr<DeviceChecks> deviceChecks_; ///< Created by the first decode checked on a GPU.
};

} // namespace kvcodec::kvcm

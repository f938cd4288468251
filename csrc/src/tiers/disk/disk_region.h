// SPDX-License-Identifier: Apache-2.0
//
// The disk cold tier: one crash-safe tablespace region per cold pool group.
//
// A region is a directory holding a constant number of preallocated container files
// (max_bytes / container_bytes), each carved into fixed slots of the group's cold-page size
// (padded to 4 KiB in the file so O_DIRECT can address every slot), a human-readable journal
// (index.log) and a periodic atomic snapshot of the index (index.snapshot, with a backup).
// In RAM: a free-slot bitset and the key -> slot index.
//
// Write order (what makes a crash harmless): reserve slot -> write data -> fdatasync data ->
// append journal record -> fdatasync journal -> publish in the index. Journal appends are group
// committed (one fdatasync per batch); nothing is visible before its record is durable. A crash
// between data and journal leaves the slot free on restart, never a phantom page.
//
// Threads: the submitting thread only validates and enqueues. A pool of I/O workers does the
// pwrite/pread and checksums; one committer thread does the data and journal fdatasyncs, the
// journal appends and the snapshots. The store never touches CUDA: it moves host buffers (the
// manager hands it slices of its pinned page ring).
//
// Where the parts live: disk_region.cpp (opening, submission, tickets, closing),
// region_recovery.cpp (region.json reconciliation, containers, index recovery) with
// journal_replay.* and region_file.*, region_workers.cpp (I/O workers), region_commit.cpp
// (group commit, snapshots), region_resize.cpp (resize, defragmentation), region_layout.h (slot
// layout), free_slots.* (free-slot bitset), disk_util.* (shared file helpers).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/key_table.h"
#include "tiers/disk/file_io.h"
#include "tiers/disk/free_slots.h"
#include "tiers/disk/io_queue.h"
#include "tiers/disk/journal.h"
#include "tiers/disk/region_layout.h"

namespace kvcodec::disk {

enum class IoMode : int32_t
{
    kAuto = 0,     ///< O_DIRECT where the file system accepts it, buffered otherwise.
    kDirect = 1,   ///< O_DIRECT or fail to open.
    kBuffered = 2, ///< Page cache + fdatasync.
};

/// How the I/O workers issue reads and writes.
enum class IoBackend : int32_t
{
    kAuto = 0,    ///< io_uring where the kernel allows it, the thread pool otherwise.
    kThreads = 1, ///< One blocking pread/pwrite (or merged preadv/pwritev) at a time per worker.
    kUring = 2,   ///< io_uring or fail to open: each worker keeps up to queueDepth requests in flight.
};

/// What a write does when every slot is live.
enum class FullPolicy : int32_t
{
    kRefuse = 0,      ///< The write completes with kFull; nothing changes.
    kEvictOldest = 1, ///< The oldest published page (not being read) is retired durably first.
};

/// The codec whose blobs a region holds. Reopening with a different identity invalidates the
/// region (with a warning) instead of decoding foreign blobs.
struct CodecIdentity
{
    std::string name;
    uint32_t formatVersion = 0;
    std::string paramHash;  ///< Hash of the codec parameters (and whatever else shapes the blob).
    std::string paramsJson; ///< The parameters themselves, so tools can recreate the codec.
};

struct RegionConfig
{
    std::string name;            ///< Region (cold pool group) name; informational.
    uint64_t slotBytes = 0;      ///< Cold-page payload size.
    uint64_t maxBytes = 0;       ///< Total container bytes of the region.
    uint64_t containerBytes = 0; ///< Bytes per container file (rounded down to whole slots).
    CodecIdentity codec;
    IoMode ioMode = IoMode::kAuto;
    FullPolicy whenFull = FullPolicy::kRefuse;
    uint32_t ioThreads = 32;
    /// The thread pool by default: with one request per submission and many workers, io_uring
    /// measured slower on the reference host (see docs/disk-tier.md); opt in with kAuto or kUring.
    IoBackend ioBackend = IoBackend::kThreads;
    uint32_t queueDepth = 8;                  ///< Requests in flight per worker with io_uring (1..4096).
    uint64_t snapshotEveryRecords = 1u << 20; ///< Journal records between snapshots; 0 = only on close.
    uint32_t maxBatchRecords = 4096;          ///< Group-commit batch limit.
    std::string layoutJson;                   ///< Opaque description of the blob layout (for tools).
    bool readOnly = false;                    ///< Recover and serve reads; never modify a file.
    /// Reopening a region recorded with another container count (everything else equal) resizes
    /// it in place to this config's count (pages kept; dropped oldest first only when a shrink
    /// leaves too few slots) instead of invalidating it.
    bool resizeOnOpen = false;
    std::shared_ptr<FileIo> fileIo; ///< Null = POSIX (tests substitute a faulty one).
};

enum class StatusCode : int32_t
{
    kOk = 0,
    kPending = 1,
    kNotFound = 2,         ///< Unknown key (a miss).
    kChecksumMismatch = 3, ///< The slot's CRC-32C failed (a miss; counted and reported).
    kFull = 4,             ///< No free slot and the policy is kRefuse.
    kNoSpace = 5,          ///< ENOSPC from the file system.
    kIoError = 6,          ///< Any other I/O error (errno in the message).
    kInvalidArgument = 7,
    kClosed = 8,
};

struct Status
{
    StatusCode code = StatusCode::kOk;
    std::string message;
    uint32_t tag = 0; ///< For a successful read: the tag given to the write.
};

using Ticket = uint64_t;

/// What open() found and repaired.
struct RecoveryReport
{
    std::string snapshotUsed; ///< "index.snapshot", "index.snapshot.bak" or "" (none).
    uint64_t snapshotSeq = 0;
    uint64_t snapshotEntries = 0;
    uint64_t journalRecordsReplayed = 0;
    uint64_t journalCorruptLines = 0;
    uint64_t truncatedTailBytes = 0;
    uint64_t droppedEntries = 0; ///< Entries lost to damage (missing container, ...).
    bool created = false;        ///< The region was created (or recreated after invalidation).
    bool invalidated = false;    ///< A previous region with another identity or geometry was dropped.
    double seconds = 0.0;
    std::vector<std::string> warnings;
};

struct RegionStats
{
    uint64_t slotsTotal = 0;
    uint64_t slotsLive = 0;
    uint64_t slotsFree = 0;
    uint64_t puts = 0;
    uint64_t putErrors = 0;
    uint64_t putsRefusedFull = 0;
    uint64_t reads = 0;
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t checksumFailures = 0;
    uint64_t readErrors = 0;
    uint64_t erases = 0;
    uint64_t evictions = 0;
    uint64_t journalRecords = 0; ///< Appended since open.
    uint64_t journalBatches = 0;
    uint64_t journalBytes = 0; ///< Current size of index.log.
    uint64_t snapshots = 0;
    uint64_t lastSeq = 0;
    uint64_t bytesWritten = 0;
    uint64_t bytesRead = 0;
    uint64_t mergedIos = 0;      ///< Vectored writes/reads that moved several adjacent slots at once.
    uint64_t mergedSlots = 0;    ///< Slots those moved.
    uint64_t queuedSubmits = 0;  ///< io_uring submissions (each one system call for a batch of requests).
    uint64_t queuedRequests = 0; ///< Requests those carried.
    bool directIo = false;
    std::string ioBackend;   ///< "io_uring" or "threads".
    std::string backendNote; ///< Why io_backend "auto" runs the thread pool ("" when io_uring runs).
    bool failed = false;     ///< A journal repair failed: the region refuses writes until reopened.
};

/// What resize() or defragment() did.
struct ResizeReport
{
    uint32_t containersBefore = 0;
    uint32_t containersAfter = 0;
    uint64_t moved = 0;         ///< Pages copied to another slot (same key, bytes, checksum and tag).
    uint64_t dropped = 0;       ///< Pages erased because a shrink left too few slots (oldest first).
    uint64_t checksumDrops = 0; ///< Pages whose slot failed its checksum while being moved (erased).
};

/// A resize or defragmentation that could not complete: `code` is kFull (too few free slots),
/// kNoSpace (the file system is full) or kIoError; the message says what still holds.
class ResizeError : public std::runtime_error
{
public:
    ResizeError(StatusCode c, std::string const& message)
        : std::runtime_error(message)
        , code(c)
    {
    }
    StatusCode code;
};

/// Called after every batch of moves with (pages handled so far, pages to handle).
using ResizeProgress = std::function<void(uint64_t done, uint64_t total)>;

/// One live page, for enumeration (onboarding after a restart, tools).
struct PageInfo
{
    std::string key;
    uint32_t container;
    uint32_t slot;
    uint32_t tag;
    uint32_t crc;
    uint64_t seq;
};

struct RecordedIdentity;

class DiskRegion
{
public:
    /// Opens (creating, recovering or invalidating) the region in directory `dir`. Throws
    /// std::invalid_argument naming the offending field for a bad config, std::runtime_error for
    /// a region that cannot be opened (missing directory in read-only mode, ENOSPC while
    /// preallocating, locked by another process, ...).
    static std::unique_ptr<DiskRegion> open(std::string const& dir, RegionConfig config);

    /// Reads region.json of `dir` (throws std::runtime_error when missing or damaged).
    static FlatJson readRegionFile(std::string const& dir);

    ~DiskRegion();
    DiskRegion(DiskRegion const&) = delete;
    DiskRegion& operator=(DiskRegion const&) = delete;

    /// Enqueues a write of the page at `src` (`bytes` must equal slotBytes: cold pages are fixed
    /// size) under `key` (any bytes, 1..255) with a caller tag (e.g. the lifecycle). `src` must
    /// stay valid and unchanged until the ticket completes. Overwriting a key is allowed: the new
    /// page replaces the old one when its record is durable.
    Ticket submitWrite(std::string const& key, void const* src, size_t bytes, uint32_t tag = 0);
    /// Enqueues a read of `key` into `dst` (capacity `bytes` >= slotBytes). Unknown key:
    /// completes kNotFound.
    Ticket submitRead(std::string const& key, void* dst, size_t bytes);
    /// Retires `key` (no longer served from now on); the ticket completes when the retirement is
    /// durable. Unknown key: completes kNotFound.
    Ticket submitErase(std::string const& key);

    /// The ticket's status, or nullopt while it is pending. A completed status is returned once.
    std::optional<Status> poll(Ticket t);
    /// Blocks until the ticket completes (timeoutSeconds < 0: forever; on timeout: kPending).
    Status wait(Ticket t, double timeoutSeconds = -1.0);
    /// Blocks until every submitted operation has completed.
    void flush();

    [[nodiscard]] bool contains(std::string const& key) const;
    [[nodiscard]] std::optional<PageInfo> lookup(std::string const& key) const;
    [[nodiscard]] std::vector<PageInfo> pages() const;
    [[nodiscard]] RegionStats stats() const;
    [[nodiscard]] RecoveryReport const& recovery() const noexcept
    {
        return recovery_;
    }

    /// Messages about events that no ticket reports (a failed snapshot, the region failing);
    /// returned once. Checksum mismatches are reported through the read's Status.
    std::vector<std::string> drainEvents();

    /// Writes a snapshot now and rotates the journal (blocks commits meanwhile).
    void snapshot();

    /// Changes the region to `containers` container files (1..9999) while it stays open.
    /// Growing preallocates the new files before the new geometry is recorded. Shrinking first
    /// moves every live page of the cut containers into free slots of the kept ones (read, checked
    /// against its checksum, written, data synced, then one journal record per page that moves
    /// its key: until that record is durable the old slot stays the valid one), in batches of
    /// `batchPages` with `progress` called after each, then records the new geometry (snapshot,
    /// region.json, snapshot) and deletes the cut files. Submissions wait while it runs (the
    /// progress callback must not use the region). Too few free slots: std::runtime_error with
    /// nothing changed, unless `dropOldest` (then the oldest pages of the cut containers are
    /// erased). An I/O error: std::runtime_error; pages already moved stay valid where they are
    /// and the region keeps its old geometry and keeps working.
    ResizeReport resize(
        uint32_t containers, ResizeProgress const& progress = {}, bool dropOldest = false, uint32_t batchPages = 256);

    /// Moves live pages into the lowest slots (journaled like a shrink's moves), so the used
    /// slots are [0, live pages). Same waiting and failure rules as resize().
    ResizeReport defragment(ResizeProgress const& progress = {}, uint32_t batchPages = 256);
    /// Flushes, snapshots, stops the threads and closes the files. Idempotent.
    void close();

    [[nodiscard]] uint64_t slotBytes() const noexcept
    {
        return cfg_.slotBytes;
    }
    [[nodiscard]] uint64_t slotStride() const noexcept
    {
        return geo_.stride;
    }
    [[nodiscard]] uint32_t slotsPerContainer() const noexcept
    {
        return geo_.slotsPerContainer;
    }
    [[nodiscard]] uint32_t numContainers() const noexcept
    {
        return geo_.containers;
    }
    [[nodiscard]] RegionConfig const& config() const noexcept
    {
        return cfg_;
    }
    [[nodiscard]] std::string const& dir() const noexcept
    {
        return dir_;
    }

private:
    enum SlotState : uint8_t
    {
        kFree = 0,
        kReserved = 1, ///< A write is in flight.
        kLive = 2,     ///< Published.
        kRetiring = 3, ///< Unpublished; reusable once its retirement is durable and no read pins it.
    };

    struct Slot
    {
        uint32_t crc = 0;
        uint32_t tag = 0;
        uint64_t seq = 0;
        uint16_t pins = 0;
        uint8_t state = kFree;
        bool retireDurable = false;
    };

    struct Task
    {
        enum Kind : uint8_t
        {
            kWrite,
            kRead,
        } kind;
        Ticket ticket;
        std::string key;
        uint32_t slot;
        uint32_t tag;
        uint32_t crc;
        void const* src;
        void* dst;
    };

    struct CommitItem
    {
        bool put;
        Ticket ticket; ///< 0 for an eviction's retirement.
        std::string key;
        uint32_t slot;
        uint32_t crc;
        uint32_t tag;
        std::optional<Task> then; ///< A write waiting for this retirement (eviction).
    };

    DiskRegion(std::string dir, RegionConfig cfg);
    void openFiles();
    /// Rewrites a damaged or missing region.json from this configuration when the identity the
    /// journal and snapshot headers record agrees with it (or nothing was ever recorded), with a
    /// warning saying what was repaired; otherwise throws, naming what disagrees.
    void repairRegionFile(
        std::string const& what, FlatJson const* damaged, std::vector<RecordedIdentity> const& recorded, bool hasState);
    void recover();
    void startThreads();
    void workerLoop();
    /// The io_uring worker: takes up to the queue's depth of runs, submits them with one call.
    void workerLoopQueued(IoQueue& queue);
    void committerLoop();
    void runTask(Task& t, void* bounce);
    /// Whether a task's buffer can be used as is (no bounce buffer under O_DIRECT).
    bool inPlace(Task const& t) const;
    /// Whether `next` can join a vectored I/O after `last` (same kind, the adjacent slot of the
    /// same container, buffers used in place); the region must allow merging at all.
    bool mergeable(Task const& last, Task const& next) const;
    /// The vectored request of a run (and, for writes, each page's CRC-32C).
    IoRequest prepareRun(std::vector<Task>& run, std::vector<iovec>& iov, std::vector<uint32_t>& crcs);
    /// Completes a run from its request's result; a failed or short one is redone page by page.
    void finishRun(std::vector<Task>& run, ssize_t result, std::vector<uint32_t> const& crcs, void* bounce);
    /// Tasks of adjacent slots in one pwritev/preadv (prepareRun + finishRun).
    void runMerged(std::vector<Task>& run, void* bounce);
    void finishWrite(Task& t, uint32_t crc);
    void finishRead(Task& t, void const* buf, int rc, bool viaBounce);
    void commitBatch(std::vector<CommitItem>& batch);
    bool writeSnapshotLocked(); // commitMu_ held; false when the snapshot or the rotation failed
    FlatJson regionRecord() const;
    int writeRegionRecord();             // 0 or -errno
    void setLimitLocked(uint32_t limit); // mu_ held; rebuilds the free-slot bitset below `limit`
    void relocateBelow(
        uint32_t limit, ResizeProgress const& progress, bool dropOldest, uint32_t batchPages, ResizeReport& report);
    void setGeometry(uint32_t containers); // commitMu_ held, quiescent
    void beginExclusive();
    void endExclusive() noexcept;
    void checkWritable(char const* what) const;
    void applyPut(std::string key, uint32_t slot, uint32_t crc, uint32_t tag, uint64_t seq);
    void applyRecord(JournalRecord&& r);
    /// Recovery: drops the page of `slot` when the index names it (slot freed); true if it did.
    bool dropIndexed(uint32_t slot);
    void freeSlotLocked(uint32_t slot);
    void maybeReleaseLocked(uint32_t slot);
    /// mu_ for a submission, taken once no resize or defragmentation runs; throws when the region
    /// is closed and, given `readOnlyRefusal` (the message's end), when it is open read-only.
    std::unique_lock<std::mutex> lockToSubmit(char const* readOnlyRefusal);
    Ticket newTicketLocked();
    void completeLocked(Ticket t, Status s);
    void enqueueTask(Task t);
    void enqueueCommit(CommitItem item);
    std::string identityLine() const;
    std::string path(std::string const& leaf) const;
    void failRegion(std::string const& why);

    std::string dir_;
    RegionConfig cfg_;
    std::shared_ptr<FileIo> io_;
    /// Slot layout; the container count (and so the slot count) changes under mu_ (a resize).
    detail::SlotGeometry geo_;
    uint32_t openTarget_ = 0; ///< resizeOnOpen: the configured container count to reach.
    bool direct_ = false;
    std::vector<int> containerFds_;
    int journalFd_ = -1;
    int lockFd_ = -1;
    uint64_t journalSize_ = 0;
    RecoveryReport recovery_;
    std::vector<bool> freshContainers_;

    // Index and slots (mu_).
    mutable std::mutex mu_;
    std::condition_variable doneCv_;
    /// Key -> slot of every live page; a flat table of 8-byte entries (no node per key), each
    /// key read from slotKeys_ (so slotKeys_[slot] is set before the next lookup of its key).
    KeyTable<TagEntry> index_;
    std::vector<Slot> slots_;
    std::vector<std::string> slotKeys_;
    detail::FreeSlots free_; ///< Slots at or above its limit are never allocated (a shrink in progress).
    std::deque<std::pair<uint64_t, uint32_t>> fifo_; ///< (seq, slot) in publish order; stale pairs skipped.
    std::unordered_map<Ticket, Status> done_;
    Ticket nextTicket_ = 1;
    uint64_t inflight_ = 0;
    uint64_t lastSeq_ = 0;
    RegionStats st_;
    bool failed_ = false;
    bool exclusive_ = false; ///< A resize or defragmentation runs: submissions wait.
    std::condition_variable exclusiveCv_;
    std::vector<std::string> events_;
    std::string failReason_;

    // Worker queue.
    std::mutex taskMu_;
    std::condition_variable taskCv_;
    std::deque<Task> tasks_;
    // Commit queue.
    std::mutex commitQMu_;
    std::condition_variable commitCv_;
    std::vector<CommitItem> commitQ_;
    // Held by the committer while appending and by snapshot(): one writer of the journal.
    std::mutex commitMu_;
    uint64_t recordsSinceSnapshot_ = 0;
    bool mainSnapshotGood_ = false; ///< index.snapshot was loaded intact or written by us.
    bool repairedJournal_ = false;  ///< Recovery repaired journal records or dropped keys for damage.

    bool stopping_ = false;
    bool closed_ = false;
    std::vector<std::thread> workers_;
    /// One io_uring queue per worker (empty: the thread-pool backend).
    std::vector<std::unique_ptr<IoQueue>> queues_;
    std::string backendNote_; ///< Why kAuto fell back to threads ("" when it did not).
    std::thread committer_;
};

/// "ok", "not_found", ... (stable names used by the Python facade).
char const* statusName(StatusCode c) noexcept;

} // namespace kvcodec::disk

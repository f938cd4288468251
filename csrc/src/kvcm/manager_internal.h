// SPDX-License-Identifier: Apache-2.0
//
// Helpers shared by the KV-cache manager's source files (not part of its interface).
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvcm/levels.h"
#include "kvcm/manager.h"
#include "runtime/device_runtime.h"

namespace kvcodec::kvcm {

// The state one transfer's path works on.
struct KvCacheManager::Transfer
{
    TransferKey const& key;
    uint32_t* pages;   ///< Page indices; compacted in place when pages are dropped.
    int32_t* dstSlots; ///< Destination slot per page; compacted with `pages`.
    size_t& count;
    Stream stream;
    MigrationResult& result;
    std::string& error;
    SlotPool& srcPool;
    SlotPool& dstPool;
    bool hostCheck; ///< A declared envelope is checked on the host before decoding.
    uint16_t envelope;
    uint8_t* status;    ///< Status bytes of a checked decode (read in finishChecks), else null.
    bool checked;       ///< A checked decode: `status` is this transfer's range of the buffer.
    double seconds = 0; ///< Host time inside the codec.
    // A staging slice (the level's): released, recording its event on the stream when it owns
    // one, when the transfer returns.
    std::optional<StagingBuffer> lease;
    bool deferred = false; ///< The pages went to the I/O thread as a job: nothing to commit here.
    uint64_t calls = 0;    ///< Codec calls this transfer made (another thread's are not counted).
};

// One staged transfer handed to the manager's I/O thread: a write of blobs (encoded into a
// staging slice, or raw from an addressable level's slots) or a read of blobs into an
// addressable level's slots. The pages stay at their source, in flight, until commitJob().
struct KvCacheManager::Job
{
    bool write = false;
    bool prefetch = false;
    TransferKey key{};
    std::vector<uint32_t> pages;
    std::vector<uint32_t> generations;
    std::vector<int32_t> dstSlots;
    std::vector<int32_t> srcSlots; ///< Reads: the staged level's slots.
    std::vector<std::byte*> blobs; ///< Writes: the sources; reads: the destinations.
    std::vector<std::string> keys; ///< Writes: each page's content key (BlobName points here).
    std::vector<BlobName> names;
    std::vector<BlobStatus> status; ///< Reads: per page.
    std::vector<EventPtr> waits;    ///< The I/O thread host-waits for these before submitting.
    EventPtr finish;                ///< Protects the source slots once the job is committed.
    std::optional<StagingBuffer> lease;
    /// Free host-tier slots staging the encoded blobs instead of the ring (ring held by jobs).
    std::vector<int32_t> hostSlots;
    PoolGroupIndex hostGroup = 0;
    Stream stream = nullptr;
    double seconds = 0;
    uint64_t calls = 0;
    BlobIo io{};
    std::string error; ///< Why the I/O thread could not submit.
    bool started = false;
    bool ioDone = false;
    bool cancelled = false;
    uint64_t hostBytes = 0; ///< Prefetch: bytes this job counts against the budget.
    std::shared_ptr<PendingMigration> owner;
    // Staged -> hot: the blobs are read into a staging slice (`lease`) and decoded from it when
    // the job commits; a checked decode's statuses are read once the I/O thread waited for it.
    bool decode = false;
    bool unstaged = false; ///< Waits for a slice (every one was held): not queued for I/O yet.
    /// A write whose encode waits with it for a slice (srcSlots: the hot slots it reads): the
    /// encode is submitted on the call's stream once stageWaiting() gives it one.
    bool encodeLater = false;
    /// CPU backend: the encode is the I/O thread's, run before the writes (each pair: the blob's
    /// index at `encodeBase`, the hot slot it reads), so the caller never runs it.
    bool encodeOnIo = false;
    std::byte* encodeBase = nullptr;
    std::vector<PageIndexPair> encodePairs;
    bool decoded = false;   ///< The decode was submitted; the job is queued again for its wait.
    bool hostCheck = false; ///< The envelopes are checked on the host before decoding.
    uint16_t envelope = 0;
    bool checked = false;             ///< The decode writes one status byte per page.
    runtime::Allocation checkStatus;  ///< Mapped host memory for those bytes.
    std::vector<uint32_t> leaseIndex; ///< Each kept page's blob index in the slice.
    /// CPU backend: the I/O thread completed the batch and decoded the good blobs
    /// (decodeOnIoThread(); `error` says when either failed); the commit only settles the pages.
    bool decodedOnIo = false;
    std::vector<uint8_t> decodeStatus; ///< A checked decode's status per decoded page.
};

/// The drop reason of a staged read that did not return a good blob (missing, or corrupt).
inline int unreadReason(BlobStatus status) noexcept
{
    return status == BlobStatus::kMissing ? kDropBlobMissing : kDropBlobCorrupt;
}

} // namespace kvcodec::kvcm

namespace kvcodec::kvcm::detail {

// Scratch reused across calls so a warm migration allocates nothing (one per thread).
struct Scratch
{
    std::vector<uint32_t> pages;
    std::vector<uint32_t> order;
    std::vector<int32_t> bucket;
    std::vector<size_t> starts;
    std::vector<size_t> fill;
    std::vector<int32_t> dstSlots;
    std::vector<uint64_t> needs;
    std::vector<PageIndexPair> pairs;
    std::vector<runtime::Event*> events;
    std::vector<PageIndexPair> codecPairs;
    std::vector<int32_t> verifySlots;
    std::vector<uint8_t> verified;
};
Scratch& scratch() noexcept;

// Waits on each distinct event once (on `stream`, or on the host when nullopt); consecutive
// pages usually share one.
inline void waitAll(std::vector<runtime::Event*>& events, std::optional<Stream> stream)
{
    std::sort(events.begin(), events.end());
    events.erase(std::unique(events.begin(), events.end()), events.end());
    for (runtime::Event* e : events)
    {
        if (stream)
        {
            e->waitOn(*stream);
        }
        else
        {
            e->synchronize();
        }
    }
}

// `last` remembers the previous event of one source of events (source slots, destination
// slots), so runs of pages protected by one event add it once.
inline void collect(std::vector<runtime::Event*>& events, EventPtr const& e, runtime::Event*& last)
{
    if (e && e.get() != last)
    {
        events.push_back(e.get());
        last = e.get();
    }
}

} // namespace kvcodec::kvcm::detail

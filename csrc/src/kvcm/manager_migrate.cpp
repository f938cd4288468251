// SPDX-License-Identifier: Apache-2.0
//
// The migration transaction: every page is resolved and bucketed by transfer (source level,
// pool groups, batching representative), every destination slot is taken before any work is
// submitted, each transfer runs its path (manager_paths.cpp), and a failed transfer rolls back
// itself and every later one. Checked decodes are settled once at the end.
#include "kvcm/manager.h"

#include <algorithm>

#include "kvcm/manager_internal.h"
#include "runtime/nvtx.h"

namespace kvcodec::kvcm {

MigrationResult KvCacheManager::migrate(
    PageId const* ids, size_t count, CacheLevel dst, Stream stream, std::optional<CacheLevel> requiredSource)
{
    CallGuard guard(*this, "migrate");
    auto const pending = std::make_shared<PendingMigration>(*this, count);
    MigrationResult result;
    try
    {
        result = migrateLocked(ids, count, dst, stream, requiredSource, pending);
    }
    catch (MigrationError const& e)
    {
        // Staged transfers submitted before the failure land first (a blocking call leaves
        // nothing in flight) and count as committed.
        waitJobs(pending.get());
        throw MigrationError(e.what(), e.committedPages + pending->result_.moved);
    }
    catch (...)
    {
        waitJobs(pending.get());
        throw;
    }
    waitJobs(pending.get());
    MigrationResult& async = pending->result_;
    result.moved += async.moved;
    result.dropped.insert(result.dropped.end(), async.dropped.begin(), async.dropped.end());
    result.failed = std::move(async.failed);
    result.error = std::move(async.error);
    storage_->maintain(true); // A blocking call's pages are where other processes find them at once.
    throwIfFailed(result, dst, count);
    if (pending->observerError_)
    {
        std::rethrow_exception(pending->observerError_); // Everything committed, as synchronously.
    }
    return result;
}

std::shared_ptr<PendingMigration> KvCacheManager::submit(
    PageId const* ids, size_t count, CacheLevel dst, Stream stream, std::optional<CacheLevel> requiredSource)
{
    CallGuard guard(*this, "submit");
    auto const pending = std::make_shared<PendingMigration>(*this, count);
    MigrationResult result = migrateLocked(ids, count, dst, stream, requiredSource, pending);
    // What completed synchronously joins what the I/O thread will add.
    MigrationResult& r = pending->result_;
    r.moved += result.moved;
    r.dropped.insert(r.dropped.end(), result.dropped.begin(), result.dropped.end());
    return pending;
}

MigrationResult KvCacheManager::migrateLocked(PageId const* ids, size_t count, CacheLevel dst, Stream stream,
    std::optional<CacheLevel> requiredSource, std::shared_ptr<PendingMigration> const& pending)
{
    nvtx::Range range("kvcodec migrate", count);
    checkLevel(dst, "the destination level");
    storage_->maintain();
    waitForPages(ids, count); // Ordered after the staged transfers holding any of these pages.
    current_ = pending;
    struct Reset
    {
        std::shared_ptr<PendingMigration>& p;
        ~Reset()
        {
            p.reset();
        }
    } reset{current_};
    if (stream == nullptr || stream == cudaStreamLegacy)
    {
        stream = stream_; // Blocking: ordered after work on the legacy default stream.
    }
    MigrationResult result;
    if (count == 0)
    {
        return result;
    }
    uint32_t const epoch = pages_.nextEpoch();
    detail::Scratch& s = detail::scratch();
    size_t const d = size_t(dst);
    std::array<size_t, kNumLevels + 1> base{};
    for (int l = 0; l < kNumLevels; ++l)
    {
        base[size_t(l) + 1] = base[size_t(l)] + transfers_[size_t(l)][d].size();
    }
    size_t const numBuckets = base[kNumLevels];

    // Resolve every page and count them per (source level, transfer key) bucket.
    s.pages.resize(count);
    s.bucket.resize(count);
    s.starts.assign(numBuckets + 1, 0);
    for (size_t i = 0; i < count; ++i)
    {
        uint32_t const index = pages_.resolve(ids[i], i);
        Page& p = pages_[index];
        if (p.mark == epoch)
        {
            throw std::invalid_argument("pages[" + std::to_string(i) + "] (page " + hexId(ids[i]) + ") appears twice");
        }
        if (requiredSource && CacheLevel(p.level) != *requiredSource)
        {
            throw std::invalid_argument("pages[" + std::to_string(i) + "] (page " + hexId(ids[i]) + ") is at the "
                + levelName(CacheLevel(p.level)) + " level; this call moves pages from the "
                + levelName(*requiredSource) + " level only");
        }
        size_t const src = size_t(p.level);
        int32_t const k = transferOf_[src][d][size_t(p.lifeCycle)];
        if (k < 0)
        {
            // The path table's one gap: a staged level to a staged level (itself included).
            if (CacheLevel(p.level) == dst)
            {
                throw std::invalid_argument("pages[" + std::to_string(i) + "] (page " + hexId(ids[i])
                    + ") is already at the " + levelName(dst) + " level; the " + levelName(dst)
                    + " tier places its blobs itself (no relocation)");
            }
            throw std::invalid_argument("pages[" + std::to_string(i) + "] (page " + hexId(ids[i]) + ") is at the "
                + levelName(CacheLevel(p.level)) + " level, which has no direct path to the " + levelName(dst)
                + " level (both are staged): migrate it to the host or hot level first");
        }
        p.mark = epoch;
        int32_t const b = int32_t(base[src]) + k;
        s.pages[i] = index;
        s.bucket[i] = b;
        ++s.starts[size_t(b) + 1];
    }
    for (size_t b = 0; b < numBuckets; ++b)
    {
        s.starts[b + 1] += s.starts[b];
    }
    s.fill.assign(s.starts.begin(), s.starts.end() - 1);
    s.order.resize(count);
    for (size_t i = 0; i < count; ++i)
    {
        s.order[s.fill[size_t(s.bucket[i])]++] = s.pages[i];
    }

    auto keyOfBucket = [&](size_t b) -> TransferKey const& {
        size_t src = 0;
        while (b >= base[src + 1])
        {
            ++src;
        }
        return transfers_[src][d][b - base[src]];
    };

    // Checked decodes (cold -> hot with a codec that reports page statuses) write one status
    // byte per page into mapped host memory; the buffer is free here: every migration waits for
    // its checks before returning.
    checkRanges_.clear();
    checkPages_.clear();
    statusUsed_ = 0;
    if (dst == CacheLevel::kHot && storage_->checkedDecode() && count > statusCapacity_)
    {
        size_t const capacity = std::max(count, 2 * statusCapacity_);
        statusBuf_ = runtime::Allocation(*runtime_, runtime::MemoryKind::kMappedHost, capacity);
        statusCapacity_ = capacity;
    }

    // Step 1: every destination slot is allocated before any work is submitted.
    s.needs.assign(storage_->numPoolGroups(dst), 0);
    for (size_t b = 0; b < numBuckets; ++b)
    {
        if (s.starts[b + 1] > s.starts[b])
        {
            s.needs[size_t(keyOfBucket(b).dstGroup)] += s.starts[b + 1] - s.starts[b];
        }
    }
    for (size_t g = 0; g < s.needs.size(); ++g)
    {
        SlotPool& pool = storage_->slots(dst, PoolGroupIndex(g));
        if (s.needs[g] > pool.freeSlots())
        {
            throw CapacityError("cannot migrate " + std::to_string(count) + " pages to the " + levelName(dst)
                + " level: " + std::to_string(s.needs[g]) + " go to its pool group " + std::to_string(g)
                + ", which has " + std::to_string(pool.freeSlots()) + " free of " + std::to_string(pool.numSlots())
                + " slots");
        }
    }
    s.dstSlots.resize(count);
    for (size_t b = 0; b < numBuckets; ++b)
    {
        if (s.starts[b + 1] == s.starts[b])
        {
            continue;
        }
        SlotPool& pool = storage_->slots(dst, keyOfBucket(b).dstGroup);
        for (size_t i = s.starts[b]; i < s.starts[b + 1]; ++i)
        {
            s.dstSlots[i] = pool.take();
        }
    }

    // Steps 2-5 per transfer (one codec call's worth of pages at most).
    for (size_t b = 0; b < numBuckets; ++b)
    {
        if (s.starts[b + 1] == s.starts[b])
        {
            continue;
        }
        TransferKey const& key = keyOfBucket(b);
        size_t const chunk = chunkPages(key);
        for (size_t pos = s.starts[b]; pos < s.starts[b + 1]; pos += chunk)
        {
            size_t n = std::min(chunk, s.starts[b + 1] - pos);
            std::string error;
            bool ok = false;
            try
            {
                ok = transfer(key, &s.order[pos], &s.dstSlots[pos], n, stream, result, error);
            }
            catch (std::exception const& e)
            {
                error = e.what();
            }
            if (ok)
            {
                continue;
            }
            // Roll back: the failed transfer's destination slots may have seen partial work, so
            // they become reusable after what is on the stream now; later slots were untouched.
            EventPtr partial;
            try
            {
                partial = runtime_->record(stream);
            }
            catch (...)
            {
                runtime_->synchronize(stream);
            }
            SlotPool& failed = storage_->slots(dst, key.dstGroup);
            for (size_t i = pos; i < pos + n; ++i)
            {
                failed.give(s.dstSlots[i], partial);
            }
            size_t rest = pos + std::min(chunk, s.starts[b + 1] - pos);
            for (size_t bb = b; bb < numBuckets; ++bb)
            {
                size_t const end = s.starts[bb + 1];
                if (end <= rest)
                {
                    continue;
                }
                SlotPool& pool = storage_->slots(dst, keyOfBucket(bb).dstGroup);
                for (size_t i = std::max(rest, s.starts[bb]); i < end; ++i)
                {
                    pool.give(s.dstSlots[i], pool.ready(s.dstSlots[i]));
                }
            }
            // Committed checked decodes are settled first: a page whose blob was bad is dropped,
            // never reported committed.
            std::string checkError;
            try
            {
                finishChecks(stream, result);
            }
            catch (std::exception const& e)
            {
                checkError
                    = std::string(" (waiting for the committed pages' decode statuses failed too: ") + e.what() + ")";
            }
            throw MigrationError("migration to the " + std::string(levelName(dst)) + " level failed after "
                    + std::to_string(result.moved) + " of " + std::to_string(count) + checkError
                    + " pages were committed; the other pages stay where they were and can be retried: " + error,
                result.moved);
        }
    }
    finishChecks(stream, result);
    if (observerError_)
    {
        std::exception_ptr e = observerError_;
        observerError_ = nullptr;
        std::rethrow_exception(e);
    }
    return result;
}

void KvCacheManager::finishChecks(Stream stream, MigrationResult& result)
{
    if (checkRanges_.empty())
    {
        return;
    }
    // One wait per migration (never per page), sleeping rather than spinning; then only the
    // status bytes are read on the host, never the blobs.
    runtime_->waitBlocking(stream);
    auto const* status = reinterpret_cast<uint8_t const*>(statusBuf_.data());
    for (CheckRange const& range : checkRanges_)
    {
        for (size_t i = range.first; i < range.first + range.count; ++i)
        {
            uint8_t const st = status[i];
            if (st != kPageOk)
            {
                int const reason = st < kNumDropReasons ? int(st) : int(kPageDecodeFailed);
                dropPage(checkPages_[i], range.key.src, range.key.srcGroup, reason, result);
                // The page was counted onboarded when its decode was submitted.
                uint64_t const coldBytes = storage_->pageBytes(range.key.src, range.key.srcGroup);
                for (auto* st2 : {&stats_[size_t(range.key.src)][size_t(range.key.srcGroup)],
                         &stats_[size_t(CacheLevel::kHot)][size_t(range.key.dstGroup)]})
                {
                    --st2->pagesOnboarded;
                    st2->bytesOnboarded -= coldBytes;
                }
                --result.moved;
            }
        }
    }
    checkRanges_.clear();
    checkPages_.clear();
    statusUsed_ = 0;
}

void KvCacheManager::dropPage(
    uint32_t index, CacheLevel srcLevel, PoolGroupIndex srcGroup, int reason, MigrationResult& result)
{
    Page const& p = pages_[index];
    if (p.level >= 0)
    {
        PoolGroupIndex const g = storage_->poolGroup(CacheLevel(p.level), p.lifeCycle);
        SlotPool& pool = storage_->slots(CacheLevel(p.level), g);
        pool.give(p.slot, pool.ready(p.slot));
    }
    auto& st = stats_[size_t(srcLevel)][size_t(srcGroup)];
    ++st.pagesDropped;
    ++st.droppedBy[size_t(reason)];
    result.dropped.push_back(makeId(index, p.generation));
    releasePage(index);
}

} // namespace kvcodec::kvcm

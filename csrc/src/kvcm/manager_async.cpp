// SPDX-License-Identifier: Apache-2.0
//
// Staged transfers off the caller's thread. A migration path that reads or writes a staged
// level's blobs (a disk tier) does its stream work (the encode, the waits for its slots) on the
// caller's thread and hands the blob I/O to the manager's I/O thread as a job. The I/O thread
// host-waits for the job's events (the encode, never the caller), submits the level's reads or
// writes, waits for them without the manager's lock, and commits the job under the lock when it
// can take it at once; whoever holds the lock and needs a job finished (a blocking migrate(), a
// call on an in-flight page, a full staging ring, wait()) commits finished jobs itself, so no
// thread ever waits for the lock while another waits for it. Until its job commits a page stays
// at its source level, out of the eviction queues: a failed job changes nothing but its
// destination slots.
#include <algorithm>
#include <chrono>

#include "kvcm/manager.h"
#include "kvcm/manager_internal.h"

namespace kvcodec::kvcm {

bool PendingMigration::done() const
{
    {
        std::lock_guard<std::mutex> lock(manager_.jobsMu_);
        if (commitLeft_ == 0)
        {
            return true;
        }
        if (ioLeft_ > 0)
        {
            return false;
        }
    }
    // Every transfer's I/O finished: commit them here when the manager is free now.
    KvCacheManager::CallGuard guard(manager_, "PendingMigration.done", std::try_to_lock);
    if (guard.entered() && !manager_.closed_)
    {
        manager_.drainJobs();
    }
    std::lock_guard<std::mutex> lock(manager_.jobsMu_);
    return commitLeft_ == 0;
}

MigrationResult PendingMigration::wait()
{
    {
        // The I/O first, without the manager's lock: other callers go on meanwhile.
        std::unique_lock<std::mutex> lock(manager_.jobsMu_);
        manager_.jobsCv_.wait(lock, [&] { return ioLeft_ == 0; });
        if (commitLeft_ == 0)
        {
            if (observerError_)
            {
                std::rethrow_exception(observerError_);
            }
            return result_;
        }
    }
    KvCacheManager::CallGuard guard(manager_, "PendingMigration.wait");
    manager_.waitJobs(this);
    if (observerError_)
    {
        std::rethrow_exception(observerError_);
    }
    return result_;
}

void PendingMigration::cancel()
{
    std::lock_guard<std::mutex> lock(manager_.jobsMu_);
    cancelled_ = true;
    for (KvCacheManager::Job* job : manager_.queue_)
    {
        if (job->owner.get() == this && job->prefetch && !job->started)
        {
            job->cancelled = true;
        }
    }
}

void KvCacheManager::enqueue(std::unique_ptr<Job> job)
{
    job->owner = current_;
    job->prefetch = prefetching_;
    if (job->prefetch)
    {
        job->hostBytes = job->pages.size() * storage_->pageBytes(job->key.dst, job->key.dstGroup);
        prefetchBytes_ += job->hostBytes;
    }
    for (uint32_t index : job->pages)
    {
        lru_.erase(index); // Not evictable while in flight (EvictionQueues::insert skips it too).
        pages_[index].inFlight = true;
    }
    {
        std::lock_guard<std::mutex> lock(jobsMu_);
        ++job->owner->ioLeft_;
        ++job->owner->commitLeft_;
        if (!job->unstaged)
        {
            queue_.push_back(job.get());
        }
        jobs_.push_back(std::move(job));
        if (!ioThread_.joinable())
        {
            ioThread_ = std::thread([this] { ioLoop(); });
        }
    }
    jobsCv_.notify_all(); // After the unlock: the thread it wakes finds the lock free.
}

void KvCacheManager::startJob(Job& job) noexcept
{
    try
    {
        for (EventPtr const& e : job.waits)
        {
            e->synchronize();
        }
    }
    catch (std::exception const& e)
    {
        job.error = std::string("waiting for the work the transfer depends on failed: ") + e.what();
        return;
    }
    if (job.decoded)
    {
        return; // Its decode was what it waited for: the statuses can be read now.
    }
    if (job.encodeOnIo && !encodeOnIoThread(job))
    {
        return;
    }
    ColdLevel* cold = storage_->coldLevel(job.write ? job.key.dst : job.key.src);
    size_t const n = job.pages.size();
    if (job.write)
    {
        job.io = cold->submitWrite(job.key.dstGroup, job.dstSlots.data(), job.blobs.data(), job.names.data(), n);
    }
    else
    {
        job.io = cold->submitRead(job.key.srcGroup, job.srcSlots.data(), job.blobs.data(), n, job.status.data());
    }
}

void KvCacheManager::ioLoop()
{
    std::vector<Job*> starting;
    std::vector<Job*> submitted; // In submission order; the oldest is awaited first.
    size_t awaited = 0;
    for (;;)
    {
        {
            std::unique_lock<std::mutex> lock(jobsMu_);
            auto const ready = [&] { return stopIo_ || !queue_.empty() || awaited < submitted.size(); };
            while (!ready())
            {
                if (ioDoneJobs_ == 0)
                {
                    jobsCv_.wait(lock);
                    continue;
                }
                // Finished jobs nobody committed yet (the lock was busy): retry shortly.
                lock.unlock();
                {
                    CallGuard guard(*this, "the I/O thread", std::try_to_lock);
                    if (guard.entered() && !closed_)
                    {
                        drainJobs();
                    }
                }
                lock.lock();
                if (!ready() && ioDoneJobs_ > 0)
                {
                    jobsCv_.wait_for(lock, std::chrono::microseconds(200));
                }
            }
            if (stopIo_ && queue_.empty() && awaited == submitted.size())
            {
                return;
            }
            starting.swap(queue_);
            queue_.clear();
            for (Job* job : starting)
            {
                job->started = !job->cancelled;
            }
        }
        for (Job* job : starting)
        {
            if (job->started)
            {
                startJob(*job);
            }
            submitted.push_back(job);
        }
        starting.clear();
        if (awaited < submitted.size())
        {
            Job* job = submitted[awaited++];
            if (job->started && job->io.id != 0)
            {
                storage_->coldLevel(job->write ? job->key.dst : job->key.src)->awaitIo(job->io);
                if (decodesOnIoThread(*job))
                {
                    decodeOnIoThread(*job);
                }
            }
            {
                std::lock_guard<std::mutex> lock(jobsMu_);
                job->ioDone = true;
                ++ioDoneJobs_;
                --job->owner->ioLeft_;
            }
            jobsCv_.notify_all();
            if (awaited == submitted.size())
            {
                submitted.clear();
                awaited = 0;
            }
            CallGuard guard(*this, "the I/O thread", std::try_to_lock);
            if (guard.entered() && !closed_)
            {
                drainJobs();
            }
        }
    }
}

void KvCacheManager::drainJobs()
{
    std::vector<Job*> done;
    {
        std::lock_guard<std::mutex> lock(jobsMu_);
        if (ioDoneJobs_ == 0)
        {
            return;
        }
        for (auto const& job : jobs_)
        {
            if (job->ioDone)
            {
                done.push_back(job.get());
            }
        }
    }
    for (Job* job : done)
    {
        bool finished = true;
        try
        {
            finished = commitJob(*job);
        }
        catch (std::exception const& e)
        {
            if (job->owner->result_.error.empty())
            {
                job->owner->result_.error = std::string("committing a disk transfer failed: ") + e.what();
            }
        }
        std::shared_ptr<PendingMigration> const owner = job->owner;
        std::lock_guard<std::mutex> lock(jobsMu_);
        --ioDoneJobs_;
        if (!finished)
        {
            // Its decode was submitted: the I/O thread waits for it, then it commits again.
            job->ioDone = false;
            job->started = false;
            job->io = {};
            ++owner->ioLeft_;
            queue_.push_back(job);
            continue;
        }
        --owner->commitLeft_;
        jobs_.erase(std::find_if(jobs_.begin(), jobs_.end(), [&](auto const& j) { return j.get() == job; }));
    }
    stageWaiting(); // The commits freed slices.
    jobsCv_.notify_all();
}

void KvCacheManager::stageWaiting()
{
    bool held = false;
    for (auto const& job : jobs_)
    {
        held = held || job->lease.has_value();
    }
    for (auto const& job : jobs_)
    {
        if (!job->unstaged)
        {
            continue;
        }
        // A read's slice is written by the host (its earlier decodes waited for); a write's by
        // its encode, ordered on the call's stream.
        bool const write = job->write;
        std::string error;
        std::optional<StagingBuffer> lease;
        if (!job->cancelled)
        {
            lease = storage_->coldLevel(write ? job->key.dst : job->key.src)
                        ->stage(write ? job->key.dstGroup : job->key.srcGroup, job->pages.size(),
                            write ? std::optional<Stream>(job->stream) : std::nullopt, error);
            if (!lease && held)
            {
                return; // Later ones wait too: slices are taken in submission order.
            }
        }
        if (lease && !write)
        {
            useSlice(*job, std::move(*lease));
        }
        else if (lease && !encodeStaged(*job, std::move(*lease), error))
        {
            error = "encoding the pages for the " + std::string(levelName(job->key.dst)) + " level failed: " + error;
        }
        std::lock_guard<std::mutex> lock(jobsMu_);
        job->unstaged = false;
        if (!job->lease)
        {
            // Cancelled, or no job holds a slice and still none fits, or its encode failed: it
            // fails, nothing moved.
            job->error = job->cancelled ? "" : error;
            job->ioDone = true;
            ++ioDoneJobs_;
            --job->owner->ioLeft_;
            continue;
        }
        held = true;
        queue_.push_back(job.get());
    }
}

// A deferred write's encode (Job::encodeLater), once stageWaiting() found it a slice: submitted on
// the call's stream, after whatever the call found and left there, and host-waited for by the I/O
// thread as an encode the call submitted itself would be. On failure the slice goes back behind
// the stream and `error` says why. Uses no per-thread scratch: it runs inside whichever call
// commits jobs.
bool KvCacheManager::encodeStaged(Job& job, StagingBuffer lease, std::string& error)
{
    size_t n = job.pages.size();
    std::vector<PageIndexPair> pairs(n);
    for (size_t i = 0; i < n; ++i)
    {
        pairs[i] = {int32_t(i), job.srcSlots[i]};
    }
    if (encodesOnIoThread())
    {
        deferEncode(job, lease.data(), pairs.data(), n);
        useSlice(job, std::move(lease));
        return true;
    }
    Transfer t{job.key, job.pages.data(), job.dstSlots.data(), n, job.stream, job.owner->result_, error,
        storage_->slots(job.key.src, job.key.srcGroup), storage_->slots(job.key.dst, job.key.dstGroup), false, 0,
        nullptr, false, 0, std::nullopt};
    bool ok = false;
    try
    {
        ok = transcode(t, true, lease.data(), pairs.data(), nullptr);
    }
    catch (std::exception const& e)
    {
        error = e.what();
    }
    if (!ok)
    {
        lease.setStream(job.stream); // Released behind whatever the codec submitted.
        return false;
    }
    job.calls = t.calls;
    job.seconds += t.seconds;
    job.finish = runtime_->record(job.stream);
    job.waits.clear();
    if (job.finish)
    {
        job.waits.push_back(job.finish);
    }
    useSlice(job, std::move(lease));
    return true;
}

bool KvCacheManager::commitJob(Job& job)
{
    if (job.decoded)
    {
        settleDecode(job);
        return true;
    }
    MigrationResult& result = job.owner->result_;
    ColdLevel* cold = storage_->coldLevel(job.write ? job.key.dst : job.key.src);
    size_t const n = job.pages.size();
    std::string error;
    bool ok = true;
    if (job.cancelled)
    {
        ok = false;
    }
    else if (!job.error.empty())
    {
        std::string ignored;
        if (job.io.id != 0 && !job.decodedOnIo)
        {
            cold->complete(job.io, ignored);
        }
        ok = false;
        error = job.error;
    }
    else if (!job.decodedOnIo) // Else completed on the I/O thread, and decoded.
    {
        ok = cold->complete(job.io, error);
    }
    if (job.lease && (!ok || !job.decode))
    {
        job.lease->releaseFinished(); // The I/O thread waited for the encode; the I/O is done.
        job.lease.reset();
    }
    if (!job.hostSlots.empty())
    {
        SlotPool& host = storage_->slots(CacheLevel::kHost, job.hostGroup);
        for (int32_t slot : job.hostSlots)
        {
            host.give(slot, job.finish); // The writes read them; the encode is all that could be left.
        }
        job.hostSlots.clear();
    }
    for (uint32_t index : job.pages)
    {
        pages_[index].inFlight = false;
    }
    if (!ok)
    {
        failJob(job, n, nullptr, error);
        return true;
    }
    size_t kept = n;
    if (!job.write)
    {
        // A missing or corrupt blob drops its page (a miss), as does an envelope that fails its
        // host check before a decode.
        uint64_t const hostBytes = job.prefetch ? storage_->pageBytes(job.key.dst, job.key.dstGroup) : 0;
        uint64_t const blobBytes = cold->pageBytes(job.key.srcGroup);
        job.leaseIndex.resize(n);
        kept = 0;
        for (size_t i = 0; i < n; ++i)
        {
            uint32_t const index = job.pages[i];
            int const reason = blobReadable(job, i, blobBytes);
            if (reason == int(EnvelopeStatus::kOk))
            {
                job.pages[kept] = index;
                job.dstSlots[kept] = job.dstSlots[i];
                job.generations[kept] = job.generations[i];
                job.leaseIndex[kept] = uint32_t(i);
                ++kept;
                continue;
            }
            dropUnread(job.key, index, job.dstSlots[i], reason, result);
            if (job.prefetch)
            {
                ++prefetch_.failed;
                prefetchBytes_ -= hostBytes;
            }
        }
        job.pages.resize(kept);
        job.dstSlots.resize(kept);
        job.generations.resize(kept);
    }
    if (kept == 0)
    {
        job.lease.reset();
        return true;
    }
    if (job.decodedOnIo)
    {
        job.lease.reset(); // The I/O thread's decode read it and returned.
        settleDecode(job);
        return true;
    }
    if (job.decode)
    {
        return decodeJob(job, kept);
    }
    finishCommit(job, kept, job.write ? job.finish : nullptr);
    return true;
}

// Nothing moves: the destination slots go back (after `after`: work that may have written them
// partly), the pages stay where they were, evictable again; each is reported failed.
void KvCacheManager::failJob(Job& job, size_t count, EventPtr const& after, std::string const& error)
{
    MigrationResult& result = job.owner->result_;
    SlotPool& dstPool = storage_->slots(job.key.dst, job.key.dstGroup);
    for (size_t i = 0; i < count; ++i)
    {
        dstPool.give(job.dstSlots[i], after ? after : dstPool.ready(job.dstSlots[i]));
        pages_[job.pages[i]].inFlight = false;
        lru_.insert(job.pages[i]);
        if (!job.cancelled)
        {
            result.failed.push_back(makeId(job.pages[i], job.generations[i]));
        }
    }
    if (result.error.empty() && !error.empty())
    {
        result.error = error;
    }
    if (job.prefetch)
    {
        (job.cancelled ? prefetch_.cancelled : prefetch_.failed) += count;
        prefetchBytes_ -= job.hostBytes;
    }
}

void KvCacheManager::settleDecode(Job& job)
{
    size_t kept = job.pages.size();
    for (uint32_t index : job.pages)
    {
        pages_[index].inFlight = false;
    }
    if (!job.error.empty())
    {
        failJob(job, kept, job.finish, job.error); // Waiting for the decode failed.
        return;
    }
    if (job.checked)
    {
        auto const* status
            = job.decodedOnIo ? job.decodeStatus.data() : reinterpret_cast<uint8_t const*>(job.checkStatus.data());
        size_t good = 0;
        for (size_t i = 0; i < kept; ++i)
        {
            uint8_t const st = status[i];
            if (st == kPageOk)
            {
                job.pages[good] = job.pages[i];
                job.dstSlots[good] = job.dstSlots[i];
                ++good;
                continue;
            }
            int const reason = st < kNumDropReasons ? int(st) : int(kPageDecodeFailed);
            dropUnread(job.key, job.pages[i], job.dstSlots[i], reason, job.owner->result_);
        }
        kept = good;
        if (!job.decodedOnIo)
        {
            statusFree_.push_back(std::move(job.checkStatus));
        }
    }
    if (kept > 0)
    {
        finishCommit(job, kept, job.finish);
    }
}

runtime::Allocation KvCacheManager::takeStatusBuffer(size_t bytes)
{
    for (auto it = statusFree_.begin(); it != statusFree_.end(); ++it)
    {
        if (it->size() >= bytes)
        {
            runtime::Allocation a = std::move(*it);
            statusFree_.erase(it);
            return a;
        }
    }
    return runtime::Allocation(*runtime_, runtime::MemoryKind::kMappedHost, std::max<size_t>(bytes, 256));
}

// Steps 4-5 for a job's kept pages, the observers' error handed to the job's own caller.
void KvCacheManager::finishCommit(Job& job, size_t kept, EventPtr const& finish)
{
    commitPages(job, kept, finish);
    if (observerError_)
    {
        // Raised by an observer of this commit: the job's own caller gets it, not the next one.
        if (!job.owner->observerError_)
        {
            job.owner->observerError_ = observerError_;
        }
        observerError_ = nullptr;
    }
    if (job.prefetch)
    {
        prefetch_.completed += kept;
        for (size_t i = 0; i < kept; ++i)
        {
            pages_[job.pages[i]].prefetched = true;
        }
    }
}

void KvCacheManager::waitJobs(PendingMigration const* pending)
{
    for (;;)
    {
        drainJobs();
        std::unique_lock<std::mutex> lock(jobsMu_);
        bool const left = pending != nullptr ? pending->commitLeft_ > 0 : !jobs_.empty();
        if (!left)
        {
            return;
        }
        jobsCv_.wait(lock, [&] { return ioDoneJobs_ > 0; });
    }
}

void KvCacheManager::waitAnyJob()
{
    {
        std::unique_lock<std::mutex> lock(jobsMu_);
        if (jobs_.empty())
        {
            return;
        }
        jobsCv_.wait(lock, [&] { return ioDoneJobs_ > 0; });
    }
    drainJobs();
}

void KvCacheManager::waitForPages(PageId const* ids, size_t count)
{
    if (!hasJobs())
    {
        return;
    }
    for (size_t i = 0; i < count; ++i)
    {
        if (pages_.isLive(ids[i]) && pages_[uint32_t(ids[i] & 0xffffffffu)].inFlight)
        {
            waitJobs(nullptr); // Ordered: every earlier staged transfer lands first.
            return;
        }
    }
}

void KvCacheManager::stopIoThread() noexcept
{
    {
        std::lock_guard<std::mutex> lock(jobsMu_);
        stopIo_ = true;
    }
    jobsCv_.notify_all();
    if (ioThread_.joinable())
    {
        ioThread_.join();
    }
}

void KvCacheManager::throwIfFailed(MigrationResult const& result, CacheLevel dst, size_t count)
{
    if (result.failed.empty() && result.error.empty())
    {
        return;
    }
    throw MigrationError("migration to the " + std::string(levelName(dst)) + " level failed after "
            + std::to_string(result.moved) + " of " + std::to_string(count) + " pages were committed; the other "
            + std::to_string(result.failed.size()) + " pages stay where they were and can be retried: " + result.error,
        result.moved);
}

void KvCacheManager::notePrefetchLeft(Page& p, bool used) noexcept
{
    if (!p.prefetched)
    {
        return;
    }
    p.prefetched = false;
    ++(used ? prefetch_.used : prefetch_.wasted);
    uint64_t const bytes = storage_->pageBytes(CacheLevel::kHost, storage_->poolGroup(CacheLevel::kHost, p.lifeCycle));
    prefetchBytes_ -= std::min(prefetchBytes_, bytes);
}

std::shared_ptr<PendingMigration> KvCacheManager::prefetch(PageId const* ids, size_t count, uint64_t maxBytes)
{
    CallGuard guard(*this, "prefetch");
    auto const pending = std::make_shared<PendingMigration>(*this, count);
    if (!storage_->hasLevel(CacheLevel::kHost) || !storage_->hasLevel(CacheLevel::kDisk))
    {
        throw std::invalid_argument("prefetch() warms the host level from the disk level; this manager has "
            + std::string(storage_->hasLevel(CacheLevel::kHost) ? "no disk level" : "no host level"));
    }
    drainJobs();
    std::vector<PageId> chosen;
    std::vector<uint64_t> taken(storage_->numPoolGroups(CacheLevel::kHost), 0);
    uint64_t budget = prefetchBytes_;
    uint32_t const epoch = pages_.nextEpoch();
    for (size_t i = 0; i < count; ++i)
    {
        uint32_t const index = pages_.resolve(ids[i], i);
        Page& p = pages_[index];
        if (p.mark == epoch || CacheLevel(p.level) != CacheLevel::kDisk || p.inFlight)
        {
            ++prefetch_.skipped; // A repeat, elsewhere already, or on its way.
            continue;
        }
        p.mark = epoch;
        PoolGroupIndex const g = storage_->poolGroup(CacheLevel::kHost, p.lifeCycle);
        uint64_t const bytes = storage_->pageBytes(CacheLevel::kHost, g);
        if ((maxBytes != 0 && budget + bytes > maxBytes)
            || taken[size_t(g)] >= storage_->slots(CacheLevel::kHost, g).freeSlots())
        {
            ++prefetch_.skipped; // Over the budget, or no free host slot (prefetch never evicts).
            continue;
        }
        budget += bytes;
        ++taken[size_t(g)];
        chosen.push_back(ids[i]);
    }
    if (!chosen.empty())
    {
        prefetching_ = true;
        try
        {
            MigrationResult r
                = migrateLocked(chosen.data(), chosen.size(), CacheLevel::kHost, stream_, CacheLevel::kDisk, pending);
            pending->result_.moved += r.moved;
        }
        catch (...)
        {
            prefetching_ = false;
            throw;
        }
        prefetching_ = false;
        prefetch_.issued += chosen.size();
    }
    return pending;
}

PrefetchStats KvCacheManager::prefetchStats() const
{
    CallGuard guard(*this, "prefetchStats");
    return prefetch_;
}

size_t KvCacheManager::inFlightTransfers() const
{
    CallGuard guard(*this, "inFlightTransfers");
    std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(jobsMu_));
    return jobs_.size();
}

} // namespace kvcodec::kvcm

// SPDX-License-Identifier: Apache-2.0
//
// The I/O workers of a region: each takes tasks from the queue (adjacent slots merged into one
// vectored I/O where the FileIo allows), does the pwrite or pread through a bounce buffer when
// O_DIRECT needs one, checksums, and hands written pages to the committer or completes reads.
#include "tiers/disk/disk_region.h"

#include <cstdio>
#include <cstring>

#include "kvcodec/crc32c.h"
#include "runtime/log.h"
#include "tiers/disk/disk_util.h"

namespace kvcodec::disk {

using namespace detail;

void DiskRegion::workerLoop()
{
    AlignedBuffer bounce(geo_.stride);
    // Merging needs vectored I/O and slots that fill their stride (no bounce padding).
    bool const merge = io_->vectored() && cfg_.slotBytes == geo_.stride;
    std::vector<Task> run;
    for (;;)
    {
        run.clear();
        {
            std::unique_lock<std::mutex> lock(taskMu_);
            taskCv_.wait(lock, [&] { return !tasks_.empty() || stopping_; });
            if (tasks_.empty())
                return;
            run.push_back(std::move(tasks_.front()));
            tasks_.pop_front();
            // Pages of one batch usually sit in adjacent slots: one larger I/O moves them with
            // far fewer requests than one per page (direct I/O pays per request).
            while (merge && run.size() < kMaxMergedSlots && !tasks_.empty() && mergeable(run.back(), tasks_.front()))
            {
                run.push_back(std::move(tasks_.front()));
                tasks_.pop_front();
            }
        }
        if (run.size() == 1)
            runTask(run.front(), bounce.p);
        else
            runMerged(run, bounce.p);
    }
}

void DiskRegion::workerLoopQueued(IoQueue& queue)
{
    AlignedBuffer bounce(geo_.stride);
    bool const merge = cfg_.slotBytes == geo_.stride;
    unsigned const depth = queue.depth();
    std::vector<std::vector<Task>> runs(depth);
    std::vector<Task> serial; // Bounce tasks: one at a time, after the batch.
    std::vector<IoRequest> requests(depth);
    std::vector<std::vector<iovec>> iovs(depth);
    std::vector<std::vector<uint32_t>> crcs(depth);
    for (;;)
    {
        size_t used = 0;
        serial.clear();
        {
            std::unique_lock<std::mutex> lock(taskMu_);
            taskCv_.wait(lock, [&] { return !tasks_.empty() || stopping_; });
            if (tasks_.empty())
                return;
            // Up to `depth` runs of adjacent slots (and the bounce tasks met on the way).
            while (used < depth && !tasks_.empty() && serial.size() < depth)
            {
                Task t = std::move(tasks_.front());
                tasks_.pop_front();
                if (!inPlace(t))
                {
                    serial.push_back(std::move(t));
                    continue;
                }
                std::vector<Task>& run = runs[used++];
                run.clear();
                run.push_back(std::move(t));
                while (
                    merge && run.size() < kMaxMergedSlots && !tasks_.empty() && mergeable(run.back(), tasks_.front()))
                {
                    run.push_back(std::move(tasks_.front()));
                    tasks_.pop_front();
                }
            }
        }
        for (size_t i = 0; i < used; ++i)
            requests[i] = prepareRun(runs[i], iovs[i], crcs[i]);
        if (used > 0)
        {
            queue.run(requests.data(), used);
            std::lock_guard<std::mutex> lock(mu_);
            ++st_.queuedSubmits;
            st_.queuedRequests += used;
        }
        for (size_t i = 0; i < used; ++i)
            finishRun(runs[i], requests[i].result, crcs[i], bounce.p);
        for (Task& t : serial)
            runTask(t, bounce.p);
    }
}

bool DiskRegion::inPlace(Task const& t) const
{
    // O_DIRECT needs aligned memory and whole blocks: a padded slot or an unaligned buffer goes
    // through a bounce buffer.
    void const* p = t.kind == Task::kWrite ? t.src : static_cast<void const*>(t.dst);
    return !direct_ || (reinterpret_cast<uintptr_t>(p) % kAlign == 0 && cfg_.slotBytes == geo_.stride);
}

bool DiskRegion::mergeable(Task const& last, Task const& next) const
{
    return next.kind == last.kind && next.slot == last.slot + 1
        && geo_.containerOf(next.slot) == geo_.containerOf(last.slot) && inPlace(next) && inPlace(last);
}

IoRequest DiskRegion::prepareRun(std::vector<Task>& run, std::vector<iovec>& iov, std::vector<uint32_t>& crcs)
{
    bool const write = run.front().kind == Task::kWrite;
    iov.resize(run.size());
    crcs.clear();
    for (size_t k = 0; k < run.size(); ++k)
    {
        void* base = write ? const_cast<void*>(run[k].src) : run[k].dst;
        iov[k] = {base, cfg_.slotBytes};
        if (write)
            crcs.push_back(crc32cFast(run[k].src, cfg_.slotBytes));
    }
    return IoRequest{containerFds_[geo_.containerOf(run.front().slot)], write, iov.data(), int(run.size()),
        geo_.offsetOf(run.front().slot), 0};
}

void DiskRegion::finishRun(std::vector<Task>& run, ssize_t result, std::vector<uint32_t> const& crcs, void* bounce)
{
    if (result != ssize_t(run.size() * cfg_.slotBytes))
    {
        // A failure or a short transfer: redo each page on its own, so each gets its own result.
        for (Task& t : run)
            runTask(t, bounce);
        return;
    }
    if (run.size() > 1)
    {
        std::lock_guard<std::mutex> lock(mu_);
        ++st_.mergedIos;
        st_.mergedSlots += run.size();
    }
    for (size_t k = 0; k < run.size(); ++k)
    {
        if (run[k].kind == Task::kWrite)
            finishWrite(run[k], crcs[k]);
        else
            finishRead(run[k], run[k].dst, 0, false);
    }
}

void DiskRegion::runMerged(std::vector<Task>& run, void* bounce)
{
    std::vector<iovec> iov;
    std::vector<uint32_t> crcs;
    IoRequest const r = prepareRun(run, iov, crcs);
    ssize_t const done
        = r.write ? io_->pwritev(r.fd, r.iov, r.iovCount, r.offset) : io_->preadv(r.fd, r.iov, r.iovCount, r.offset);
    finishRun(run, done, crcs, bounce);
}

void DiskRegion::runTask(Task& t, void* bounce)
{
    uint32_t const container = geo_.containerOf(t.slot);
    off_t const offset = geo_.offsetOf(t.slot);
    int const fd = containerFds_[container];
    // O_DIRECT needs aligned memory and whole blocks: go through the bounce buffer otherwise.
    size_t const ioBytes = direct_ ? geo_.stride : cfg_.slotBytes;

    if (t.kind == Task::kWrite)
    {
        uint32_t crc = crc32cFast(t.src, cfg_.slotBytes);
        void const* buf = t.src;
        if (direct_ && (reinterpret_cast<uintptr_t>(t.src) % kAlign != 0 || cfg_.slotBytes != geo_.stride))
        {
            std::memcpy(bounce, t.src, cfg_.slotBytes);
            std::memset(static_cast<char*>(bounce) + cfg_.slotBytes, 0, geo_.stride - cfg_.slotBytes);
            buf = bounce;
        }
        int rc = writeFully(*io_, fd, buf, ioBytes, offset);
        if (rc != 0)
        {
            std::string where = geo_.where(t.slot);
            std::lock_guard<std::mutex> lock(mu_);
            freeSlotLocked(t.slot);
            ++st_.putErrors;
            completeLocked(t.ticket, ioFailure(dir_, "writing " + where, rc));
            return;
        }
        finishWrite(t, crc);
        return;
    }

    void* buf = t.dst;
    bool const viaBounce
        = direct_ && (reinterpret_cast<uintptr_t>(t.dst) % kAlign != 0 || cfg_.slotBytes != geo_.stride);
    if (viaBounce)
        buf = bounce;
    int rc = readFully(*io_, fd, buf, ioBytes, offset);
    finishRead(t, buf, rc, viaBounce);
}

void DiskRegion::finishWrite(Task& t, uint32_t crc)
{
    enqueueCommit(CommitItem{true, t.ticket, std::move(t.key), t.slot, crc, t.tag, std::nullopt});
}

void DiskRegion::finishRead(Task& t, void const* buf, int rc, bool viaBounce)
{
    // Only failures name the place: no string work for a page read correctly.
    auto where = [&] { return geo_.where(t.slot); };
    Status status;
    bool mismatch = false;
    if (rc != 0)
        status = ioFailure(dir_, "reading " + where(), rc);
    else
    {
        uint32_t crc = crc32cFast(buf, cfg_.slotBytes);
        if (crc != t.crc)
        {
            mismatch = true;
            char text[160];
            std::snprintf(text, sizeof(text), " (recorded crc %08x, read %08x); served as a miss", t.crc, crc);
            status = {StatusCode::kChecksumMismatch,
                "disk region '" + dir_ + "': checksum mismatch for key " + toHex(t.key) + " in " + where() + text, 0};
            log::write(log::Level::kWarning, status.message); // on an I/O thread: the sink queues it
        }
        else
        {
            if (viaBounce)
                std::memcpy(t.dst, buf, cfg_.slotBytes);
            status = {StatusCode::kOk, "", t.tag};
        }
    }
    std::lock_guard<std::mutex> lock(mu_);
    --slots_[t.slot].pins;
    maybeReleaseLocked(t.slot);
    if (status.code == StatusCode::kOk)
    {
        ++st_.hits;
        st_.bytesRead += cfg_.slotBytes;
    }
    else if (mismatch)
    {
        ++st_.misses;
        ++st_.checksumFailures;
    }
    else
        ++st_.readErrors;
    completeLocked(t.ticket, std::move(status));
}

} // namespace kvcodec::disk

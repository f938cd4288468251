// SPDX-License-Identifier: Apache-2.0
//
// Resizing and defragmenting a region while it stays open: live pages moved below a slot limit
// (read, checked, written, synced, then journaled through the normal group commit), and the new
// container geometry recorded (snapshot, region.json, snapshot) with files preallocated or
// deleted.
#include "tiers/disk/disk_region.h"

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <stdexcept>
#include <unistd.h>

#include "kvcodec/crc32c.h"
#include "tiers/disk/disk_util.h"
#include "tiers/disk/region_file.h"

namespace kvcodec::disk {

using namespace detail;

int DiskRegion::writeRegionRecord()
{
    return writeRegionFileAt(*io_, dir_, regionRecord());
}

void DiskRegion::checkWritable(char const* what) const
{
    if (cfg_.readOnly)
        throw std::runtime_error("disk region " + quoted(dir_) + " is open read-only; " + what + " is refused");
}

void DiskRegion::beginExclusive()
{
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (closed_ || stopping_)
            throw std::runtime_error("disk region " + quoted(dir_) + " is closed");
        if (failed_)
            throw std::runtime_error(failReason_);
        if (exclusive_)
            throw std::runtime_error(
                "disk region " + quoted(dir_) + ": a resize or defragmentation is already running");
        exclusive_ = true;
    }
    flush(); // What was submitted before completes first (retirements included).
}

void DiskRegion::endExclusive() noexcept
{
    {
        std::lock_guard<std::mutex> lock(mu_);
        exclusive_ = false;
        setLimitLocked(geo_.slots);
    }
    exclusiveCv_.notify_all();
}

void DiskRegion::relocateBelow(
    uint32_t limit, ResizeProgress const& progress, bool dropOldest, uint32_t batchPages, ResizeReport& report)
{
    auto where = [&](uint32_t slot) { return geo_.where(slot); };
    std::vector<uint32_t> movers;
    std::vector<uint32_t> victims;
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (uint32_t s = limit; s < geo_.slots; ++s)
        {
            if (slots_[s].state == kLive)
                movers.push_back(s);
            else if (slots_[s].state != kFree)
                throw ResizeError(StatusCode::kIoError,
                    "disk region " + quoted(dir_) + ": " + where(s)
                        + " is held by a retirement that could not be recorded; reopen the region before resizing it");
        }
        setLimitLocked(limit);
        if (movers.size() > free_.count())
        {
            size_t const excess = movers.size() - free_.count();
            if (!dropOldest)
                throw ResizeError(StatusCode::kFull,
                    "disk region " + quoted(dir_) + ": " + std::to_string(movers.size())
                        + " live pages lie at or beyond slot " + std::to_string(limit) + " but only "
                        + std::to_string(free_.count()) + " slots below it are free; erase " + std::to_string(excess)
                        + " pages first (nothing was changed)");
            // The oldest pages of the cut part go; the others still move.
            std::sort(
                movers.begin(), movers.end(), [&](uint32_t a, uint32_t b) { return slots_[a].seq < slots_[b].seq; });
            victims.assign(movers.begin(), movers.begin() + std::ptrdiff_t(excess));
            movers.erase(movers.begin(), movers.begin() + std::ptrdiff_t(excess));
            std::sort(movers.begin(), movers.end());
        }
    }

    // Commits `items` through the normal group commit (data sync, then the journal) and waits.
    auto commit = [&](std::vector<CommitItem>& items) -> std::string {
        std::vector<Ticket> tickets;
        for (CommitItem& item : items)
        {
            tickets.push_back(item.ticket);
            enqueueCommit(std::move(item));
        }
        std::string error;
        for (Ticket t : tickets)
        {
            Status const st = wait(t);
            if (st.code != StatusCode::kOk && error.empty())
                error = statusName(st.code) + std::string(": ") + st.message;
        }
        return error;
    };

    if (!victims.empty())
    {
        std::vector<CommitItem> items;
        {
            std::lock_guard<std::mutex> lock(mu_);
            for (uint32_t s : victims)
            {
                std::string key = slotKeys_[s];
                index_.erase(key, slotKeys_);
                slots_[s].state = kRetiring;
                slots_[s].retireDurable = false;
                ++st_.erases;
                items.push_back(CommitItem{
                    false, newTicketLocked(), std::move(key), s, slots_[s].crc, slots_[s].tag, std::nullopt});
            }
        }
        std::string const error = commit(items);
        if (!error.empty())
            throw ResizeError(StatusCode::kIoError,
                "disk region " + quoted(dir_) + ": dropping the oldest pages to make room failed (" + error
                    + "); the region keeps its geometry");
        report.dropped += victims.size();
    }

    size_t const ioBytes = direct_ ? geo_.stride : cfg_.slotBytes;
    size_t const batch = size_t(std::max<uint64_t>(1, std::min<uint64_t>(batchPages, kMoveBatchBytes / geo_.stride)));
    AlignedBuffer buffer(size_t(geo_.stride) * std::min(batch, std::max<size_t>(movers.size(), 1)));
    uint64_t const total = movers.size();
    for (size_t pos = 0; pos < movers.size(); pos += batch)
    {
        size_t const n = std::min(batch, movers.size() - pos);
        struct Move
        {
            uint32_t from;
            uint32_t to;
            uint32_t crc;
            uint32_t tag;
            std::string key;
            bool bad;
        };
        std::vector<Move> mv(n);
        {
            std::lock_guard<std::mutex> lock(mu_);
            for (size_t i = 0; i < n; ++i)
            {
                uint32_t const from = movers[pos + i];
                int64_t const to = free_.take();
                if (to < 0)
                {
                    for (size_t j = 0; j < i; ++j)
                        freeSlotLocked(mv[j].to);
                    throw ResizeError(StatusCode::kIoError,
                        "disk region " + quoted(dir_) + ": no free slot below " + std::to_string(limit)
                            + " for a moved page (internal accounting error)");
                }
                slots_[size_t(to)].state = kReserved;
                mv[i] = {from, uint32_t(to), slots_[from].crc, slots_[from].tag, slotKeys_[from], false};
            }
        }
        // Read, check and write on this thread: the blobs go straight from slot to slot.
        std::string failure;
        for (size_t i = 0; i < n && failure.empty(); ++i)
        {
            char* buf = static_cast<char*>(buffer.p) + i * geo_.stride;
            Move& m = mv[i];
            int rc = readFully(*io_, containerFds_[geo_.containerOf(m.from)], buf, ioBytes, geo_.offsetOf(m.from));
            if (rc != 0)
            {
                failure = "reading " + where(m.from) + ": " + errnoText(-rc);
                break;
            }
            if (crc32cFast(buf, cfg_.slotBytes) != m.crc)
            {
                m.bad = true; // A damaged blob is never copied under its key: it is retired instead.
                continue;
            }
            rc = writeFully(*io_, containerFds_[geo_.containerOf(m.to)], buf, ioBytes, geo_.offsetOf(m.to));
            if (rc != 0)
                failure = "writing " + where(m.to) + ": " + errnoText(-rc);
        }
        if (!failure.empty())
        {
            std::lock_guard<std::mutex> lock(mu_);
            for (Move const& m : mv)
                freeSlotLocked(m.to);
            throw ResizeError(StatusCode::kIoError,
                "disk region " + quoted(dir_) + ": moving a page failed (" + failure + "); "
                    + std::to_string(report.moved)
                    + " pages moved before stay valid where they are and the region keeps its "
                    + std::to_string(geo_.containers) + " containers");
        }
        // One journal record per page: the moved key's record (same crc and tag) supersedes the
        // old slot once durable; a crash before that leaves the old slot the valid one.
        std::vector<CommitItem> items;
        uint64_t moved = 0;
        uint64_t bad = 0;
        {
            std::lock_guard<std::mutex> lock(mu_);
            for (Move& m : mv)
            {
                if (m.bad)
                {
                    freeSlotLocked(m.to);
                    index_.erase(m.key, slotKeys_);
                    slots_[m.from].state = kRetiring;
                    slots_[m.from].retireDurable = false;
                    ++st_.erases;
                    ++st_.checksumFailures;
                    events_.push_back("disk region " + quoted(dir_) + ": the page with key " + toHex(m.key) + " in "
                        + where(m.from) + " failed its checksum while being moved; it was retired");
                    items.push_back(
                        CommitItem{false, newTicketLocked(), std::move(m.key), m.from, m.crc, m.tag, std::nullopt});
                    ++bad;
                }
                else
                {
                    items.push_back(
                        CommitItem{true, newTicketLocked(), std::move(m.key), m.to, m.crc, m.tag, std::nullopt});
                    ++moved;
                }
            }
        }
        std::string const error = commit(items);
        if (!error.empty())
            throw ResizeError(StatusCode::kIoError,
                "disk region " + quoted(dir_) + ": recording moved pages failed (" + error + "); "
                    + "every page is valid at its old or its new slot and the region keeps its "
                    + std::to_string(geo_.containers) + " containers");
        report.moved += moved;
        report.checksumDrops += bad;
        if (progress)
            progress(pos + n, total);
    }
}

void DiskRegion::setGeometry(uint32_t containers)
{
    uint32_t const before = geo_.containers;
    uint64_t const fileBytes = geo_.containerBytes();
    std::string const cdir = path("containers");
    auto fileOf = [&](uint32_t c) { return containerFile(cdir, c); };
    auto dropAdded = [&]() {
        while (containerFds_.size() > before)
        {
            if (containerFds_.back() >= 0)
                io_->close(containerFds_.back());
            containerFds_.pop_back();
            ::unlink(fileOf(uint32_t(containerFds_.size())).c_str());
        }
        syncDirectory(dir_);
    };
    // Growth: every new file is preallocated and open before the new geometry is recorded.
    for (uint32_t c = before; c < containers; ++c)
    {
        std::string const file = fileOf(c);
        int fd = io_->open(file, O_RDWR | O_CREAT, 0644);
        int rc = fd < 0 ? fd : io_->fallocate(fd, 0, off_t(fileBytes));
        if (rc == -EOPNOTSUPP)
            rc = io_->ftruncate(fd, off_t(fileBytes));
        if (fd >= 0)
            io_->close(fd);
        int dfd = rc == 0 ? io_->open(file, O_RDWR | (direct_ ? O_DIRECT : 0), 0) : -1;
        if (rc == 0 && dfd < 0)
            rc = dfd;
        if (rc != 0)
        {
            if (fd >= 0)
                ::unlink(file.c_str());
            dropAdded();
            throw ResizeError(-rc == ENOSPC || -rc == EDQUOT ? StatusCode::kNoSpace : StatusCode::kIoError,
                "disk region " + quoted(dir_) + ": cannot preallocate container " + quoted(file) + " ("
                    + std::to_string(fileBytes) + " bytes): " + errnoText(-rc) + "; the region keeps its "
                    + std::to_string(before) + " containers");
        }
        containerFds_.push_back(dfd); // Reserved at open: never reallocates under the workers.
    }
    syncDirectory(dir_);

    auto apply = [&](uint32_t c) {
        std::lock_guard<std::mutex> lock(mu_);
        geo_.containers = c;
        geo_.slots = c * geo_.slotsPerContainer;
        slots_.resize(geo_.slots);
        slotKeys_.resize(geo_.slots);
        index_.reserve(geo_.slots);
        std::deque<std::pair<uint64_t, uint32_t>> kept;
        for (auto const& e : fifo_)
            if (e.second < geo_.slots)
                kept.push_back(e);
        fifo_.swap(kept);
        setLimitLocked(geo_.slots);
        st_.slotsTotal = geo_.slots;
    };
    apply(containers);
    // The snapshot carries the new identity first: until region.json names the new geometry a
    // restart rejects it and recovers from the backup and the previous journal generation.
    bool const snapped = writeSnapshotLocked();
    int const rc = snapped ? writeRegionRecord() : 0;
    if (!snapped || rc != 0)
    {
        apply(before);
        writeSnapshotLocked();
        dropAdded();
        throw ResizeError(StatusCode::kIoError,
            "disk region " + quoted(dir_) + ": recording the new geometry failed ("
                + (snapped ? std::string(kRegionFile) + ": " + errnoText(-rc)
                           : std::string("the snapshot could not be written"))
                + "); the region keeps its " + std::to_string(before) + " containers");
    }
    writeSnapshotLocked(); // The backup and the previous journal generation get the new identity too.
    if (containers < before)
    {
        for (uint32_t c = containers; c < before; ++c)
        {
            io_->close(containerFds_[c]);
            ::unlink(fileOf(c).c_str());
        }
        containerFds_.resize(containers);
        syncDirectory(dir_);
    }
}

ResizeReport DiskRegion::resize(
    uint32_t containers, ResizeProgress const& progress, bool dropOldest, uint32_t batchPages)
{
    checkWritable("resize");
    if (containers == 0 || containers > kMaxContainers)
        throw std::invalid_argument("containers is " + std::to_string(containers) + "; valid: 1.."
            + std::to_string(kMaxContainers) + " (max_bytes / container_bytes; a region keeps at least one container)");
    if (uint64_t(containers) * geo_.slotsPerContainer > 0x7FFFFFFFull)
        throw std::invalid_argument("containers is " + std::to_string(containers) + ": "
            + std::to_string(uint64_t(containers) * geo_.slotsPerContainer) + " slots; at most 2^31-1 are supported");
    if (batchPages == 0)
        throw std::invalid_argument("batch_pages is 0; it must be >= 1");
    ResizeReport report;
    report.containersBefore = geo_.containers;
    beginExclusive();
    try
    {
        if (containers < geo_.containers)
            relocateBelow(containers * geo_.slotsPerContainer, progress, dropOldest, batchPages, report);
        if (containers != geo_.containers)
        {
            std::lock_guard<std::mutex> cm(commitMu_);
            setGeometry(containers);
        }
    }
    catch (...)
    {
        endExclusive();
        throw;
    }
    endExclusive();
    report.containersAfter = geo_.containers;
    return report;
}

ResizeReport DiskRegion::defragment(ResizeProgress const& progress, uint32_t batchPages)
{
    checkWritable("defragment");
    if (batchPages == 0)
        throw std::invalid_argument("batch_pages is 0; it must be >= 1");
    ResizeReport report;
    report.containersBefore = report.containersAfter = geo_.containers;
    beginExclusive();
    try
    {
        uint32_t live;
        {
            std::lock_guard<std::mutex> lock(mu_);
            live = uint32_t(index_.size());
        }
        relocateBelow(live, progress, false, batchPages, report);
    }
    catch (...)
    {
        endExclusive();
        throw;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        free_.rewind(); // New pages fill the first free slots after the compacted prefix.
    }
    endExclusive();
    return report;
}

} // namespace kvcodec::disk

// SPDX-License-Identifier: Apache-2.0
//
// A region's lifecycle and its submitting side: validating the configuration and opening
// (region_recovery.cpp recovers), submitting writes, reads and erases, completing and collecting
// tickets, the slot bookkeeping they share, and closing. The I/O workers are in
// region_workers.cpp, the committer (group commit, snapshots) in region_commit.cpp, resize and
// defragmentation in region_resize.cpp.
#include "tiers/disk/disk_region.h"

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <unistd.h>

#include "tiers/disk/disk_util.h"
#include "tiers/disk/region_file.h"

namespace kvcodec::disk {

using namespace detail;

char const* statusName(StatusCode c) noexcept
{
    switch (c)
    {
    case StatusCode::kOk: return "ok";
    case StatusCode::kPending: return "pending";
    case StatusCode::kNotFound: return "not_found";
    case StatusCode::kChecksumMismatch: return "checksum_mismatch";
    case StatusCode::kFull: return "full";
    case StatusCode::kNoSpace: return "no_space";
    case StatusCode::kIoError: return "io_error";
    case StatusCode::kInvalidArgument: return "invalid_argument";
    case StatusCode::kClosed: return "closed";
    }
    return "unknown";
}

FlatJson DiskRegion::readRegionFile(std::string const& dir)
{
    checkRegionDir(dir);
    std::string const p = dir + "/" + kRegionFile;
    RegionFile f = loadRegionFile(p);
    if (f.kind == RegionFile::kMissing)
        throw std::runtime_error(
            quoted(dir) + " holds no disk region: cannot read " + kRegionFile + ": " + errnoText(ENOENT));
    if (f.kind == RegionFile::kDamaged)
        throw std::runtime_error(quoted(p) + " is damaged: " + f.why);
    return f.rec;
}

DiskRegion::DiskRegion(std::string dir, RegionConfig cfg)
    : dir_(std::move(dir))
    , cfg_(std::move(cfg))
{
    while (dir_.size() > 1 && dir_.back() == '/')
        dir_.pop_back();
    io_ = cfg_.fileIo ? cfg_.fileIo : posixFileIo();
}

std::unique_ptr<DiskRegion> DiskRegion::open(std::string const& dir, RegionConfig cfg)
{
    if (dir.empty())
        throw std::invalid_argument("disk region directory is empty; give the path of a directory");
    std::string readOnlyWarning;
    if (cfg.readOnly)
    {
        FlatJson rec = readOnlyRecord(dir, readOnlyWarning);
        auto num = [&](char const* k) -> uint64_t {
            auto it = rec.find(k);
            if (it == rec.end())
                throw std::runtime_error(quoted(dir + "/" + kRegionFile) + " lacks field " + quoted(k));
            return std::strtoull(it->second.c_str(), nullptr, 10);
        };
        cfg.name = rec["name"];
        cfg.slotBytes = num("slot_bytes");
        cfg.containerBytes = num("container_bytes");
        cfg.maxBytes = num("containers") * cfg.containerBytes;
        cfg.codec.name = rec["codec_name"];
        cfg.codec.formatVersion = uint32_t(num("codec_format_version"));
        cfg.codec.paramHash = rec["codec_param_hash"];
        cfg.codec.paramsJson = rec["codec_params"];
        cfg.layoutJson = rec["layout"];
    }
    if (cfg.slotBytes == 0)
        throw std::invalid_argument("slot_bytes is 0; it must be the cold pool group's page size (> 0)");
    uint64_t stride = roundUp(cfg.slotBytes, kAlign);
    if (cfg.containerBytes < stride)
        throw std::invalid_argument("container_bytes is " + std::to_string(cfg.containerBytes)
            + "; it must hold at least one slot of " + std::to_string(stride) + " bytes (slot_bytes "
            + std::to_string(cfg.slotBytes) + " padded to " + std::to_string(kAlign) + ")");
    if (cfg.maxBytes < cfg.containerBytes)
        throw std::invalid_argument("max_bytes is " + std::to_string(cfg.maxBytes) + "; it must be >= container_bytes ("
            + std::to_string(cfg.containerBytes) + ")");
    if (cfg.ioThreads == 0 || cfg.ioThreads > 256)
        throw std::invalid_argument("io_threads is " + std::to_string(cfg.ioThreads) + "; valid: 1..256");
    if (cfg.queueDepth == 0 || cfg.queueDepth > 4096)
        throw std::invalid_argument("queue_depth is " + std::to_string(cfg.queueDepth) + "; valid: 1..4096");
    if (cfg.maxBatchRecords == 0)
        throw std::invalid_argument("max_batch_records is 0; it must be >= 1");
    if (cfg.codec.name.empty())
        throw std::invalid_argument("codec name is empty; a region records the codec whose blobs it holds");
    uint64_t spc = cfg.containerBytes / stride;
    uint64_t containers = cfg.maxBytes / cfg.containerBytes;
    if (spc * containers > 0x7FFFFFFFull)
        throw std::invalid_argument("max_bytes " + std::to_string(cfg.maxBytes) + " gives "
            + std::to_string(spc * containers) + " slots; at most 2^31-1 are supported");
    if (containers > 9999)
        throw std::invalid_argument("max_bytes / container_bytes is " + std::to_string(containers)
            + "; at most 9999 container files: raise container_bytes");

    std::unique_ptr<DiskRegion> r(new DiskRegion(dir, std::move(cfg)));
    r->geo_.stride = stride;
    r->geo_.slotsPerContainer = uint32_t(spc);
    r->geo_.containers = uint32_t(containers);
    r->geo_.slots = uint32_t(spc * containers);
    if (!readOnlyWarning.empty())
        r->recovery_.warnings.push_back(readOnlyWarning);
    r->openFiles();
    r->recover();
    r->startThreads();
    if (r->openTarget_ != 0 && r->openTarget_ != r->geo_.containers)
    {
        uint32_t const from = r->geo_.containers;
        try
        {
            ResizeReport const rep = r->resize(r->openTarget_, {}, true);
            r->recovery_.warnings.push_back("disk region " + quoted(r->dir_) + " was recorded with "
                + std::to_string(from) + " containers; resized to the configured " + std::to_string(rep.containersAfter)
                + " (" + std::to_string(rep.moved) + " pages moved, " + std::to_string(rep.dropped)
                + " oldest dropped for lack of slots)");
            r->recovery_.droppedEntries += rep.dropped + rep.checksumDrops;
        }
        catch (std::exception const& e)
        {
            r->recovery_.warnings.push_back("disk region " + quoted(r->dir_) + " keeps its recorded "
                + std::to_string(r->geo_.containers) + " containers: resizing it to the configured "
                + std::to_string(r->openTarget_) + " failed: " + e.what());
        }
    }
    return r;
}

std::string DiskRegion::path(std::string const& leaf) const
{
    return dir_ + "/" + leaf;
}

std::string DiskRegion::identityLine() const
{
    // What must match for recorded blobs and slot numbers to mean the same thing.
    return identityOf(regionRecord());
}

FlatJson DiskRegion::regionRecord() const
{
    FlatJson r;
    r["format"] = "1";
    r["name"] = cfg_.name;
    r["slot_bytes"] = std::to_string(cfg_.slotBytes);
    r["slot_stride"] = std::to_string(geo_.stride);
    r["container_bytes"] = std::to_string(geo_.containerBytes());
    r["slots_per_container"] = std::to_string(geo_.slotsPerContainer);
    r["containers"] = std::to_string(geo_.containers);
    r["codec_name"] = cfg_.codec.name;
    r["codec_format_version"] = std::to_string(cfg_.codec.formatVersion);
    r["codec_param_hash"] = cfg_.codec.paramHash;
    r["codec_params"] = cfg_.codec.paramsJson;
    r["layout"] = cfg_.layoutJson;
    return r;
}

void DiskRegion::startThreads()
{
    // io_uring needs real file descriptors: a substituted FileIo (tests) keeps the thread pool.
    if (cfg_.ioBackend != IoBackend::kThreads)
    {
        std::string why;
        if (!io_->vectored())
            why = "the region's FileIo is not the POSIX one";
        for (uint32_t i = 0; why.empty() && i < cfg_.ioThreads; ++i)
        {
            auto q = makeUringQueue(cfg_.queueDepth, why);
            if (q)
                queues_.push_back(std::move(q));
        }
        if (!why.empty())
        {
            queues_.clear();
            if (cfg_.ioBackend == IoBackend::kUring)
                throw std::runtime_error("disk region '" + dir_ + "': io_backend is io_uring, but " + why
                    + "; valid where io_uring is refused: auto or threads");
            backendNote_ = why;
        }
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        st_.ioBackend = queues_.empty() ? "threads" : "io_uring";
        st_.backendNote = backendNote_;
    }
    for (uint32_t i = 0; i < cfg_.ioThreads; ++i)
    {
        if (queues_.empty())
            workers_.emplace_back([this] { workerLoop(); });
        else
            workers_.emplace_back([this, q = queues_[i].get()] { workerLoopQueued(*q); });
    }
    if (!cfg_.readOnly)
        committer_ = std::thread([this] { committerLoop(); });
}

Ticket DiskRegion::newTicketLocked()
{
    Ticket t = nextTicket_++;
    ++inflight_;
    return t;
}

void DiskRegion::completeLocked(Ticket t, Status s)
{
    done_[t] = std::move(s);
    --inflight_;
    doneCv_.notify_all();
}

void DiskRegion::enqueueTask(Task t)
{
    {
        std::lock_guard<std::mutex> lock(taskMu_);
        tasks_.push_back(std::move(t));
    }
    taskCv_.notify_one();
}

void DiskRegion::enqueueCommit(CommitItem item)
{
    {
        std::lock_guard<std::mutex> lock(commitQMu_);
        commitQ_.push_back(std::move(item));
    }
    commitCv_.notify_one();
}

void DiskRegion::freeSlotLocked(uint32_t slot)
{
    Slot& s = slots_[slot];
    s.state = kFree;
    s.retireDurable = false;
    slotKeys_[slot].clear();
    free_.give(slot);
}

void DiskRegion::maybeReleaseLocked(uint32_t slot)
{
    Slot& s = slots_[slot];
    if (s.state == kRetiring && s.retireDurable && s.pins == 0)
        freeSlotLocked(slot);
}

void DiskRegion::setLimitLocked(uint32_t limit)
{
    free_.rebuild(geo_.slots, limit, [this](uint32_t s) { return slots_[s].state == kFree; });
}

namespace {
void checkKey(std::string const& key)
{
    if (key.empty() || key.size() > kMaxKeyBytes)
        throw std::invalid_argument("key is " + std::to_string(key.size()) + " bytes; keys must be 1.."
            + std::to_string(kMaxKeyBytes) + " bytes");
}
} // namespace

std::unique_lock<std::mutex> DiskRegion::lockToSubmit(char const* readOnlyRefusal)
{
    std::unique_lock<std::mutex> lock(mu_);
    exclusiveCv_.wait(lock, [&] { return !exclusive_; }); // A resize or defragmentation runs.
    if (closed_ || stopping_)
        throw std::runtime_error("disk region " + quoted(dir_) + " is closed");
    if (readOnlyRefusal != nullptr && cfg_.readOnly)
        throw std::runtime_error("disk region " + quoted(dir_) + " is open read-only; " + readOnlyRefusal);
    return lock;
}

Ticket DiskRegion::submitWrite(std::string const& key, void const* src, size_t bytes, uint32_t tag)
{
    checkKey(key);
    if (src == nullptr)
        throw std::invalid_argument("src is null; pass a host buffer of slot_bytes bytes");
    if (bytes != cfg_.slotBytes)
        throw std::invalid_argument("page is " + std::to_string(bytes) + " bytes; disk region " + quoted(dir_)
            + " holds pages of exactly slot_bytes = " + std::to_string(cfg_.slotBytes) + " bytes"
            + (bytes > cfg_.slotBytes ? " (too large for its slots)" : ""));
    std::unique_lock<std::mutex> lock = lockToSubmit("writes are refused");
    Ticket t = newTicketLocked();
    if (failed_)
    {
        ++st_.putErrors;
        completeLocked(t, {StatusCode::kIoError, failReason_, 0});
        return t;
    }
    Task task{Task::kWrite, t, key, 0, tag, 0, src, nullptr};
    int64_t slot = free_.take();
    if (slot < 0 && cfg_.whenFull == FullPolicy::kEvictOldest)
    {
        // Retire the oldest published page that no read pins; its slot is reused only once the
        // retirement is durable, so a crash can never pair the victim's key with new data.
        size_t budget = fifo_.size();
        while (!fifo_.empty() && budget-- > 0)
        {
            auto [seq, s] = fifo_.front();
            fifo_.pop_front();
            Slot& v = slots_[s];
            if (v.state != kLive || v.seq != seq)
                continue;
            if (v.pins > 0)
            {
                fifo_.emplace_back(seq, s);
                continue;
            }
            std::string victim = slotKeys_[s];
            index_.erase(victim, slotKeys_);
            v.state = kRetiring;
            v.retireDurable = false;
            ++st_.evictions;
            task.slot = s;
            CommitItem item{false, 0, std::move(victim), s, v.crc, v.tag, std::move(task)};
            lock.unlock();
            enqueueCommit(std::move(item));
            return t;
        }
    }
    if (slot < 0)
    {
        ++st_.putsRefusedFull;
        completeLocked(t,
            {StatusCode::kFull,
                "disk region " + quoted(dir_) + " is full (" + std::to_string(geo_.slots - free_.count()) + " of "
                    + std::to_string(geo_.slots) + " slots in use, none evictable; policy "
                    + (cfg_.whenFull == FullPolicy::kRefuse ? "'refuse'" : "'evict'") + ")",
                0});
        return t;
    }
    slots_[slot].state = kReserved;
    task.slot = uint32_t(slot);
    lock.unlock();
    enqueueTask(std::move(task));
    return t;
}

Ticket DiskRegion::submitRead(std::string const& key, void* dst, size_t bytes)
{
    checkKey(key);
    if (dst == nullptr)
        throw std::invalid_argument("dst is null; pass a writable host buffer of slot_bytes bytes");
    if (bytes < cfg_.slotBytes)
        throw std::invalid_argument("destination is " + std::to_string(bytes) + " bytes; a page of disk region "
            + quoted(dir_) + " needs slot_bytes = " + std::to_string(cfg_.slotBytes) + " bytes");
    std::unique_lock<std::mutex> lock = lockToSubmit(nullptr);
    Ticket t = newTicketLocked();
    ++st_.reads;
    uint32_t const slot = index_.find(key, slotKeys_);
    if (slot == TagEntry::kNone)
    {
        ++st_.misses;
        completeLocked(t, {StatusCode::kNotFound, "", 0});
        return t;
    }
    Slot& s = slots_[slot];
    ++s.pins;
    Task task{Task::kRead, t, key, slot, s.tag, s.crc, nullptr, dst};
    lock.unlock();
    enqueueTask(std::move(task));
    return t;
}

Ticket DiskRegion::submitErase(std::string const& key)
{
    checkKey(key);
    std::unique_lock<std::mutex> lock = lockToSubmit("erase is refused");
    Ticket t = newTicketLocked();
    uint32_t const slot = index_.erase(key, slotKeys_);
    if (slot == TagEntry::kNone)
    {
        completeLocked(t, {StatusCode::kNotFound, "", 0});
        return t;
    }
    Slot& s = slots_[slot];
    s.state = kRetiring;
    s.retireDurable = false;
    ++st_.erases;
    CommitItem item{false, t, key, slot, s.crc, s.tag, std::nullopt};
    lock.unlock();
    enqueueCommit(std::move(item));
    return t;
}

std::optional<Status> DiskRegion::poll(Ticket t)
{
    std::lock_guard<std::mutex> lock(mu_);
    auto it = done_.find(t);
    if (it == done_.end())
    {
        if (t == 0 || t >= nextTicket_)
            throw std::invalid_argument("ticket " + std::to_string(t) + " was never issued by this region");
        return std::nullopt;
    }
    Status s = std::move(it->second);
    done_.erase(it);
    return s;
}

Status DiskRegion::wait(Ticket t, double timeoutSeconds)
{
    std::unique_lock<std::mutex> lock(mu_);
    if (t == 0 || t >= nextTicket_)
        throw std::invalid_argument("ticket " + std::to_string(t) + " was never issued by this region");
    auto ready = [&] { return done_.count(t) != 0 || inflight_ == 0; };
    if (timeoutSeconds < 0)
        doneCv_.wait(lock, ready);
    else if (!doneCv_.wait_for(lock, std::chrono::duration<double>(timeoutSeconds), ready))
        return {StatusCode::kPending, "", 0};
    auto it = done_.find(t);
    if (it == done_.end())
        throw std::invalid_argument("ticket " + std::to_string(t) + " was already collected");
    Status s = std::move(it->second);
    done_.erase(it);
    return s;
}

std::vector<std::string> DiskRegion::drainEvents()
{
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    out.swap(events_);
    return out;
}

void DiskRegion::flush()
{
    std::unique_lock<std::mutex> lock(mu_);
    doneCv_.wait(lock, [&] { return inflight_ == 0; });
}

bool DiskRegion::contains(std::string const& key) const
{
    std::lock_guard<std::mutex> lock(mu_);
    return index_.find(key, slotKeys_) != TagEntry::kNone;
}

std::optional<PageInfo> DiskRegion::lookup(std::string const& key) const
{
    std::lock_guard<std::mutex> lock(mu_);
    uint32_t const slot = index_.find(key, slotKeys_);
    if (slot == TagEntry::kNone)
        return std::nullopt;
    Slot const& s = slots_[slot];
    return PageInfo{key, geo_.containerOf(slot), slot % geo_.slotsPerContainer, s.tag, s.crc, s.seq};
}

std::vector<PageInfo> DiskRegion::pages() const
{
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<PageInfo> out;
    out.reserve(index_.size());
    for (auto const& [seq, slot] : fifo_)
    {
        Slot const& s = slots_[slot];
        if (s.state == kLive && s.seq == seq)
            out.push_back(
                {slotKeys_[slot], geo_.containerOf(slot), slot % geo_.slotsPerContainer, s.tag, s.crc, s.seq});
    }
    return out;
}

RegionStats DiskRegion::stats() const
{
    std::lock_guard<std::mutex> lock(mu_);
    RegionStats s = st_;
    s.slotsLive = index_.size();
    s.slotsFree = free_.count();
    s.lastSeq = lastSeq_;
    s.failed = failed_;
    return s;
}

void DiskRegion::close()
{
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (closed_ || stopping_)
            return;
    }
    flush();
    {
        std::lock_guard<std::mutex> l1(mu_);
        std::lock_guard<std::mutex> l2(taskMu_);
        std::lock_guard<std::mutex> l3(commitQMu_);
        stopping_ = true;
    }
    taskCv_.notify_all();
    commitCv_.notify_all();
    for (auto& w : workers_)
        w.join();
    workers_.clear();
    queues_.clear();
    if (committer_.joinable())
        committer_.join();
    if (!cfg_.readOnly && journalFd_ >= 0 && !failed_)
    {
        std::lock_guard<std::mutex> cm(commitMu_);
        writeSnapshotLocked();
    }
    for (int& fd : containerFds_)
        if (fd >= 0)
        {
            io_->close(fd);
            fd = -1;
        }
    if (journalFd_ >= 0)
    {
        io_->close(journalFd_);
        journalFd_ = -1;
    }
    if (lockFd_ >= 0)
    {
        ::close(lockFd_);
        lockFd_ = -1;
    }
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
}

DiskRegion::~DiskRegion()
{
    try
    {
        if (!workers_.empty() || committer_.joinable())
            close();
    }
    catch (...)
    {
    }
    for (int fd : containerFds_)
        if (fd >= 0)
            io_->close(fd);
    if (journalFd_ >= 0)
        io_->close(journalFd_);
    if (lockFd_ >= 0)
        ::close(lockFd_);
}

} // namespace kvcodec::disk

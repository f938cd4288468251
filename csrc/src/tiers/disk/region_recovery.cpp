// SPDX-License-Identifier: Apache-2.0
//
// Opening a region's files and recovering its index: region.json reconciled with the identity
// the journal and snapshot headers record (repaired when damaged), the containers preallocated
// and opened (direct I/O probed), then the newest intact snapshot loaded and the journal tail
// replayed (journal_replay.cpp), with what damage cost reported and a fresh snapshot written.
#include "tiers/disk/disk_region.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fcntl.h>
#include <stdexcept>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "tiers/disk/disk_util.h"
#include "tiers/disk/journal_replay.h"
#include "tiers/disk/region_file.h"

namespace kvcodec::disk {

using namespace detail;

void DiskRegion::repairRegionFile(
    std::string const& what, FlatJson const* damaged, std::vector<RecordedIdentity> const& recorded, bool hasState)
{
    std::string const region = "disk region " + quoted(dir_) + ": ";
    if (recorded.empty() && hasState)
        throw std::runtime_error(region + what + " and no journal or snapshot header records the region's identity to"
            + " repair it from; refusing to open rather than dropping its pages (restore " + kRegionFile
            + " from a copy, or remove the directory to start afresh)");
    std::string from;
    if (recorded.empty())
    {
        from = "no journal or snapshot exists, so no page was recorded: rewritten from this configuration";
    }
    else
    {
        std::vector<RecordedIdentity const*> const current = currentIdentities(recorded);
        std::string const mine = identityLine();
        RecordedIdentity const* match = nullptr;
        for (RecordedIdentity const* r : current)
            if (match == nullptr && r->identity == mine)
                match = r;
        if (match == nullptr && cfg_.resizeOnOpen)
        {
            // Only the container count differs: open as recorded, then resize to the configured count.
            for (RecordedIdentity const* r : current)
            {
                FlatJson f = r->fields;
                f["containers"] = std::to_string(geo_.containers);
                if (match == nullptr && identityOf(f) == mine)
                {
                    uint64_t const count = std::strtoull(r->fields.at("containers").c_str(), nullptr, 10);
                    openTarget_ = geo_.containers;
                    geo_.containers = uint32_t(count);
                    geo_.slots = uint32_t(count * geo_.slotsPerContainer);
                    match = r;
                }
            }
        }
        if (match == nullptr)
            throw std::runtime_error(region + what + " and " + current.front()->leaf
                + " records another identity than this configuration ("
                + fieldDiffs(current.front()->fields, regionRecord(), identityRegionKeys())
                + "): refusing to open rather than dropping its pages; open it with the configuration it was written"
                + " with (that repairs " + kRegionFile + "), or remove the directory to start afresh");
        std::string leaves;
        for (RecordedIdentity const& r : recorded)
            if (r.identity == match->identity)
                leaves += (leaves.empty() ? "" : ", ") + r.leaf;
        from = "repaired from the identity recorded in " + leaves + " (rewritten atomically)";
    }
    FlatJson const rec = regionRecord();
    std::string const restored = damaged == nullptr ? std::string() : fieldDiffs(*damaged, rec, regionFields());
    int const rc = writeRegionFileAt(*posixFileIo(), dir_, rec);
    if (rc != 0)
        throw std::runtime_error(region + what + "; repairing it failed: " + errnoText(-rc));
    recovery_.warnings.push_back(region + what + (restored.empty() ? "" : ": " + restored) + "; " + from);
}

void DiskRegion::openFiles()
{
    bool const ro = cfg_.readOnly;
    if (!ro)
    {
        mkdirs(dir_);
        lockFd_ = ::open(path("lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (lockFd_ < 0)
            throw std::runtime_error(
                "disk region " + quoted(dir_) + ": cannot create its lock file: " + errnoText(errno));
        if (::flock(lockFd_, LOCK_EX | LOCK_NB) != 0)
            throw std::runtime_error("disk region " + quoted(dir_) + " is already open for writing in another process");
    }

    std::string const regionPath = path(kRegionFile);
    bool fresh = false;
    if (!ro)
    {
        // A read-only open took its geometry from region.json (or the recorded identity) already.
        RegionFile file = loadRegionFile(regionPath);
        bool const hasState = hasStateFiles(dir_);
        std::vector<RecordedIdentity> const recorded
            = hasState ? recordedIdentities(dir_) : std::vector<RecordedIdentity>{};
        if (unconfirmedLegacy(file, recorded))
        {
            file.kind = RegionFile::kDamaged;
            file.why = "it has no checksum (written before region files carried one) and its identity agrees with no"
                       " journal or snapshot header";
        }
        bool const trusted = file.kind == RegionFile::kIntact || file.kind == RegionFile::kLegacy;
        if (trusted && cfg_.resizeOnOpen)
        {
            // Recorded with another container count only (a resize whose new quota the opener does
            // not know yet, or a new configured size): open it as recorded, resize after recovery.
            FlatJson const mine = regionRecord();
            bool same = true;
            for (char const* k : {"format", "codec_name", "codec_format_version", "codec_param_hash", "slot_bytes",
                     "slot_stride", "slots_per_container"})
                same = same && file.rec[k] == mine.at(k);
            uint64_t const recordedCount = std::strtoull(file.rec["containers"].c_str(), nullptr, 10);
            if (same && recordedCount != geo_.containers)
            {
                openTarget_ = geo_.containers;
                geo_.containers = uint32_t(recordedCount);
                geo_.slots = uint32_t(recordedCount * geo_.slotsPerContainer);
            }
        }
        if (!trusted && (file.kind == RegionFile::kDamaged || hasState))
        {
            repairRegionFile(file.kind == RegionFile::kMissing
                    ? std::string(kRegionFile) + " is missing"
                    : std::string(kRegionFile) + " is damaged (" + file.why + ")",
                file.rec.empty() ? nullptr : &file.rec, recorded, hasState);
        }
        else if (file.kind == RegionFile::kMissing)
        {
            fresh = true;
        }
        else
        {
            FlatJson const expected = regionRecord();
            std::string const diffs = fieldDiffs(file.rec, expected,
                {"format", "codec_name", "codec_format_version", "codec_param_hash", "slot_bytes", "slot_stride",
                    "slots_per_container", "containers"});
            if (!diffs.empty())
            {
                recovery_.warnings.push_back("disk region " + quoted(dir_)
                    + " was written with another codec or geometry (" + diffs
                    + "): its pages are invalidated and the region is reinitialized");
                recovery_.invalidated = true;
                fresh = true;
            }
            else if (file.kind == RegionFile::kLegacy || file.rec != expected)
            {
                // Same identity, new descriptive fields (e.g. a renamed region), or a file from before
                // region files carried a checksum: rewritten, the pages kept.
                int const rc = writeRegionFileAt(*posixFileIo(), dir_, expected);
                if (rc != 0)
                    recovery_.warnings.push_back(
                        "disk region " + quoted(dir_) + ": cannot rewrite " + kRegionFile + ": " + errnoText(-rc));
            }
        }
    }
    if (fresh)
    {
        recovery_.created = true;
        for (char const* leaf : {kJournal, kJournalOld, kSnapshot, kSnapshotBak, kSnapshotTmp})
            ::unlink(path(leaf).c_str());
        // Containers beyond the new geometry would only waste space.
        removeContainersFrom(path("containers"), geo_.containers);
        int const rc = writeRegionFileAt(*posixFileIo(), dir_, regionRecord());
        if (rc != 0)
            throw std::runtime_error(
                "disk region " + quoted(dir_) + ": cannot write " + kRegionFile + ": " + errnoText(-rc));
    }

    // Containers: preallocated so a full region never hits ENOSPC on a data write.
    std::string cdir = path("containers");
    if (!ro)
        mkdirs(cdir);
    uint64_t const fileBytes = geo_.containerBytes();
    // A region that never recorded a page (e.g. an earlier open failed while preallocating) has
    // nothing to lose in a short container: no warning then.
    bool const hasState = hasStateFiles(dir_);
    freshContainers_.assign(geo_.containers, false);
    std::vector<std::string> paths(geo_.containers);
    for (uint32_t c = 0; c < geo_.containers; ++c)
    {
        paths[c] = containerFile(cdir, c);
        struct stat st;
        bool present = ::stat(paths[c].c_str(), &st) == 0;
        uint64_t size = present ? uint64_t(st.st_size) : 0;
        if (size >= fileBytes)
            continue;
        if (!recovery_.created)
            freshContainers_[c] = true;
        if (!recovery_.created && hasState)
        {
            recovery_.warnings.push_back("disk region " + quoted(dir_) + ": container " + paths[c]
                + (present ? " is shorter than expected (" + std::to_string(size) + " of " + std::to_string(fileBytes)
                            + " bytes)"
                           : " is missing")
                + "; pages recorded in it are dropped");
        }
        if (ro)
            continue;
        int fd = io_->open(paths[c], O_RDWR | O_CREAT, 0644);
        if (fd < 0)
            throw std::runtime_error("disk region " + quoted(dir_) + ": cannot create container " + quoted(paths[c])
                + ": " + errnoText(-fd));
        int rc = io_->fallocate(fd, 0, off_t(fileBytes));
        if (rc == -EOPNOTSUPP)
        {
            // The file system cannot reserve blocks (e.g. some network file systems): size the file
            // and accept that a later write may fail with ENOSPC (it then surfaces as an error).
            rc = io_->ftruncate(fd, off_t(fileBytes));
            recovery_.warnings.push_back("disk region " + quoted(dir_)
                + ": the file system cannot preallocate; containers are sparse and a write may fail when it fills");
        }
        io_->close(fd);
        if (rc != 0)
        {
            struct statvfs vfs;
            std::string freeText;
            if (::statvfs(dir_.c_str(), &vfs) == 0)
                freeText = "; " + std::to_string(uint64_t(vfs.f_bavail) * vfs.f_frsize) + " bytes are free";
            throw std::runtime_error("disk region " + quoted(dir_) + ": cannot preallocate container "
                + quoted(paths[c]) + " (" + std::to_string(fileBytes) + " bytes): " + errnoText(-rc) + freeText
                + "; lower max_bytes or free space");
        }
    }
    if (!ro && !recovery_.created)
    {
        // Containers beyond the geometry: a resize that crashed before recording a growth, or
        // after recording a shrink but before deleting the cut files.
        removeContainersFrom(cdir, geo_.containers);
    }
    syncDirectory(dir_);

    // Direct I/O probe: open and read one aligned block with O_DIRECT; some file systems (tmpfs,
    // some FUSE and network file systems) refuse either.
    int const accessFlags = ro ? O_RDONLY : O_RDWR;
    direct_ = false;
    if (cfg_.ioMode != IoMode::kBuffered && !(ro && freshContainers_[0]))
    {
        int fd = io_->open(paths[0], accessFlags | O_DIRECT, 0);
        int err = fd < 0 ? -fd : 0;
        if (fd >= 0)
        {
            AlignedBuffer probe(kAlign);
            ssize_t n = io_->pread(fd, probe.p, kAlign, 0);
            if (n < 0)
                err = int(-n);
            io_->close(fd);
        }
        direct_ = err == 0;
        if (!direct_ && cfg_.ioMode == IoMode::kDirect)
            throw std::runtime_error("io_mode is 'direct' but the file system under " + quoted(dir_)
                + " refuses O_DIRECT: " + errnoText(err) + "; use io_mode 'auto' or 'buffered'");
    }
    containerFds_.reserve(10000); // Workers index it unlocked: a growth must never reallocate it.
    containerFds_.assign(geo_.containers, -1);
    for (uint32_t c = 0; c < geo_.containers; ++c)
    {
        if (ro && freshContainers_[c])
            continue;
        int fd = io_->open(paths[c], accessFlags | (direct_ ? O_DIRECT : 0), 0);
        if (fd < 0)
            throw std::runtime_error(
                "disk region " + quoted(dir_) + ": cannot open container " + quoted(paths[c]) + ": " + errnoText(-fd));
        containerFds_[c] = fd;
    }
}

void DiskRegion::applyPut(std::string key, uint32_t slot, uint32_t crc, uint32_t tag, uint64_t seq)
{
    Slot& s = slots_[slot];
    if (s.state == kLive && slotKeys_[slot] != key)
    {
        // Only damage (a lost retirement record) puts two keys in one slot: the later wins.
        index_.erase(slotKeys_[slot], slotKeys_);
        ++recovery_.droppedEntries;
    }
    // One lookup whether the key is new or moves (its old slot's key is read, then cleared).
    uint32_t const was = index_.put(key, slot, slotKeys_);
    if (was != TagEntry::kNone && was != slot)
    {
        slots_[was].state = kFree;
        slotKeys_[was].clear();
    }
    s.state = kLive;
    s.crc = crc;
    s.tag = tag;
    s.seq = seq;
    slotKeys_[slot] = std::move(key);
}

bool DiskRegion::dropIndexed(uint32_t slot)
{
    std::string const& key = slotKeys_[slot];
    if (key.empty() || index_.erase(key, slotKeys_, slot) == TagEntry::kNone)
        return false;
    slots_[slot].state = kFree;
    slotKeys_[slot].clear();
    return true;
}

void DiskRegion::applyRecord(JournalRecord&& r)
{
    if (r.put)
    {
        applyPut(std::move(r.key), r.slot, r.crc, r.tag, r.seq);
        return;
    }
    if (index_.erase(r.key, slotKeys_, r.slot) != TagEntry::kNone)
    {
        slots_[r.slot].state = kFree;
        slotKeys_[r.slot].clear();
    }
}

void DiskRegion::recover()
{
    auto t0 = std::chrono::steady_clock::now();
    bool const ro = cfg_.readOnly;
    std::string const identity = identityLine();
    slots_.assign(geo_.slots, Slot{});
    slotKeys_.assign(geo_.slots, std::string());
    index_.reset(geo_.slots);
    uint64_t snapSeq = 0;
    bool damaged = false;

    if (!recovery_.created)
    {
        // 1. The newest intact snapshot, applied entry by entry as it is parsed.
        bool anySnapshot = false;
        for (char const* leaf : {kSnapshot, kSnapshotBak})
        {
            FileText text;
            std::string why;
            int err = 0;
            if (!exists(path(leaf)))
                continue;
            anySnapshot = true;
            SnapshotView snap;
            if (!readWholeFile(path(leaf), text, err))
                why = errnoText(err);
            else if (checkSnapshot(text.view(), identity, snap, why))
            {
                uint64_t const droppedBefore = recovery_.droppedEntries;
                bool const ok = forEachSnapshotEntry(
                    snap, geo_.slotsPerContainer, geo_.slots,
                    [this](SnapshotEntryView const& e) { applyPut(std::string(e.key), e.slot, e.crc, e.tag, e.seq); },
                    why);
                if (ok)
                {
                    snapSeq = snap.seq;
                    recovery_.snapshotEntries = snap.count;
                    recovery_.snapshotUsed = leaf;
                    mainSnapshotGood_ = std::string(leaf) == kSnapshot;
                    break;
                }
                // A malformed entry behind a good checksum: undo what was applied before it.
                index_.clear();
                slots_.assign(geo_.slots, Slot{});
                slotKeys_.assign(geo_.slots, std::string());
                recovery_.droppedEntries = droppedBefore;
            }
            damaged = true;
            recovery_.warnings.push_back("disk region " + quoted(dir_) + ": snapshot " + leaf + " is damaged (" + why
                + ")" + (std::string(leaf) == kSnapshot ? "; falling back to the backup" : ""));
            snapSeq = 0;
        }
        if (anySnapshot && recovery_.snapshotUsed.empty())
            recovery_.warnings.push_back("disk region " + quoted(dir_)
                + ": no intact snapshot; recovering from the journal alone (pages recorded only in the "
                  "snapshots are lost and read as misses)");
        recovery_.snapshotSeq = snapSeq;

        // 2. The journal tail: the previous generation, then the current one, read as one stream
        //    of records numbered without gaps (see JournalReplay). Every key whose latest state a
        //    lost record could have changed is dropped (a miss) rather than served from older state.
        JournalReplay replay(dir_, identity, geo_.slotsPerContainer, geo_.slots, snapSeq, ro, recovery_,
            [this](JournalRecord&& r) { applyRecord(std::move(r)); });
        replay.run();
        damaged = damaged || replay.damaged();
        repairedJournal_ = repairedJournal_ || replay.repaired();
        journalSize_ = replay.journalSize();
        lastSeq_ = replay.lastSeq();
        uint64_t const dropBelow = replay.dropBelow();
        if (dropBelow != 0)
        {
            std::string const region = "disk region " + quoted(dir_) + ": ";
            uint64_t n = 0;
            for (uint32_t s = 0; s < geo_.slots; ++s)
            {
                if (slots_[s].seq < dropBelow && dropIndexed(s))
                    ++n;
            }
            recovery_.droppedEntries += n;
            repairedJournal_ = true;
            std::string lost;
            for (auto const& l : replay.losses())
                lost += (lost.empty() ? "" : "; ") + l;
            recovery_.warnings.push_back(region + "journal damage: " + lost + ". A lost record may have overwritten or "
                + "erased any key recorded before it: "
                + (n == 0 ? std::string("every such key was written again after it, so none is dropped")
                          : std::to_string(n)
                            + (n == 1 ? " key whose latest state cannot be established is"
                                      : " keys whose latest state cannot be established are")
                            + " dropped and read as misses (an older value is never served)"));
        }

        // 3. Pages in containers that were missing or short are gone.
        bool const anyFresh
            = std::find(freshContainers_.begin(), freshContainers_.end(), true) != freshContainers_.end();
        for (uint32_t s = 0; anyFresh && s < geo_.slots; ++s)
        {
            if (freshContainers_[geo_.containerOf(s)] && dropIndexed(s))
                ++recovery_.droppedEntries;
        }
    }

    // Free bitset and eviction order.
    setLimitLocked(geo_.slots);
    std::vector<std::pair<uint64_t, uint32_t>> order;
    order.reserve(index_.size());
    for (uint32_t s = 0; s < geo_.slots; ++s)
        if (slots_[s].state != kFree)
            order.emplace_back(slots_[s].seq, s);
    std::sort(order.begin(), order.end());
    fifo_.assign(order.begin(), order.end());

    // The current journal: (re)created with its header when missing or damaged.
    if (!ro)
    {
        std::string const header = journalHeader(identity) + "\n";
        bool rewrite = journalSize_ == 0;
        journalFd_ = io_->open(path(kJournal), O_RDWR | O_CREAT, 0644);
        if (journalFd_ < 0)
            throw std::runtime_error(
                "disk region " + quoted(dir_) + ": cannot open the journal: " + errnoText(-journalFd_));
        if (rewrite)
        {
            int rc = io_->ftruncate(journalFd_, 0);
            if (rc == 0)
                rc = writeFully(*io_, journalFd_, header.data(), header.size(), 0);
            if (rc == 0)
                rc = io_->fdatasync(journalFd_);
            if (rc != 0)
                throw std::runtime_error(
                    "disk region " + quoted(dir_) + ": cannot write the journal header: " + errnoText(-rc));
            journalSize_ = header.size();
            syncDirectory(dir_);
        }
    }
    recordsSinceSnapshot_ = recovery_.journalRecordsReplayed;
    st_.slotsTotal = geo_.slots;
    st_.directIo = direct_;
    st_.journalBytes = journalSize_;
    recovery_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // Restore redundancy at once after damage, so a second failure cannot compound the first.
    // Repaired records and keys dropped for journal damage must be recorded before anything is
    // appended after the damage (which would hide it from the next open): without that snapshot
    // the region refuses writes until it is reopened.
    if (!ro && damaged)
    {
        std::lock_guard<std::mutex> cm(commitMu_);
        if (!writeSnapshotLocked() && repairedJournal_)
            failRegion(
                "the snapshot recording what recovery repaired or dropped for journal damage could not be written");
    }
}

} // namespace kvcodec::disk

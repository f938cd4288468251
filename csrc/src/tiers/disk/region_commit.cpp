// SPDX-License-Identifier: Apache-2.0
//
// The committer of a region: group commit (one data fdatasync per container a batch touched,
// then one journal append and fdatasync for the batch, then publication in the index) and the
// periodic snapshot with its journal rotation.
#include "tiers/disk/disk_region.h"

#include <cstdio>
#include <fcntl.h>
#include <set>
#include <stdexcept>
#include <unistd.h>

#include "tiers/disk/disk_util.h"
#include "tiers/disk/region_file.h"

namespace kvcodec::disk {

using namespace detail;

void DiskRegion::committerLoop()
{
    for (;;)
    {
        std::vector<CommitItem> batch;
        {
            std::unique_lock<std::mutex> lock(commitQMu_);
            commitCv_.wait(lock, [&] { return !commitQ_.empty() || stopping_; });
            if (commitQ_.empty())
                return;
            if (commitQ_.size() <= cfg_.maxBatchRecords)
                batch.swap(commitQ_);
            else
            {
                batch.assign(std::make_move_iterator(commitQ_.begin()),
                    std::make_move_iterator(commitQ_.begin() + cfg_.maxBatchRecords));
                commitQ_.erase(commitQ_.begin(), commitQ_.begin() + cfg_.maxBatchRecords);
            }
        }
        std::lock_guard<std::mutex> cm(commitMu_);
        commitBatch(batch);
        if (cfg_.snapshotEveryRecords != 0 && recordsSinceSnapshot_ >= cfg_.snapshotEveryRecords)
            writeSnapshotLocked();
    }
}

void DiskRegion::failRegion(std::string const& why)
{
    failed_ = true;
    failReason_ = "disk region " + quoted(dir_) + " refuses writes until it is reopened: " + why;
    events_.push_back(failReason_);
}

void DiskRegion::commitBatch(std::vector<CommitItem>& batch)
{
    // 1. Data durability: one fdatasync per container touched by the batch.
    std::set<uint32_t> touched;
    for (auto const& item : batch)
        if (item.put)
            touched.insert(geo_.containerOf(item.slot));
    std::vector<int> syncErr(geo_.containers, 0);
    for (uint32_t c : touched)
        syncErr[c] = io_->fdatasync(containerFds_[c]);

    std::vector<CommitItem*> ok;
    ok.reserve(batch.size());
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& item : batch)
        {
            int err = item.put ? syncErr[geo_.containerOf(item.slot)] : 0;
            if (err != 0)
            {
                freeSlotLocked(item.slot);
                ++st_.putErrors;
                completeLocked(item.ticket,
                    ioFailure(dir_, "syncing container " + std::to_string(geo_.containerOf(item.slot)), err));
            }
            else if (failed_)
            {
                if (item.put)
                {
                    freeSlotLocked(item.slot);
                    ++st_.putErrors;
                }
                Status s{StatusCode::kIoError, failReason_, 0};
                if (item.ticket != 0)
                    completeLocked(item.ticket, s);
                if (item.then)
                    completeLocked(item.then->ticket, s);
            }
            else
                ok.push_back(&item);
        }
    }
    if (ok.empty())
        return;

    // 2. One journal append and one fdatasync for the whole batch.
    uint64_t seq = lastSeq_;
    std::string text;
    text.reserve(ok.size() * 150);
    for (CommitItem* item : ok)
    {
        JournalRecord r;
        r.seq = ++seq;
        r.put = item->put;
        r.key = item->key;
        r.slot = item->slot;
        r.crc = item->crc;
        r.tag = item->tag;
        text += formatRecord(r, geo_.slotsPerContainer);
    }
    int rc = writeFully(*io_, journalFd_, text.data(), text.size(), off_t(journalSize_));
    char const* stage = "appending to the journal";
    if (rc == 0)
    {
        rc = io_->fdatasync(journalFd_);
        stage = "syncing the journal";
    }

    std::lock_guard<std::mutex> lock(mu_);
    if (rc != 0)
    {
        // Nothing of this batch is acknowledged: cut the journal back to its last durable record
        // so no partial line survives, and roll every item back.
        int cut = io_->ftruncate(journalFd_, off_t(journalSize_));
        if (cut == 0)
            cut = io_->fdatasync(journalFd_);
        if (cut != 0)
            failRegion("the journal could not be cut back after a failed append (" + errnoText(-cut) + ")");
        Status s = ioFailure(dir_, stage, rc);
        for (CommitItem* item : ok)
        {
            if (item->put)
            {
                freeSlotLocked(item->slot);
                ++st_.putErrors;
                completeLocked(item->ticket, s);
                continue;
            }
            // A failed retirement: the page is still recorded live, so serve it again.
            Slot& v = slots_[item->slot];
            if (index_.find(item->key, slotKeys_) == TagEntry::kNone && v.pins == 0)
            {
                index_.insert(item->key, item->slot); // slotKeys_[item->slot] still holds the key
                v.state = kLive;
                fifo_.emplace_front(v.seq, item->slot);
            }
            else
            {
                v.retireDurable = false; // superseded meanwhile; keep the slot out of use until restart
            }
            if (item->ticket != 0)
                completeLocked(item->ticket, s);
            if (item->then)
            {
                ++st_.putErrors;
                completeLocked(item->then->ticket, s);
            }
        }
        return;
    }

    journalSize_ += text.size();
    lastSeq_ = seq;
    st_.journalRecords += ok.size();
    st_.journalBatches += 1;
    st_.journalBytes = journalSize_;
    recordsSinceSnapshot_ += ok.size();
    seq -= ok.size();
    for (CommitItem* item : ok)
    {
        ++seq;
        Slot& s = slots_[item->slot];
        if (item->put)
        {
            uint32_t const was = index_.put(item->key, item->slot, slotKeys_);
            if (was != TagEntry::kNone)
            {
                // The new record supersedes the old page durably.
                Slot& old = slots_[was];
                old.state = kRetiring;
                old.retireDurable = true;
                maybeReleaseLocked(was);
            }
            s.state = kLive;
            s.crc = item->crc;
            s.tag = item->tag;
            s.seq = seq;
            slotKeys_[item->slot] = item->key;
            fifo_.emplace_back(seq, item->slot);
            ++st_.puts;
            st_.bytesWritten += cfg_.slotBytes;
            completeLocked(item->ticket, {StatusCode::kOk, "", item->tag});
            continue;
        }
        s.retireDurable = true;
        if (item->ticket != 0)
            completeLocked(item->ticket, {StatusCode::kOk, "", 0});
        if (item->then)
        {
            // The evicted slot goes straight to the waiting write.
            s.state = kReserved;
            s.retireDurable = false;
            slotKeys_[item->slot].clear();
            enqueueTask(std::move(*item->then));
        }
        else
            maybeReleaseLocked(item->slot);
    }
}

bool DiskRegion::writeSnapshotLocked()
{
    std::vector<SnapshotEntry> entries;
    uint64_t seq;
    {
        std::lock_guard<std::mutex> lock(mu_);
        seq = lastSeq_;
        entries.reserve(index_.size());
        for (auto const& [sq, slot] : fifo_)
        {
            Slot const& s = slots_[slot];
            if (s.state == kLive && s.seq == sq)
                entries.push_back({slotKeys_[slot], slot, s.crc, s.tag, s.seq});
        }
        // Drop stale eviction-order pairs while we are here.
        std::deque<std::pair<uint64_t, uint32_t>> live;
        for (auto const& e : entries)
            live.emplace_back(e.seq, e.slot);
        fifo_.swap(live);
    }
    std::string text = formatSnapshot(identityLine(), seq, entries, geo_.slotsPerContainer);
    entries.clear();

    std::string const tmp = path(kSnapshotTmp);
    int rc = writeFileSynced(*io_, tmp, text);
    if (rc != 0)
    {
        // The journal still holds everything: a failed snapshot costs only replay time.
        ::unlink(tmp.c_str());
        std::lock_guard<std::mutex> lock(mu_);
        events_.push_back("disk region " + quoted(dir_) + ": snapshot failed: " + errnoText(-rc));
        return false;
    }
    // Keep the previous snapshot as the backup (it plus index.log.1 recovers everything).
    // A damaged snapshot is discarded instead, so it never replaces a good backup.
    std::string const main = path(kSnapshot);
    if (exists(main) && (!mainSnapshotGood_ || std::rename(main.c_str(), path(kSnapshotBak).c_str()) != 0))
        ::unlink(main.c_str());
    std::rename(tmp.c_str(), main.c_str());
    syncDirectory(dir_);
    mainSnapshotGood_ = true;

    // Rotate the journal: index.log becomes index.log.1, which covers the backup's gap.
    std::string const header = journalHeader(identityLine()) + "\n";
    std::string const jtmp = path("index.log.tmp");
    int nfd = io_->open(jtmp, O_RDWR | O_CREAT | O_TRUNC, 0644);
    rc = nfd < 0 ? nfd : writeFully(*io_, nfd, header.data(), header.size(), 0);
    if (rc == 0)
        rc = io_->fdatasync(nfd);
    if (rc != 0)
    {
        if (nfd >= 0)
            io_->close(nfd);
        ::unlink(jtmp.c_str());
        std::lock_guard<std::mutex> lock(mu_);
        events_.push_back("disk region " + quoted(dir_) + ": journal rotation failed: " + errnoText(-rc));
        return false;
    }
    std::rename(path(kJournal).c_str(), path(kJournalOld).c_str());
    std::rename(jtmp.c_str(), path(kJournal).c_str());
    syncDirectory(dir_);
    io_->close(journalFd_);
    journalFd_ = nfd;
    journalSize_ = header.size();
    recordsSinceSnapshot_ = 0;
    std::lock_guard<std::mutex> lock(mu_);
    st_.snapshots += 1;
    st_.journalBytes = journalSize_;
    return true;
}

void DiskRegion::snapshot()
{
    if (cfg_.readOnly)
        throw std::runtime_error("disk region " + quoted(dir_) + " is open read-only; no snapshot");
    std::lock_guard<std::mutex> cm(commitMu_);
    if (closed_)
        throw std::runtime_error("disk region " + quoted(dir_) + " is closed");
    writeSnapshotLocked();
}

} // namespace kvcodec::disk

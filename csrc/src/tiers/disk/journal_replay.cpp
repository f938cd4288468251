// SPDX-License-Identifier: Apache-2.0
#include "tiers/disk/journal_replay.h"

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <stdexcept>
#include <unistd.h>

#include "tiers/disk/region_file.h"

namespace kvcodec::disk::detail {

JournalReplay::JournalReplay(std::string const& dir, std::string const& identity, uint32_t slotsPerContainer,
    uint32_t numSlots, uint64_t snapshotSeq, bool readOnly, RecoveryReport& report, Apply apply)
    : dir_(dir)
    , region_("disk region " + quoted(dir) + ": ")
    , header_(journalHeader(identity))
    , slotsPerContainer_(slotsPerContainer)
    , numSlots_(numSlots)
    , readOnly_(readOnly)
    , report_(report)
    , apply_(std::move(apply))
    , lastSeq_(snapshotSeq)
    , expected_(snapshotSeq + 1)
{
}

std::string JournalReplay::path(char const* leaf) const
{
    return dir_ + "/" + leaf;
}

std::string JournalReplay::describe(Damaged const& d) const
{
    return std::string(d.current ? kJournal : kJournalOld) + " line at byte " + std::to_string(d.pos) + ": " + d.why;
}

void JournalReplay::apply(JournalRecord&& r)
{
    expected_ = r.seq + 1;
    lastSeq_ = r.seq;
    apply_(std::move(r));
    ++report_.journalRecordsReplayed;
}

void JournalReplay::run()
{
    for (int gen = 0; gen < 2; ++gen)
        replayFile(gen);
    settle(0);
    if (tornAt_ != SIZE_MAX)
    {
        uint64_t const dropped = currentSize_ - tornAt_;
        report_.truncatedTailBytes += dropped;
        report_.warnings.push_back(region_ + "journal " + kJournal + " ends with a truncated or torn record ("
            + std::to_string(dropped) + " bytes at byte " + std::to_string(tornAt_)
            + "): an append a crash cut short, never acknowledged; dropped");
        if (!readOnly_)
        {
            int fd = ::open(path(kJournal).c_str(), O_WRONLY | O_CLOEXEC);
            if (fd < 0 || ::ftruncate(fd, off_t(tornAt_)) != 0 || ::fdatasync(fd) != 0)
                throw std::runtime_error(
                    region_ + "cannot truncate the torn tail of " + kJournal + ": " + errnoText(errno));
            ::close(fd);
        }
        journalSize_ = tornAt_;
    }
}

void JournalReplay::settle(uint64_t next)
{
    if (pending_.empty() && (next == 0 || next <= expected_))
        return;
    if (pending_.empty() && report_.journalRecordsReplayed == 0 && report_.snapshotUsed.empty())
        return; // The journal alone after losing the snapshots: the records before were theirs.
    bool const covered = next != 0 ? next <= expected_
                                   : report_.snapshotUsed == kSnapshot
            && std::none_of(pending_.begin(), pending_.end(), [](Damaged const& d) { return d.current; });
    if (covered)
    {
        // The main snapshot covers all of index.log.1, and a record numbered as expected
        // follows anything else: the damaged bytes held nothing the index needs.
        for (Damaged const& d : pending_)
            report_.warnings.push_back(region_ + "journal " + describe(d) + "; the damaged line held no record "
                + "the index needs (the snapshot covers it, or the numbering continues without a gap): skipped");
        pending_.clear();
        return;
    }
    if (!pending_.empty())
    {
        // One flipped bit per damaged line: its line checksum finds and corrects it.
        std::vector<JournalRecord> fixed, recs;
        uint64_t seq = expected_;
        bool ok = true;
        for (Damaged const& d : pending_)
        {
            ok = ok && repairBudget_ > 0 && repairRecords(d.text, slotsPerContainer_, numSlots_, seq, recs);
            repairBudget_ -= repairBudget_ > 0 ? 1 : 0;
            if (!ok)
                break;
            seq += recs.size();
            for (JournalRecord& r : recs)
                fixed.push_back(std::move(r));
        }
        if (ok && (next == 0 || seq == next))
        {
            for (Damaged const& d : pending_)
                report_.warnings.push_back(region_ + "journal " + describe(d) + "; the damage was one flipped bit,"
                    + " corrected with the line checksum: the record is replayed");
            for (JournalRecord& r : fixed)
                apply(std::move(r));
            pending_.clear();
            repaired_ = true;
            return;
        }
    }
    std::string damage;
    if (next == 0)
    {
        // The end of the stream. An append a crash cut short ends index.log with an
        // incomplete line (a prefix of what was written, or zeros where its blocks never
        // reached the disk): it was never acknowledged. A complete line that fails its
        // checksum is damage to a record that may have been acknowledged.
        if (pending_.back().current && pending_.back().text.back() != '\n')
        {
            tornAt_ = pending_.back().pos;
            pending_.pop_back();
        }
        if (pending_.empty())
            return;
        for (Damaged const& d : pending_)
            damage += (damage.empty() ? "" : ", ") + describe(d);
        losses_.push_back(
            "the records after seq " + std::to_string(expected_ - 1) + " are damaged beyond repair (" + damage + ")");
        dropBelow_ = UINT64_MAX;
    }
    else
    {
        for (Damaged const& d : pending_)
            damage += (damage.empty() ? "" : ", ") + describe(d);
        std::string const range = next - 1 > expected_
            ? "records seq " + std::to_string(expected_) + ".." + std::to_string(next - 1) + " are"
            : "record seq " + std::to_string(expected_) + " is";
        losses_.push_back(pending_.empty() ? range + " missing" : range + " damaged beyond repair (" + damage + ")");
        dropBelow_ = std::max(dropBelow_, next);
    }
    pending_.clear();
}

void JournalReplay::replayFile(int gen)
{
    char const* leaf = gen == 0 ? kJournalOld : kJournal;
    bool const current = gen == 1;
    int err = 0;
    if (!exists(path(leaf)))
        return;
    if (!current && generationCovered(path(leaf)))
        return;
    FileText& file = texts_[gen];
    if (!readWholeFile(path(leaf), file, err))
    {
        report_.warnings.push_back(region_ + "cannot read journal " + leaf + ": " + errnoText(err));
        return;
    }
    std::string_view const text = file.view();
    size_t nl = text.find('\n');
    if (nl == std::string::npos)
    {
        // No complete header line, hence no record: a header write a crash cut short.
        if (!text.empty())
        {
            damaged_ = true;
            report_.warnings.push_back(region_ + "journal " + leaf + " has no complete header line; ignored");
        }
        if (current)
            journalSize_ = 0; // rewritten below
        return;
    }
    if (text.compare(0, nl, header_) != 0)
    {
        // Damage, or a journal that a resize which did not finish headed with its new
        // container count (its records are then none, or covered by the snapshot). Either
        // way each record is checked by its own checksum and the region's slot range: a
        // header never decides which records count (ignoring them served older values).
        damaged_ = true;
        report_.warnings.push_back(region_ + "journal " + leaf
            + (wellFormedJournalHeader(text.substr(0, nl)) ? " has a header naming another region identity"
                                                           : " has a damaged header")
            + "; its records, each checked by its own checksum, are replayed");
    }
    size_t pos = nl + 1;
    if (!current && text.size() > pos + 1 && text.back() == '\n')
    {
        // Records are appended in sequence order: when the last one is already in the
        // snapshot, so is the whole generation (the common case after a rotation).
        size_t lastStart = text.rfind('\n', text.size() - 2) + 1;
        JournalRecord last;
        std::string why;
        if (lastStart > nl
            && parseRecord(
                text.substr(lastStart, text.size() - 1 - lastStart), slotsPerContainer_, numSlots_, last, why)
            && last.seq <= lastSeq_)
            return;
    }
    while (pos < text.size())
    {
        size_t const end = text.find('\n', pos);
        bool const complete = end != std::string::npos;
        size_t const stop = complete ? end + 1 : text.size();
        JournalRecord r;
        std::string why;
        if (complete && parseRecord(text.substr(pos, end - pos), slotsPerContainer_, numSlots_, r, why))
        {
            if (!pending_.empty() || r.seq > expected_)
                settle(r.seq);
            if (r.seq >= expected_)
                apply(std::move(r));
        }
        else
        {
            ++report_.journalCorruptLines;
            damaged_ = true;
            pending_.push_back({current, pos, text.substr(pos, stop - pos), complete ? why : "incomplete line"});
        }
        pos = stop;
    }
    if (current)
        currentSize_ = journalSize_ = text.size();
}

bool JournalReplay::generationCovered(std::string const& file) const
{
    // Records are appended in sequence order: when the last one is already in the snapshot, so
    // is the whole generation (the common case after a rotation). Only the first and last bytes
    // are read; anything unusual (a long last line, damage) goes to the full replay instead.
    constexpr size_t kEdge = 64 << 10;
    std::string head, tail;
    uint64_t size = 0;
    if (lastSeq_ == 0 || !readHeadTail(file, kEdge, head, tail, size))
        return false;
    size_t nl = head.find('\n');
    if (nl == std::string::npos || head.compare(0, nl, header_) != 0 || size <= nl + 2 || tail.back() != '\n')
        return false;
    size_t lastInTail = tail.rfind('\n', tail.size() - 2);
    if (lastInTail == std::string::npos)
        return false;
    uint64_t lastStart = size - tail.size() + lastInTail + 1;
    JournalRecord last;
    std::string why;
    return lastStart > nl
        && parseRecord(std::string_view(tail).substr(lastInTail + 1, tail.size() - 2 - lastInTail), slotsPerContainer_,
            numSlots_, last, why)
        && last.seq <= lastSeq_;
}

} // namespace kvcodec::disk::detail

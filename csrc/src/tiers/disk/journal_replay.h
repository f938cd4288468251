// SPDX-License-Identifier: Apache-2.0
//
// Internal to the disk tier: replaying the journal tail when a region opens. The previous
// generation (index.log.1), then the current one (index.log), are read as one stream of records
// numbered without gaps, after the snapshot recovery loaded. A damaged line is repaired when one
// bit flipped; otherwise the records it held are lost, and the caller drops every key whose
// latest state a lost record could have changed (a miss) rather than serve it from older state.
// An incomplete last line of index.log (an append a crash cut short, never acknowledged) is cut
// off.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tiers/disk/disk_region.h"
#include "tiers/disk/disk_util.h"
#include "tiers/disk/journal.h"

namespace kvcodec::disk::detail {

class JournalReplay
{
public:
    /// Applies one record to the index (in sequence order, each once).
    using Apply = std::function<void(JournalRecord&&)>;

    /// Replays the journals of `dir`, whose header must carry `identity`, after a snapshot that
    /// covers the records up to `snapshotSeq` (0: none). Warnings, counts and losses go to
    /// `report`. A read-only replay never modifies a file.
    JournalReplay(std::string const& dir, std::string const& identity, uint32_t slotsPerContainer, uint32_t numSlots,
        uint64_t snapshotSeq, bool readOnly, RecoveryReport& report, Apply apply);

    /// Reads both generations and applies every record the index needs; throws
    /// std::runtime_error when the torn tail of index.log cannot be cut off.
    void run();

    /// The sequence number of the last record applied (the snapshot's when none was).
    [[nodiscard]] uint64_t lastSeq() const noexcept
    {
        return lastSeq_;
    }
    /// The bytes of index.log that hold its header and intact records (0: rewrite it).
    [[nodiscard]] uint64_t journalSize() const noexcept
    {
        return journalSize_;
    }
    /// Some journal was damaged (a header or a line): recovery writes a snapshot at once.
    [[nodiscard]] bool damaged() const noexcept
    {
        return damaged_;
    }
    /// Damaged records were repaired (a flipped bit corrected): they must reach a snapshot.
    [[nodiscard]] bool repaired() const noexcept
    {
        return repaired_;
    }
    /// Live keys recorded before this sequence number may be stale (0: none).
    [[nodiscard]] uint64_t dropBelow() const noexcept
    {
        return dropBelow_;
    }
    /// What records were lost, one phrase each.
    [[nodiscard]] std::vector<std::string> const& losses() const noexcept
    {
        return losses_;
    }

private:
    struct Damaged
    {
        bool current;          ///< In index.log (else index.log.1).
        size_t pos;            ///< Byte offset in its file.
        std::string_view text; ///< The damaged bytes, with their newline when they have one.
        std::string why;
    };

    void replayFile(int gen);
    void apply(JournalRecord&& r);
    /// Called before the next intact record (`next` = its sequence number) and at the end (0).
    void settle(uint64_t next);
    std::string describe(Damaged const& d) const;
    /// Whether every record of a previous generation `file` is already in the snapshot.
    bool generationCovered(std::string const& file) const;
    std::string path(char const* leaf) const;

    std::string dir_;
    std::string region_; ///< "disk region '<dir>': ", the prefix of every warning.
    std::string header_; ///< The journal header this region writes.
    uint32_t slotsPerContainer_;
    uint32_t numSlots_;
    bool readOnly_;
    RecoveryReport& report_;
    Apply apply_;

    uint64_t lastSeq_;
    uint64_t expected_;            ///< The next record the index needs.
    FileText texts_[2];            ///< Alive while `pending_` refers to them.
    std::vector<Damaged> pending_; ///< Damaged lines since the last intact record.
    uint64_t dropBelow_ = 0;       ///< Live keys recorded before this sequence number are dropped.
    std::vector<std::string> losses_;
    size_t repairBudget_ = 64; ///< Lines tried bit by bit per open (bounds a garbage journal).
    size_t tornAt_ = SIZE_MAX; ///< index.log is cut back here: an append a crash cut short.
    size_t currentSize_ = 0;
    uint64_t journalSize_ = 0;
    bool damaged_ = false;
    bool repaired_ = false;
};

} // namespace kvcodec::disk::detail

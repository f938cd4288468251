// SPDX-License-Identifier: Apache-2.0
//
// Text formats of the disk tier: the journal (one JSON record per line, each with its own
// CRC-32C so a torn or corrupt line is recognized), the index snapshot (a JSON header line, one
// entry per line, a JSON trailer with the entry count and CRC) and the flat region.json.
// All are human-readable on purpose: `cat index.log` shows the operation history.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kvcodec::disk {

/// One journal record. A put makes `key` live in global slot `slot` (container = slot /
/// slotsPerContainer) with payload checksum `crc` and caller tag `tag`; it also retires whatever
/// the slot or the key held before. A del retires `key` if it still lives in `slot`.
struct JournalRecord
{
    uint64_t seq = 0;
    bool put = true;
    std::string key; ///< Raw key bytes (hex in the text).
    uint32_t slot = 0;
    uint32_t crc = 0;
    uint32_t tag = 0;
};

/// The record as one line, newline included.
std::string formatRecord(JournalRecord const& r, uint32_t slotsPerContainer);

/// Parses one line (without its newline). False with `why` set when the line is not a record this
/// code wrote intact (bad syntax, bad line checksum, slot out of range).
bool parseRecord(
    std::string_view line, uint32_t slotsPerContainer, uint32_t numSlots, JournalRecord& out, std::string& why);

/// Tries to repair damaged journal text (one or more lines, the final newline included when the
/// text had one) by flipping each of its bits in turn: true, with the records in `out`, when exactly
/// one single-bit change turns the text into whole lines that are all intact records numbered
/// `firstSeq`, `firstSeq` + 1, ... (a flipped newline merges two records into one line, which this
/// also repairs). The line checksums make the answer unambiguous for one flipped bit; any other
/// damage is refused. Text longer than kMaxRepairBytes is refused.
bool repairRecords(std::string_view text, uint32_t slotsPerContainer, uint32_t numSlots, uint64_t firstSeq,
    std::vector<JournalRecord>& out);
constexpr size_t kMaxRepairBytes = 2048;

std::string toHex(std::string_view bytes);
/// Eight lowercase hex digits.
std::string toHex32(uint32_t v);
/// False when `hex` has odd length or a non-hex digit.
bool fromHex(std::string_view hex, std::string& out);

/// One snapshot entry (in FIFO order, oldest first).
struct SnapshotEntry
{
    std::string key;
    uint32_t slot;
    uint32_t crc;
    uint32_t tag;
    uint64_t seq;
};

/// Serializes a snapshot covering every journal record with seq <= `seq`.
std::string formatSnapshot(std::string const& identityLine, uint64_t seq, std::vector<SnapshotEntry> const& entries,
    uint32_t slotsPerContainer);

/// Parses a snapshot. False with `why` on any damage (the caller then falls back to the backup).
/// `identityLine` must equal the recorded one.
bool parseSnapshot(std::string_view text, std::string const& identityLine, uint32_t slotsPerContainer,
    uint32_t numSlots, uint64_t& seq, std::vector<SnapshotEntry>& entries, std::string& why);

/// A snapshot whose header, trailer and body checksum were verified; the body is not parsed yet.
struct SnapshotView
{
    uint64_t seq = 0;
    uint64_t count = 0;
    std::string_view body; ///< The entry lines, each ending with a newline.
};

/// Checks the header (format, identity), the trailer (count) and the body CRC-32C. False with
/// `why` on any damage.
bool checkSnapshot(std::string_view text, std::string const& identityLine, SnapshotView& out, std::string& why);

/// One parsed entry; `key` points into the caller's key buffer and is valid until the next entry.
struct SnapshotEntryView
{
    std::string_view key;
    uint32_t slot = 0; ///< Global slot.
    uint32_t crc = 0;
    uint32_t tag = 0;
    uint64_t seq = 0;
};

/// Longest key a region accepts (bytes).
constexpr size_t kMaxKeyBytes = 255;

/// Parses one body line (without its newline) into `out`, decoding the key into `keyBuf`
/// (kMaxKeyBytes). Returns nullptr, or what is wrong with the line.
char const* parseSnapshotLine(
    std::string_view line, uint32_t slotsPerContainer, uint32_t numSlots, char* keyBuf, SnapshotEntryView& out);

/// Calls `f(SnapshotEntryView const&)` for every entry of a checked snapshot, in file order, as
/// it parses them (no intermediate copy of the index: recovery applies entries directly). False
/// with `why` on a malformed entry or a count that differs from the header's; entries already
/// passed to `f` are then the caller's to discard.
template <class F>
bool forEachSnapshotEntry(
    SnapshotView const& snap, uint32_t slotsPerContainer, uint32_t numSlots, F&& f, std::string& why)
{
    char keyBuf[kMaxKeyBytes];
    SnapshotEntryView e;
    std::string_view const body = snap.body;
    uint64_t n = 0;
    size_t pos = 0;
    while (pos < body.size())
    {
        size_t end = body.find('\n', pos);
        if (end == std::string_view::npos)
            end = body.size();
        if (char const* bad = parseSnapshotLine(body.substr(pos, end - pos), slotsPerContainer, numSlots, keyBuf, e))
        {
            why = "entry " + std::to_string(n) + " " + bad;
            return false;
        }
        f(static_cast<SnapshotEntryView const&>(e));
        ++n;
        pos = end + 1;
    }
    if (n != snap.count)
    {
        why = "holds " + std::to_string(n) + " entries, header says " + std::to_string(snap.count);
        return false;
    }
    return true;
}

/// A flat JSON object of string and integer values (region.json).
using FlatJson = std::map<std::string, std::string>;

/// Serializes with sorted keys; values listed in `numeric` are written unquoted.
std::string formatFlatJson(FlatJson const& obj, std::vector<std::string> const& numeric);
/// Parses a flat object of strings and integers. False with `why` on anything else.
bool parseFlatJson(std::string_view text, FlatJson& out, std::string& why);
/// JSON string literal (quoted, escaped).
std::string jsonQuote(std::string_view s);

} // namespace kvcodec::disk

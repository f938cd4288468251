// SPDX-License-Identifier: Apache-2.0
//
// Internal to the disk tier: region.json (geometry and codec identity, sealed with a CRC-32C)
// and the identity lines that journal and snapshot headers record. Opening a region reconciles
// the two: an intact region.json is trusted, a damaged or missing one is repaired from (or, for
// a read-only open, replaced by) the identity the headers record.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tiers/disk/file_io.h"
#include "tiers/disk/journal.h"

namespace kvcodec::disk {

/// The identity one journal or snapshot header records.
struct RecordedIdentity
{
    std::string leaf;
    std::string identity;
    FlatJson fields; ///< As region.json keys.
};

namespace detail {

/// Every field region.json holds (besides its checksum).
std::vector<std::string> const& regionFields();

/// The identity line (what journal and snapshot headers record) of region.json fields.
std::string identityOf(FlatJson const& rec);

/// The journal's header line (without its newline) for an identity line.
std::string journalHeader(std::string const& identity);

struct RegionFile
{
    enum Kind
    {
        kMissing,
        kIntact,  ///< Its checksum matches.
        kLegacy,  ///< Consistent, written before region files carried a checksum.
        kDamaged, ///< Unreadable, unparsable, failing its checksum or inconsistent.
    } kind = kMissing;
    FlatJson rec;    ///< The fields (without the checksum) whenever they parsed.
    std::string why; ///< What is damaged.
};

/// Reads and checks region.json at path `p`.
RegionFile loadRegionFile(std::string const& p);

/// A file from before region files carried a checksum whose identity no header confirms (while
/// some header records one): it is not to be trusted.
bool unconfirmedLegacy(RegionFile const& f, std::vector<RecordedIdentity> const& recorded);

/// The intact identities recorded by the journal and snapshot headers of `dir`, current
/// generation first (index.log, index.snapshot, index.log.1, index.snapshot.bak).
std::vector<RecordedIdentity> recordedIdentities(std::string const& dir);

/// The recorded identities of the newest generation present (index.log and index.snapshot;
/// the previous generation only when neither has one).
std::vector<RecordedIdentity const*> currentIdentities(std::vector<RecordedIdentity> const& all);

/// Whether `dir` holds a journal or a snapshot of either generation.
bool hasStateFiles(std::string const& dir);

/// "field 'a' -> 'b', ..." over `keys` where `from` and `to` differ.
std::string fieldDiffs(FlatJson const& from, FlatJson const& to, std::vector<std::string> const& keys);

/// The region.json keys of the identity fields.
std::vector<std::string> identityRegionKeys();

/// Writes region.json atomically: a temporary file, synced, renamed over it, directory synced.
/// Returns 0 or -errno.
int writeRegionFileAt(FileIo& io, std::string const& dir, FlatJson const& rec);

/// A journal header some region wrote intact (another identity, or another format version).
bool wellFormedJournalHeader(std::string_view line);

/// Throws std::runtime_error unless `dir` exists and is a directory.
void checkRegionDir(std::string const& dir);

/// The record a read-only open works from: region.json when it is intact (or an older file
/// without a checksum that a journal or snapshot header confirms), else the identity the journal
/// and snapshots record (with a warning, as nothing may be repaired).
FlatJson readOnlyRecord(std::string const& dir, std::string& warning);

} // namespace detail
} // namespace kvcodec::disk

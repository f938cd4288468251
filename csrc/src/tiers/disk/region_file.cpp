// SPDX-License-Identifier: Apache-2.0
#include "tiers/disk/region_file.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

#include "kvcodec/crc32c.h"
#include "tiers/disk/disk_util.h"

namespace kvcodec::disk::detail {
namespace {

std::vector<std::string> const& numericFields()
{
    static std::vector<std::string> const fields = {"format", "slot_bytes", "slot_stride", "container_bytes",
        "slots_per_container", "containers", "codec_format_version"};
    return fields;
}

// region.json: geometry and codec identity, sealed with the CRC-32C of its other fields (in the
// form formatFlatJson writes them), so damage is detected rather than guessed. Files written
// before the checksum existed have no such field; they are trusted once a journal or snapshot
// header confirms their identity.
constexpr char const* kRegionChecksum = "crc32c";

/// The fields that make up the identity line of journals and snapshots, as (identity key, region.json key).
std::vector<std::pair<char const*, char const*>> const& identityKeys()
{
    static std::vector<std::pair<char const*, char const*>> const keys = {{"codec", "codec_name"},
        {"format_version", "codec_format_version"}, {"param_hash", "codec_param_hash"}, {"slot_bytes", "slot_bytes"},
        {"slot_stride", "slot_stride"}, {"slots_per_container", "slots_per_container"}, {"containers", "containers"}};
    return keys;
}

bool canonicalNumber(std::string const& v)
{
    if (v.empty() || v.size() > 19 || (v.size() > 1 && v[0] == '0'))
        return false;
    for (char c : v)
        if (c < '0' || c > '9')
            return false;
    return true;
}

/// What is inconsistent in the geometry fields of `rec` (region.json keys), or "".
std::string checkGeometry(FlatJson const& rec)
{
    for (char const* k : {"slot_bytes", "slot_stride", "slots_per_container", "containers", "codec_format_version"})
    {
        auto it = rec.find(k);
        if (it == rec.end() || !canonicalNumber(it->second))
            return std::string(k) + " is not a number";
    }
    uint64_t const slot = std::strtoull(rec.at("slot_bytes").c_str(), nullptr, 10);
    uint64_t const stride = std::strtoull(rec.at("slot_stride").c_str(), nullptr, 10);
    uint64_t const spc = std::strtoull(rec.at("slots_per_container").c_str(), nullptr, 10);
    uint64_t const containers = std::strtoull(rec.at("containers").c_str(), nullptr, 10);
    if (slot == 0 || slot > (1ull << 40) || stride != roundUp(slot, kAlign))
        return "slot_stride " + rec.at("slot_stride") + " does not fit slot_bytes " + rec.at("slot_bytes");
    if (spc == 0 || spc > 0x7FFFFFFFull || containers == 0 || containers > kMaxContainers
        || spc * containers > 0x7FFFFFFFull)
        return "slots_per_container " + rec.at("slots_per_container") + " x containers " + rec.at("containers")
            + " is outside the supported range";
    if (std::strtoull(rec.at("codec_format_version").c_str(), nullptr, 10) > 0xFFFFFFFFull)
        return "codec_format_version is out of range";
    if (rec.count("codec_name") == 0 || rec.at("codec_name").empty())
        return "codec_name is empty";
    return "";
}

/// The region.json fields of a canonical identity line, or false when `identity` is not one.
bool identityFields(std::string const& identity, FlatJson& out)
{
    FlatJson id;
    std::string why;
    if (!parseFlatJson(identity, id, why) || id.size() != identityKeys().size())
        return false;
    out.clear();
    for (auto const& [ik, rk] : identityKeys())
    {
        auto it = id.find(ik);
        if (it == id.end())
            return false;
        out[rk] = it->second;
    }
    return identityOf(out) == identity && checkGeometry(out).empty();
}

/// What region.json should hold beyond the identity, checked on a parsed file; "" when consistent.
std::string checkRegionFields(FlatJson const& rec)
{
    for (auto const& [k, v] : rec)
        if (std::find(regionFields().begin(), regionFields().end(), k) == regionFields().end())
            return "unexpected field '" + printable(k) + "'";
    for (auto const& k : regionFields())
        if (rec.count(k) == 0)
            return "no field '" + k + "'";
    if (rec.at("format") != "1")
        return "format is '" + printable(rec.at("format")) + "', not 1";
    std::string bad = checkGeometry(rec);
    if (!bad.empty())
        return bad;
    if (!canonicalNumber(rec.at("container_bytes"))
        || static_cast<unsigned __int128>(std::strtoull(rec.at("container_bytes").c_str(), nullptr, 10))
            != static_cast<unsigned __int128>(std::strtoull(rec.at("slot_stride").c_str(), nullptr, 10))
                * std::strtoull(rec.at("slots_per_container").c_str(), nullptr, 10))
        return "container_bytes " + printable(rec.at("container_bytes")) + " is not slot_stride x slots_per_container";
    return "";
}

/// region.json's text: the fields, sealed with their checksum.
std::string regionFileText(FlatJson rec)
{
    rec.erase(kRegionChecksum);
    std::string const body = formatFlatJson(rec, numericFields());
    rec[kRegionChecksum] = toHex32(crc32cFast(body.data(), body.size()));
    return formatFlatJson(rec, numericFields());
}

std::string firstLine(std::string const& p)
{
    std::string head, tail;
    uint64_t size = 0;
    if (!readHeadTail(p, 64 << 10, head, tail, size))
        return "";
    size_t const nl = head.find('\n');
    return nl == std::string::npos ? std::string() : head.substr(0, nl);
}

} // namespace

std::vector<std::string> const& regionFields()
{
    static std::vector<std::string> const fields
        = {"format", "name", "slot_bytes", "slot_stride", "container_bytes", "slots_per_container", "containers",
            "codec_name", "codec_format_version", "codec_param_hash", "codec_params", "layout"};
    return fields;
}

std::string identityOf(FlatJson const& rec)
{
    auto get = [&](char const* k) -> std::string {
        auto it = rec.find(k);
        return it == rec.end() ? std::string() : it->second;
    };
    return "{\"codec\":" + jsonQuote(get("codec_name")) + ",\"format_version\":" + get("codec_format_version")
        + ",\"param_hash\":" + jsonQuote(get("codec_param_hash")) + ",\"slot_bytes\":" + get("slot_bytes")
        + ",\"slot_stride\":" + get("slot_stride") + ",\"slots_per_container\":" + get("slots_per_container")
        + ",\"containers\":" + get("containers") + "}";
}

RegionFile loadRegionFile(std::string const& p)
{
    RegionFile f;
    std::string text, why;
    int err = 0;
    if (!readWholeFile(p, text, err))
    {
        if (err != ENOENT)
        {
            f.kind = RegionFile::kDamaged;
            f.why = "cannot be read: " + errnoText(err);
        }
        return f;
    }
    f.kind = RegionFile::kDamaged;
    FlatJson rec;
    if (!parseFlatJson(text, rec, why))
    {
        f.why = "not a flat JSON object: " + printable(why);
        return f;
    }
    auto const it = rec.find(kRegionChecksum);
    bool const sealed = it != rec.end();
    std::string stored;
    if (sealed)
    {
        stored = it->second;
        rec.erase(it);
    }
    f.rec = rec;
    if (sealed)
    {
        std::string const body = formatFlatJson(rec, numericFields());
        if (stored != toHex32(crc32cFast(body.data(), body.size())))
        {
            f.why = "checksum mismatch";
            return f;
        }
    }
    f.why = checkRegionFields(rec);
    if (f.why.empty())
        f.kind = sealed ? RegionFile::kIntact : RegionFile::kLegacy;
    return f;
}

bool unconfirmedLegacy(RegionFile const& f, std::vector<RecordedIdentity> const& recorded)
{
    return f.kind == RegionFile::kLegacy && !recorded.empty()
        && std::none_of(recorded.begin(), recorded.end(),
            [&](RecordedIdentity const& r) { return r.identity == identityOf(f.rec); });
}

std::vector<RecordedIdentity> recordedIdentities(std::string const& dir)
{
    std::vector<RecordedIdentity> out;
    for (char const* leaf : {kJournal, kSnapshot, kJournalOld, kSnapshotBak})
    {
        FlatJson header;
        std::string why;
        if (!parseFlatJson(firstLine(dir + "/" + leaf), header, why))
            continue;
        bool const journal = header.size() == 2 && header["kvcodec_disk_journal"] == "1";
        bool const snapshot = header.size() == 4 && header["kvcodec_disk_snapshot"] == "1" && header.count("seq") != 0
            && header.count("entries") != 0;
        RecordedIdentity r{leaf, header["identity"], {}};
        if ((journal || snapshot) && identityFields(r.identity, r.fields))
            out.push_back(std::move(r));
    }
    return out;
}

std::vector<RecordedIdentity const*> currentIdentities(std::vector<RecordedIdentity> const& all)
{
    std::vector<RecordedIdentity const*> cur, old;
    for (auto const& r : all)
        (r.leaf == kJournal || r.leaf == kSnapshot ? cur : old).push_back(&r);
    return cur.empty() ? old : cur;
}

bool hasStateFiles(std::string const& dir)
{
    for (char const* leaf : {kJournal, kJournalOld, kSnapshot, kSnapshotBak})
        if (exists(dir + "/" + leaf))
            return true;
    return false;
}

std::string fieldDiffs(FlatJson const& from, FlatJson const& to, std::vector<std::string> const& keys)
{
    std::string out;
    for (auto const& k : keys)
    {
        auto a = from.find(k);
        auto b = to.find(k);
        std::string const va = a == from.end() ? std::string() : a->second;
        std::string const vb = b == to.end() ? std::string() : b->second;
        if (va != vb)
            out += (out.empty() ? "" : ", ") + k + " '" + printable(va) + "' -> '" + printable(vb) + "'";
    }
    return out;
}

std::vector<std::string> identityRegionKeys()
{
    std::vector<std::string> keys;
    for (auto const& [ik, rk] : identityKeys())
        keys.emplace_back(rk);
    return keys;
}

int writeRegionFileAt(FileIo& io, std::string const& dir, FlatJson const& rec)
{
    std::string const body = regionFileText(rec);
    std::string const target = dir + "/" + kRegionFile;
    std::string const tmp = target + ".tmp";
    int rc = writeFileSynced(io, tmp, body);
    if (rc == 0 && std::rename(tmp.c_str(), target.c_str()) != 0)
        rc = -errno;
    if (rc != 0)
    {
        ::unlink(tmp.c_str());
        return rc;
    }
    syncDirectory(dir);
    return 0;
}

bool wellFormedJournalHeader(std::string_view line)
{
    FlatJson h, fields;
    std::string why;
    if (!parseFlatJson(line, h, why) || h.size() != 2 || h.count("kvcodec_disk_journal") == 0
        || h.count("identity") == 0)
        return false;
    return h["kvcodec_disk_journal"] != "1" || identityFields(h["identity"], fields);
}

std::string journalHeader(std::string const& identity)
{
    return "{\"kvcodec_disk_journal\":1,\"identity\":" + jsonQuote(identity) + "}";
}

void checkRegionDir(std::string const& dir)
{
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0)
        throw std::runtime_error("disk region directory " + quoted(dir) + " does not exist");
    if (!S_ISDIR(st.st_mode))
        throw std::runtime_error("disk region path " + quoted(dir) + " is not a directory");
}

FlatJson readOnlyRecord(std::string const& dir, std::string& warning)
{
    checkRegionDir(dir);
    std::string const p = dir + "/" + kRegionFile;
    RegionFile f = loadRegionFile(p);
    bool const hasState = hasStateFiles(dir);
    if (f.kind == RegionFile::kMissing && !hasState)
        throw std::runtime_error(
            quoted(dir) + " holds no disk region: cannot read " + kRegionFile + ": " + errnoText(ENOENT));
    std::vector<RecordedIdentity> const recorded = hasState ? recordedIdentities(dir) : std::vector<RecordedIdentity>{};
    if (unconfirmedLegacy(f, recorded))
    {
        f.kind = RegionFile::kDamaged;
        f.why = "it has no checksum and its identity agrees with no journal or snapshot header";
    }
    if (f.kind == RegionFile::kIntact || f.kind == RegionFile::kLegacy)
        return f.rec;
    std::string const what
        = std::string(kRegionFile) + (f.kind == RegionFile::kMissing ? " is missing" : " is damaged (" + f.why + ")");
    if (recorded.empty())
        throw std::runtime_error("disk region " + quoted(dir) + ": " + what
            + " and no journal or snapshot header records the region's identity; it cannot be opened");
    RecordedIdentity const& from = *currentIdentities(recorded).front();
    FlatJson rec = from.fields;
    std::string name = dir;
    while (name.size() > 1 && name.back() == '/')
        name.pop_back();
    rec["name"] = name.substr(name.rfind('/') + 1);
    rec["format"] = "1";
    rec["container_bytes"] = std::to_string(std::strtoull(rec["slot_stride"].c_str(), nullptr, 10)
        * std::strtoull(rec["slots_per_container"].c_str(), nullptr, 10));
    rec["codec_params"] = "";
    rec["layout"] = "";
    warning = "disk region " + quoted(dir) + ": " + what + "; opened read-only with the geometry and codec identity"
        + " recorded in " + from.leaf + " (the codec parameters, layout and name it held are unknown; a writable open"
        + " with the region's configuration repairs it)";
    return rec;
}

} // namespace kvcodec::disk::detail

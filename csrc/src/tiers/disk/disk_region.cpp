// SPDX-License-Identifier: Apache-2.0
#include "tiers/disk/disk_region.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <set>
#include <stdexcept>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "kvcodec/crc32c.h"

namespace kvcodec::disk {
namespace {

// Slots are padded to this in the files so that O_DIRECT (which needs offsets and sizes aligned to
// the device's logical block, 512 B or 4 KiB) can address every slot; fixing it (rather than
// probing the device) keeps a region's layout identical on every file system it is copied to.
constexpr uint64_t kAlign = 4096;
// Most adjacent slots one worker moves in a single vectored I/O.
constexpr size_t kMaxMergedSlots = 16;
constexpr size_t kMaxKeyBytes = 255;
constexpr char const* kJournal = "index.log";
constexpr char const* kJournalOld = "index.log.1";
constexpr char const* kSnapshot = "index.snapshot";
constexpr char const* kSnapshotBak = "index.snapshot.bak";
constexpr char const* kSnapshotTmp = "index.snapshot.tmp";
constexpr char const* kRegionFile = "region.json";
constexpr uint32_t kMaxContainers = 9999;
// A resize or defragmentation moves at most this many bytes per batch (its bounce buffer).
constexpr uint64_t kMoveBatchBytes = 64ull << 20;

std::vector<std::string> const& numericFields()
{
    static std::vector<std::string> const fields = {"format", "slot_bytes", "slot_stride", "container_bytes",
        "slots_per_container", "containers", "codec_format_version"};
    return fields;
}

std::string errnoText(int err)
{
    return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

bool exists(std::string const& p)
{
    struct stat st;
    return ::stat(p.c_str(), &st) == 0;
}

/// A whole file in one uninitialized buffer: recovery reads journals and snapshots of hundreds
/// of MB, and zero-filling them first would cost as much as the read.
struct FileText
{
    std::unique_ptr<char[]> data;
    size_t size = 0;
    [[nodiscard]] std::string_view view() const noexcept
    {
        return {data.get(), size};
    }
};

bool preadFully(int fd, char* dst, size_t n, uint64_t off, size_t& got)
{
    got = 0;
    while (got < n)
    {
        ssize_t r = ::pread(fd, dst + got, n - got, off_t(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return false;
        if (r == 0)
            break;
        got += size_t(r);
    }
    return true;
}

bool readWholeFile(std::string const& p, FileText& out, int& err)
{
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
    {
        err = errno;
        return false;
    }
    struct stat st;
    if (::fstat(fd, &st) != 0)
    {
        err = errno;
        ::close(fd);
        return false;
    }
    out.data.reset(new char[size_t(st.st_size) + 1]);
    size_t got = 0;
    bool ok = preadFully(fd, out.data.get(), size_t(st.st_size), 0, got);
    if (!ok)
        err = errno;
    ::close(fd);
    out.size = got;
    return ok;
}

bool readWholeFile(std::string const& p, std::string& out, int& err)
{
    FileText text;
    if (!readWholeFile(p, text, err))
        return false;
    out.assign(text.data.get(), text.size);
    return true;
}

/// The first and the last `n` bytes of a file (both the whole file when it is small); false
/// when it cannot be read.
bool readHeadTail(std::string const& p, size_t n, std::string& head, std::string& tail, uint64_t& size)
{
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat st;
    bool ok = ::fstat(fd, &st) == 0;
    size = ok ? uint64_t(st.st_size) : 0;
    size_t got = 0;
    head.resize(std::min<uint64_t>(n, size));
    ok = ok && preadFully(fd, head.data(), head.size(), 0, got) && got == head.size();
    tail.resize(std::min<uint64_t>(n, size));
    ok = ok && preadFully(fd, tail.data(), tail.size(), size - tail.size(), got) && got == tail.size();
    ::close(fd);
    return ok;
}

void mkdirs(std::string const& dir)
{
    std::string cur;
    size_t pos = 0;
    while (pos != std::string::npos)
    {
        pos = dir.find('/', pos + 1);
        cur = dir.substr(0, pos);
        if (cur.empty())
            continue;
        if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
        {
            throw std::runtime_error("cannot create disk region directory '" + cur + "': " + errnoText(errno));
        }
    }
}

uint64_t roundUp(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

std::string quoted(std::string const& s)
{
    return "'" + s + "'";
}

/// Text from a damaged file, safe to put in a message: bytes outside printable ASCII as \xNN.
std::string printable(std::string_view s)
{
    std::string out;
    for (char ch : s)
    {
        auto c = static_cast<unsigned char>(ch);
        if (c >= 0x20 && c < 0x7F)
            out += ch;
        else
        {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\x%02x", c);
            out += buf;
        }
    }
    return out;
}

// region.json: geometry and codec identity, sealed with the CRC-32C of its other fields (in the
// form formatFlatJson writes them), so damage is detected rather than guessed. Files written
// before the checksum existed have no such field; they are trusted once a journal or snapshot
// header confirms their identity.
constexpr char const* kRegionChecksum = "crc32c";

std::vector<std::string> const& regionFields()
{
    static std::vector<std::string> const fields = {"format", "name", "slot_bytes", "slot_stride", "container_bytes",
        "slots_per_container", "containers", "codec_name", "codec_format_version", "codec_param_hash", "codec_params",
        "layout"};
    return fields;
}

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

/// The identity line (what journal and snapshot headers record) of region.json fields.
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

struct RegionFile
{
    enum Kind
    {
        kMissing,
        kIntact,  ///< Its checksum matches.
        kLegacy,  ///< Consistent, written before region files carried a checksum.
        kDamaged, ///< Unreadable, unparsable, failing its checksum or inconsistent.
    } kind = kMissing;
    FlatJson rec;        ///< The fields (without the checksum) whenever they parsed.
    std::string why;     ///< What is damaged.
};

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

} // namespace

/// The identity one journal or snapshot header records.
struct RecordedIdentity
{
    std::string leaf;
    std::string identity;
    FlatJson fields; ///< As region.json keys.
};

namespace {

std::string firstLine(std::string const& p)
{
    std::string head, tail;
    uint64_t size = 0;
    if (!readHeadTail(p, 64 << 10, head, tail, size))
        return "";
    size_t const nl = head.find('\n');
    return nl == std::string::npos ? std::string() : head.substr(0, nl);
}

/// The intact identities recorded by the journal and snapshot headers of `dir`, current
/// generation first (index.log, index.snapshot, index.log.1, index.snapshot.bak).
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

/// The recorded identities of the newest generation present (index.log and index.snapshot;
/// the previous generation only when neither has one).
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

/// "field 'a' -> 'b', ..." over `keys` where `from` and `to` differ.
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

/// Writes region.json atomically: a temporary file, synced, renamed over it, directory synced.
int writeRegionFileAt(FileIo& io, std::string const& dir, FlatJson const& rec)
{
    std::string const body = regionFileText(rec);
    std::string const target = dir + "/" + kRegionFile;
    std::string const tmp = target + ".tmp";
    int fd = io.open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int rc = fd < 0 ? fd : writeFully(io, fd, body.data(), body.size(), 0);
    if (rc == 0)
        rc = io.fdatasync(fd);
    if (fd >= 0)
        io.close(fd);
    if (rc == 0 && std::rename(tmp.c_str(), target.c_str()) != 0)
        rc = -errno;
    if (rc != 0)
    {
        ::unlink(tmp.c_str());
        return rc;
    }
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0)
    {
        ::fsync(dfd);
        ::close(dfd);
    }
    return 0;
}

/// A journal header some region wrote intact (another identity, or another format version).
bool wellFormedJournalHeader(std::string_view line)
{
    FlatJson h, fields;
    std::string why;
    if (!parseFlatJson(line, h, why) || h.size() != 2 || h.count("kvcodec_disk_journal") == 0 || h.count("identity") == 0)
        return false;
    return h["kvcodec_disk_journal"] != "1" || identityFields(h["identity"], fields);
}

struct AlignedBuffer
{
    void* p = nullptr;
    explicit AlignedBuffer(size_t bytes)
    {
        if (posix_memalign(&p, kAlign, std::max<size_t>(bytes, kAlign)) != 0)
            throw std::bad_alloc();
        std::memset(p, 0, std::max<size_t>(bytes, kAlign));
    }
    ~AlignedBuffer()
    {
        std::free(p);
    }
    AlignedBuffer(AlignedBuffer const&) = delete;
    AlignedBuffer& operator=(AlignedBuffer const&) = delete;
};

} // namespace

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

// ---------------------------------------------------------------------------------------------
// Opening and recovery
// ---------------------------------------------------------------------------------------------

namespace {
void checkRegionDir(std::string const& dir)
{
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0)
        throw std::runtime_error("disk region directory " + quoted(dir) + " does not exist");
    if (!S_ISDIR(st.st_mode))
        throw std::runtime_error("disk region path " + quoted(dir) + " is not a directory");
}

/// The record a read-only open works from: region.json when it is intact (or an older file
/// without a checksum that a journal or snapshot header confirms), else the identity the journal
/// and snapshots record (with a warning, as nothing may be repaired).
FlatJson readOnlyRecord(std::string const& dir, std::string& warning)
{
    checkRegionDir(dir);
    std::string const p = dir + "/" + kRegionFile;
    RegionFile f = loadRegionFile(p);
    bool const hasState = hasStateFiles(dir);
    if (f.kind == RegionFile::kMissing && !hasState)
        throw std::runtime_error(quoted(dir) + " holds no disk region: cannot read " + kRegionFile + ": "
            + errnoText(ENOENT));
    std::vector<RecordedIdentity> const recorded = hasState ? recordedIdentities(dir) : std::vector<RecordedIdentity>{};
    if (f.kind == RegionFile::kLegacy && !recorded.empty()
        && std::none_of(recorded.begin(), recorded.end(),
            [&](RecordedIdentity const& r) { return r.identity == identityOf(f.rec); }))
    {
        f.kind = RegionFile::kDamaged;
        f.why = "it has no checksum and its identity agrees with no journal or snapshot header";
    }
    if (f.kind == RegionFile::kIntact || f.kind == RegionFile::kLegacy)
        return f.rec;
    std::string const what = std::string(kRegionFile)
        + (f.kind == RegionFile::kMissing ? " is missing" : " is damaged (" + f.why + ")");
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
} // namespace

FlatJson DiskRegion::readRegionFile(std::string const& dir)
{
    checkRegionDir(dir);
    std::string const p = dir + "/" + kRegionFile;
    RegionFile f = loadRegionFile(p);
    if (f.kind == RegionFile::kMissing)
        throw std::runtime_error(quoted(dir) + " holds no disk region: cannot read " + kRegionFile + ": " + errnoText(ENOENT));
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
        throw std::invalid_argument("max_bytes is " + std::to_string(cfg.maxBytes)
            + "; it must be >= container_bytes (" + std::to_string(cfg.containerBytes) + ")");
    if (cfg.ioThreads == 0 || cfg.ioThreads > 256)
        throw std::invalid_argument("io_threads is " + std::to_string(cfg.ioThreads) + "; valid: 1..256");
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
    r->stride_ = stride;
    r->slotsPerContainer_ = uint32_t(spc);
    r->numContainers_ = uint32_t(containers);
    r->numSlots_ = uint32_t(spc * containers);
    if (!readOnlyWarning.empty())
        r->recovery_.warnings.push_back(readOnlyWarning);
    r->openFiles();
    r->recover();
    r->startThreads();
    if (r->openTarget_ != 0 && r->openTarget_ != r->numContainers_)
    {
        uint32_t const from = r->numContainers_;
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
                + std::to_string(r->numContainers_) + " containers: resizing it to the configured "
                + std::to_string(r->openTarget_) + " failed: " + e.what());
        }
    }
    return r;
}

std::string DiskRegion::path(std::string const& leaf) const
{
    return dir_ + "/" + leaf;
}

void DiskRegion::syncDir()
{
    int fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0)
    {
        ::fsync(fd);
        ::close(fd);
    }
}

std::string DiskRegion::identityLine() const
{
    // What must match for recorded blobs and slot numbers to mean the same thing.
    return identityOf(regionRecord());
}

void DiskRegion::repairRegionFile(std::string const& what, FlatJson const* damaged,
    std::vector<RecordedIdentity> const& recorded, bool hasState)
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
                f["containers"] = std::to_string(numContainers_);
                if (match == nullptr && identityOf(f) == mine)
                {
                    uint64_t const count = std::strtoull(r->fields.at("containers").c_str(), nullptr, 10);
                    openTarget_ = numContainers_;
                    numContainers_ = uint32_t(count);
                    numSlots_ = uint32_t(count * slotsPerContainer_);
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
            throw std::runtime_error("disk region " + quoted(dir_) + ": cannot create its lock file: " + errnoText(errno));
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
        std::vector<RecordedIdentity> const recorded = hasState ? recordedIdentities(dir_) : std::vector<RecordedIdentity>{};
        if (file.kind == RegionFile::kLegacy && !recorded.empty()
            && std::none_of(recorded.begin(), recorded.end(),
                [&](RecordedIdentity const& r) { return r.identity == identityOf(file.rec); }))
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
            if (same && recordedCount != numContainers_)
            {
                openTarget_ = numContainers_;
                numContainers_ = uint32_t(recordedCount);
                numSlots_ = uint32_t(recordedCount * slotsPerContainer_);
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
                recovery_.warnings.push_back("disk region " + quoted(dir_) + " was written with another codec or geometry ("
                    + diffs + "): its pages are invalidated and the region is reinitialized");
                recovery_.invalidated = true;
                fresh = true;
            }
            else if (file.kind == RegionFile::kLegacy || file.rec != expected)
            {
                // Same identity, new descriptive fields (e.g. a renamed region), or a file from before
                // region files carried a checksum: rewritten, the pages kept.
                int const rc = writeRegionFileAt(*posixFileIo(), dir_, expected);
                if (rc != 0)
                    recovery_.warnings.push_back("disk region " + quoted(dir_) + ": cannot rewrite " + kRegionFile + ": "
                        + errnoText(-rc));
            }
        }
    }
    if (fresh)
    {
        recovery_.created = true;
        for (char const* leaf : {kJournal, kJournalOld, kSnapshot, kSnapshotBak, kSnapshotTmp})
            ::unlink(path(leaf).c_str());
        // Containers beyond the new geometry would only waste space.
        for (uint32_t c = numContainers_; c < 10000; ++c)
        {
            char leaf[32];
            std::snprintf(leaf, sizeof(leaf), "containers/%04u.bin", c);
            if (::unlink(path(leaf).c_str()) != 0)
                break;
        }
        int const rc = writeRegionFileAt(*posixFileIo(), dir_, regionRecord());
        if (rc != 0)
            throw std::runtime_error("disk region " + quoted(dir_) + ": cannot write " + kRegionFile + ": " + errnoText(-rc));
    }

    // Containers: preallocated so a full region never hits ENOSPC on a data write.
    std::string cdir = path("containers");
    if (!ro)
        mkdirs(cdir);
    uint64_t const fileBytes = stride_ * slotsPerContainer_;
    // A region that never recorded a page (e.g. an earlier open failed while preallocating) has
    // nothing to lose in a short container: no warning then.
    bool const hasState = exists(path(kJournal)) || exists(path(kJournalOld)) || exists(path(kSnapshot))
        || exists(path(kSnapshotBak));
    freshContainers_.assign(numContainers_, false);
    std::vector<std::string> paths(numContainers_);
    for (uint32_t c = 0; c < numContainers_; ++c)
    {
        char leaf[32];
        std::snprintf(leaf, sizeof(leaf), "/%04u.bin", c);
        paths[c] = cdir + leaf;
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
            throw std::runtime_error("disk region " + quoted(dir_) + ": cannot preallocate container " + quoted(paths[c])
                + " (" + std::to_string(fileBytes) + " bytes): " + errnoText(-rc) + freeText
                + "; lower max_bytes or free space");
        }
    }
    if (!ro && !recovery_.created)
    {
        // Containers beyond the geometry: a resize that crashed before recording a growth, or
        // after recording a shrink but before deleting the cut files.
        for (uint32_t c = numContainers_; c < 10000; ++c)
        {
            char leaf[32];
            std::snprintf(leaf, sizeof(leaf), "/%04u.bin", c);
            if (::unlink((cdir + leaf).c_str()) != 0)
                break;
        }
    }
    syncDir();

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
    containerFds_.assign(numContainers_, -1);
    for (uint32_t c = 0; c < numContainers_; ++c)
    {
        if (ro && freshContainers_[c])
            continue;
        int fd = io_->open(paths[c], accessFlags | (direct_ ? O_DIRECT : 0), 0);
        if (fd < 0)
            throw std::runtime_error("disk region " + quoted(dir_) + ": cannot open container " + quoted(paths[c]) + ": "
                + errnoText(-fd));
        containerFds_[c] = fd;
    }
}

bool DiskRegion::generationCovered(std::string const& file, std::string const& header, uint64_t lastSeq) const
{
    // Records are appended in sequence order: when the last one is already in the snapshot, so
    // is the whole generation (the common case after a rotation). Only the first and last bytes
    // are read; anything unusual (a long last line, damage) goes to the full replay instead.
    constexpr size_t kEdge = 64 << 10;
    std::string head, tail;
    uint64_t size = 0;
    if (lastSeq == 0 || !readHeadTail(file, kEdge, head, tail, size))
        return false;
    size_t nl = head.find('\n');
    if (nl == std::string::npos || head.compare(0, nl, header) != 0 || size <= nl + 2 || tail.back() != '\n')
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
        && last.seq <= lastSeq;
}

void DiskRegion::applyPut(std::string key, uint32_t slot, uint32_t crc, uint32_t tag, uint64_t seq)
{
    Slot& s = slots_[slot];
    if (s.state == kLive && slotKeys_[slot] != key)
    {
        // Only damage (a lost retirement record) puts two keys in one slot: the later wins.
        index_.erase(slotKeys_[slot]);
        ++recovery_.droppedEntries;
    }
    // One hash lookup whether the key is new or moves.
    auto [it, inserted] = index_.try_emplace(key, slot);
    if (!inserted)
    {
        if (it->second != slot)
        {
            slots_[it->second].state = kFree;
            slotKeys_[it->second].clear();
        }
        it->second = slot;
    }
    s.state = kLive;
    s.crc = crc;
    s.tag = tag;
    s.seq = seq;
    slotKeys_[slot] = std::move(key);
}

void DiskRegion::applyRecord(JournalRecord&& r)
{
    if (r.put)
    {
        applyPut(std::move(r.key), r.slot, r.crc, r.tag, r.seq);
        return;
    }
    auto it = index_.find(r.key);
    if (it != index_.end() && it->second == r.slot)
    {
        index_.erase(it);
        slots_[r.slot].state = kFree;
        slotKeys_[r.slot].clear();
    }
}

void DiskRegion::recover()
{
    auto t0 = std::chrono::steady_clock::now();
    bool const ro = cfg_.readOnly;
    std::string const identity = identityLine();
    slots_.assign(numSlots_, Slot{});
    slotKeys_.assign(numSlots_, std::string());
    index_.reserve(numSlots_);
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
                    snap, slotsPerContainer_, numSlots_,
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
                slots_.assign(numSlots_, Slot{});
                slotKeys_.assign(numSlots_, std::string());
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
        //    of records numbered without gaps. A damaged line is repaired when one bit flipped;
        //    otherwise the records it held are lost, and every key whose latest state a lost record
        //    could have changed is dropped (a miss) rather than served from older state.
        std::string const region = "disk region " + quoted(dir_) + ": ";
        uint64_t lastSeq = snapSeq;
        uint64_t expected = snapSeq + 1; // The next record the index needs.
        std::string const header = "{\"kvcodec_disk_journal\":1,\"identity\":" + jsonQuote(identity) + "}";
        struct Damaged
        {
            bool current;          ///< In index.log (else index.log.1).
            size_t pos;            ///< Byte offset in its file.
            std::string_view text; ///< The damaged bytes, with their newline when they have one.
            std::string why;
        };
        FileText texts[2];              // Alive while `pending` refers to them.
        std::vector<Damaged> pending;   // Damaged lines since the last intact record.
        uint64_t dropBelow = 0;         // Live keys recorded before this sequence number are dropped.
        std::vector<std::string> losses;
        size_t repairBudget = 64;       // Lines tried bit by bit per open (bounds a garbage journal).
        size_t tornAt = SIZE_MAX;       // index.log is cut back here: an append a crash cut short.
        size_t currentSize = 0;
        auto where = [&](Damaged const& d) {
            return std::string(d.current ? kJournal : kJournalOld) + " line at byte " + std::to_string(d.pos) + ": "
                + d.why;
        };
        auto apply = [&](JournalRecord&& r) {
            expected = r.seq + 1;
            lastSeq = r.seq;
            applyRecord(std::move(r));
            ++recovery_.journalRecordsReplayed;
        };
        // Called before the next intact record (`next` = its sequence number) and at the end (0).
        auto settle = [&](uint64_t next) {
            if (pending.empty() && (next == 0 || next <= expected))
                return;
            if (pending.empty() && recovery_.journalRecordsReplayed == 0 && recovery_.snapshotUsed.empty())
                return; // The journal alone after losing the snapshots: the records before were theirs.
            bool const covered = next != 0
                ? next <= expected
                : recovery_.snapshotUsed == kSnapshot
                    && std::none_of(pending.begin(), pending.end(), [](Damaged const& d) { return d.current; });
            if (covered)
            {
                // The main snapshot covers all of index.log.1, and a record numbered as expected
                // follows anything else: the damaged bytes held nothing the index needs.
                for (Damaged const& d : pending)
                    recovery_.warnings.push_back(region + "journal " + where(d) + "; the damaged line held no record "
                        + "the index needs (the snapshot covers it, or the numbering continues without a gap): skipped");
                pending.clear();
                return;
            }
            if (!pending.empty())
            {
                // One flipped bit per damaged line: its line checksum finds and corrects it.
                std::vector<JournalRecord> fixed, recs;
                uint64_t seq = expected;
                bool ok = true;
                for (Damaged const& d : pending)
                {
                    ok = ok && repairBudget > 0 && repairRecords(d.text, slotsPerContainer_, numSlots_, seq, recs);
                    repairBudget -= repairBudget > 0 ? 1 : 0;
                    if (!ok)
                        break;
                    seq += recs.size();
                    for (JournalRecord& r : recs)
                        fixed.push_back(std::move(r));
                }
                if (ok && (next == 0 || seq == next))
                {
                    for (Damaged const& d : pending)
                        recovery_.warnings.push_back(region + "journal " + where(d) + "; the damage was one flipped bit,"
                            + " corrected with the line checksum: the record is replayed");
                    for (JournalRecord& r : fixed)
                        apply(std::move(r));
                    pending.clear();
                    repairedJournal_ = true;
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
                if (pending.back().current && pending.back().text.back() != '\n')
                {
                    tornAt = pending.back().pos;
                    pending.pop_back();
                }
                if (pending.empty())
                    return;
                for (Damaged const& d : pending)
                    damage += (damage.empty() ? "" : ", ") + where(d);
                losses.push_back("the records after seq " + std::to_string(expected - 1) + " are damaged beyond repair ("
                    + damage + ")");
                dropBelow = UINT64_MAX;
            }
            else
            {
                for (Damaged const& d : pending)
                    damage += (damage.empty() ? "" : ", ") + where(d);
                std::string const range = next - 1 > expected
                    ? "records seq " + std::to_string(expected) + ".." + std::to_string(next - 1) + " are"
                    : "record seq " + std::to_string(expected) + " is";
                losses.push_back(pending.empty() ? range + " missing" : range + " damaged beyond repair (" + damage + ")");
                dropBelow = std::max(dropBelow, next);
            }
            pending.clear();
        };
        for (int gen = 0; gen < 2; ++gen)
        {
            char const* leaf = gen == 0 ? kJournalOld : kJournal;
            bool const current = gen == 1;
            int err = 0;
            if (!exists(path(leaf)))
                continue;
            if (!current && generationCovered(path(leaf), header, lastSeq))
                continue;
            FileText& file = texts[gen];
            if (!readWholeFile(path(leaf), file, err))
            {
                recovery_.warnings.push_back(region + "cannot read journal " + leaf + ": " + errnoText(err));
                continue;
            }
            std::string_view const text = file.view();
            size_t nl = text.find('\n');
            if (nl == std::string::npos)
            {
                // No complete header line, hence no record: a header write a crash cut short.
                if (!text.empty())
                {
                    damaged = true;
                    recovery_.warnings.push_back(region + "journal " + leaf + " has no complete header line; ignored");
                }
                if (current)
                    journalSize_ = 0; // rewritten below
                continue;
            }
            if (text.compare(0, nl, header) != 0)
            {
                // Damage, or a journal that a resize which did not finish headed with its new
                // container count (its records are then none, or covered by the snapshot). Either
                // way each record is checked by its own checksum and the region's slot range: a
                // header never decides which records count (ignoring them served older values).
                damaged = true;
                recovery_.warnings.push_back(region + "journal " + leaf
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
                if (lastStart > nl && parseRecord(text.substr(lastStart, text.size() - 1 - lastStart),
                        slotsPerContainer_, numSlots_, last, why)
                    && last.seq <= lastSeq)
                    continue;
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
                    if (!pending.empty() || r.seq > expected)
                        settle(r.seq);
                    if (r.seq >= expected)
                        apply(std::move(r));
                }
                else
                {
                    ++recovery_.journalCorruptLines;
                    damaged = true;
                    pending.push_back({current, pos, text.substr(pos, stop - pos), complete ? why : "incomplete line"});
                }
                pos = stop;
            }
            if (current)
                currentSize = journalSize_ = text.size();
        }
        settle(0);
        if (tornAt != SIZE_MAX)
        {
            uint64_t const dropped = currentSize - tornAt;
            recovery_.truncatedTailBytes += dropped;
            recovery_.warnings.push_back(region + "journal " + kJournal + " ends with a truncated or torn record ("
                + std::to_string(dropped) + " bytes at byte " + std::to_string(tornAt)
                + "): an append a crash cut short, never acknowledged; dropped");
            if (!ro)
            {
                int fd = ::open(path(kJournal).c_str(), O_WRONLY | O_CLOEXEC);
                if (fd < 0 || ::ftruncate(fd, off_t(tornAt)) != 0 || ::fdatasync(fd) != 0)
                    throw std::runtime_error(region + "cannot truncate the torn tail of " + kJournal + ": "
                        + errnoText(errno));
                ::close(fd);
            }
            journalSize_ = tornAt;
        }
        lastSeq_ = lastSeq;
        if (dropBelow != 0)
        {
            uint64_t n = 0;
            for (auto it = index_.begin(); it != index_.end();)
            {
                if (slots_[it->second].seq < dropBelow)
                {
                    slots_[it->second].state = kFree;
                    slotKeys_[it->second].clear();
                    it = index_.erase(it);
                    ++n;
                }
                else
                    ++it;
            }
            recovery_.droppedEntries += n;
            repairedJournal_ = true;
            std::string lost;
            for (auto const& l : losses)
                lost += (lost.empty() ? "" : "; ") + l;
            recovery_.warnings.push_back(region + "journal damage: " + lost + ". A lost record may have overwritten or "
                + "erased any key recorded before it: "
                + (n == 0 ? std::string("every such key was written again after it, so none is dropped")
                          : std::to_string(n) + (n == 1 ? " key whose latest state cannot be established is"
                                                        : " keys whose latest state cannot be established are")
                              + " dropped and read as misses (an older value is never served)"));
        }

        // 3. Pages in containers that were missing or short are gone.
        bool const anyFresh = std::find(freshContainers_.begin(), freshContainers_.end(), true) != freshContainers_.end();
        for (auto it = anyFresh ? index_.begin() : index_.end(); it != index_.end();)
        {
            if (freshContainers_[it->second / slotsPerContainer_])
            {
                slots_[it->second].state = kFree;
                slotKeys_[it->second].clear();
                it = index_.erase(it);
                ++recovery_.droppedEntries;
            }
            else
                ++it;
        }
    }

    // Free bitset and eviction order.
    limit_ = numSlots_;
    freeBits_.assign((numSlots_ + 63) / 64, 0);
    freeCount_ = 0;
    std::vector<std::pair<uint64_t, uint32_t>> order;
    order.reserve(index_.size());
    for (uint32_t s = 0; s < numSlots_; ++s)
    {
        if (slots_[s].state == kFree)
        {
            freeBits_[s / 64] |= 1ull << (s % 64);
            ++freeCount_;
        }
        else
            order.emplace_back(slots_[s].seq, s);
    }
    std::sort(order.begin(), order.end());
    fifo_.assign(order.begin(), order.end());

    // The current journal: (re)created with its header when missing or damaged.
    if (!ro)
    {
        std::string const header = "{\"kvcodec_disk_journal\":1,\"identity\":" + jsonQuote(identity) + "}\n";
        bool rewrite = journalSize_ == 0;
        journalFd_ = io_->open(path(kJournal), O_RDWR | O_CREAT, 0644);
        if (journalFd_ < 0)
            throw std::runtime_error("disk region " + quoted(dir_) + ": cannot open the journal: " + errnoText(-journalFd_));
        if (rewrite)
        {
            int rc = io_->ftruncate(journalFd_, 0);
            if (rc == 0)
                rc = writeFully(*io_, journalFd_, header.data(), header.size(), 0);
            if (rc == 0)
                rc = io_->fdatasync(journalFd_);
            if (rc != 0)
                throw std::runtime_error("disk region " + quoted(dir_) + ": cannot write the journal header: " + errnoText(-rc));
            journalSize_ = header.size();
            syncDir();
        }
    }
    recordsSinceSnapshot_ = recovery_.journalRecordsReplayed;
    st_.slotsTotal = numSlots_;
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
            failRegion("the snapshot recording what recovery repaired or dropped for journal damage could not be written");
    }
}

void DiskRegion::startThreads()
{
    for (uint32_t i = 0; i < cfg_.ioThreads; ++i)
        workers_.emplace_back([this] { workerLoop(); });
    if (!cfg_.readOnly)
        committer_ = std::thread([this] { committerLoop(); });
}

// ---------------------------------------------------------------------------------------------
// Submission
// ---------------------------------------------------------------------------------------------

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

int64_t DiskRegion::allocateSlotLocked()
{
    if (freeCount_ == 0)
        return -1;
    size_t const words = freeBits_.size();
    size_t w = cursor_ / 64;
    for (size_t n = 0; n <= words; ++n, w = (w + 1) % words)
    {
        uint64_t bits = freeBits_[w];
        if (n == 0)
            bits &= ~0ull << (cursor_ % 64); // continue after the cursor: slots fill sequentially
        if (bits == 0)
            continue;
        uint32_t s = uint32_t(w * 64 + uint32_t(__builtin_ctzll(bits)));
        freeBits_[w] &= ~(1ull << (s % 64));
        --freeCount_;
        cursor_ = (s + 1) % numSlots_;
        return s;
    }
    return -1;
}

void DiskRegion::freeSlotLocked(uint32_t slot)
{
    Slot& s = slots_[slot];
    s.state = kFree;
    s.retireDurable = false;
    slotKeys_[slot].clear();
    if (slot < limit_) // Slots a shrink is cutting off are never handed out again.
    {
        freeBits_[slot / 64] |= 1ull << (slot % 64);
        ++freeCount_;
    }
}

void DiskRegion::maybeReleaseLocked(uint32_t slot)
{
    Slot& s = slots_[slot];
    if (s.state == kRetiring && s.retireDurable && s.pins == 0)
        freeSlotLocked(slot);
}

namespace {
void checkKey(std::string const& key)
{
    if (key.empty() || key.size() > kMaxKeyBytes)
        throw std::invalid_argument(
            "key is " + std::to_string(key.size()) + " bytes; keys must be 1.." + std::to_string(kMaxKeyBytes) + " bytes");
}
} // namespace

Ticket DiskRegion::submitWrite(std::string const& key, void const* src, size_t bytes, uint32_t tag)
{
    checkKey(key);
    if (src == nullptr)
        throw std::invalid_argument("src is null; pass a host buffer of slot_bytes bytes");
    if (bytes != cfg_.slotBytes)
        throw std::invalid_argument("page is " + std::to_string(bytes) + " bytes; disk region " + quoted(dir_)
            + " holds pages of exactly slot_bytes = " + std::to_string(cfg_.slotBytes) + " bytes"
            + (bytes > cfg_.slotBytes ? " (too large for its slots)" : ""));
    std::unique_lock<std::mutex> lock(mu_);
    exclusiveCv_.wait(lock, [&] { return !exclusive_; }); // A resize or defragmentation runs.
    if (closed_ || stopping_)
        throw std::runtime_error("disk region " + quoted(dir_) + " is closed");
    if (cfg_.readOnly)
        throw std::runtime_error("disk region " + quoted(dir_) + " is open read-only; writes are refused");
    Ticket t = newTicketLocked();
    if (failed_)
    {
        ++st_.putErrors;
        completeLocked(t, {StatusCode::kIoError, failReason_, 0});
        return t;
    }
    Task task{Task::kWrite, t, key, 0, tag, 0, src, nullptr};
    int64_t slot = allocateSlotLocked();
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
            index_.erase(victim);
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
        completeLocked(t, {StatusCode::kFull,
                              "disk region " + quoted(dir_) + " is full (" + std::to_string(numSlots_ - freeCount_)
                                  + " of " + std::to_string(numSlots_) + " slots in use, none evictable; policy "
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
    std::unique_lock<std::mutex> lock(mu_);
    exclusiveCv_.wait(lock, [&] { return !exclusive_; }); // A resize or defragmentation runs.
    if (closed_ || stopping_)
        throw std::runtime_error("disk region " + quoted(dir_) + " is closed");
    Ticket t = newTicketLocked();
    ++st_.reads;
    auto it = index_.find(key);
    if (it == index_.end())
    {
        ++st_.misses;
        completeLocked(t, {StatusCode::kNotFound, "", 0});
        return t;
    }
    uint32_t slot = it->second;
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
    std::unique_lock<std::mutex> lock(mu_);
    exclusiveCv_.wait(lock, [&] { return !exclusive_; }); // A resize or defragmentation runs.
    if (closed_ || stopping_)
        throw std::runtime_error("disk region " + quoted(dir_) + " is closed");
    if (cfg_.readOnly)
        throw std::runtime_error("disk region " + quoted(dir_) + " is open read-only; erase is refused");
    Ticket t = newTicketLocked();
    auto it = index_.find(key);
    if (it == index_.end())
    {
        completeLocked(t, {StatusCode::kNotFound, "", 0});
        return t;
    }
    uint32_t slot = it->second;
    index_.erase(it);
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
    return index_.count(key) != 0;
}

std::optional<PageInfo> DiskRegion::lookup(std::string const& key) const
{
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end())
        return std::nullopt;
    Slot const& s = slots_[it->second];
    return PageInfo{key, it->second / slotsPerContainer_, it->second % slotsPerContainer_, s.tag, s.crc, s.seq};
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
            out.push_back({slotKeys_[slot], slot / slotsPerContainer_, slot % slotsPerContainer_, s.tag, s.crc, s.seq});
    }
    return out;
}

RegionStats DiskRegion::stats() const
{
    std::lock_guard<std::mutex> lock(mu_);
    RegionStats s = st_;
    s.slotsLive = index_.size();
    s.slotsFree = freeCount_;
    s.lastSeq = lastSeq_;
    s.failed = failed_;
    return s;
}

// ---------------------------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------------------------

namespace {
Status ioFailure(std::string const& dir, std::string const& what, int negErrno)
{
    int err = -negErrno;
    StatusCode code = (err == ENOSPC || err == EDQUOT) ? StatusCode::kNoSpace : StatusCode::kIoError;
    return {code, "disk region '" + dir + "': " + what + ": " + errnoText(err), 0};
}
} // namespace

void DiskRegion::workerLoop()
{
    AlignedBuffer bounce(stride_);
    // Merging needs vectored I/O and slots that fill their stride (no bounce padding).
    bool const merge = io_->vectored() && cfg_.slotBytes == stride_;
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

bool DiskRegion::mergeable(Task const& last, Task const& next) const
{
    auto inPlace = [&](void const* p) { return !direct_ || reinterpret_cast<uintptr_t>(p) % kAlign == 0; };
    return next.kind == last.kind && next.slot == last.slot + 1
        && next.slot / slotsPerContainer_ == last.slot / slotsPerContainer_
        && (next.kind == Task::kWrite ? inPlace(next.src) && inPlace(last.src) : inPlace(next.dst) && inPlace(last.dst));
}

void DiskRegion::runMerged(std::vector<Task>& run, void* bounce)
{
    uint32_t const container = run.front().slot / slotsPerContainer_;
    off_t const offset = off_t(uint64_t(run.front().slot % slotsPerContainer_) * stride_);
    int const fd = containerFds_[container];
    std::vector<iovec> iov(run.size());
    for (size_t i = 0; i < run.size(); ++i)
    {
        void* base = run[i].kind == Task::kWrite ? const_cast<void*>(run[i].src) : run[i].dst;
        iov[i] = {base, cfg_.slotBytes};
    }
    ssize_t const want = ssize_t(run.size() * cfg_.slotBytes);
    bool const write = run.front().kind == Task::kWrite;
    std::vector<uint32_t> crcs;
    if (write)
    {
        crcs.reserve(run.size());
        for (Task const& t : run)
            crcs.push_back(crc32cFast(t.src, cfg_.slotBytes));
    }
    ssize_t const done = write ? io_->pwritev(fd, iov.data(), int(iov.size()), offset)
                               : io_->preadv(fd, iov.data(), int(iov.size()), offset);
    if (done != want)
    {
        // A failure or a short transfer: redo each page on its own, so each gets its own result.
        for (Task& t : run)
            runTask(t, bounce);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        ++st_.mergedIos;
        st_.mergedSlots += run.size();
    }
    for (size_t i = 0; i < run.size(); ++i)
    {
        if (write)
            finishWrite(run[i], crcs[i]);
        else
            finishRead(run[i], run[i].dst, 0, false);
    }
}

void DiskRegion::runTask(Task& t, void* bounce)
{
    uint32_t const container = t.slot / slotsPerContainer_;
    off_t const offset = off_t(uint64_t(t.slot % slotsPerContainer_) * stride_);
    int const fd = containerFds_[container];
    // O_DIRECT needs aligned memory and whole blocks: go through the bounce buffer otherwise.
    size_t const ioBytes = direct_ ? stride_ : cfg_.slotBytes;

    if (t.kind == Task::kWrite)
    {
        uint32_t crc = crc32cFast(t.src, cfg_.slotBytes);
        void const* buf = t.src;
        if (direct_ && (reinterpret_cast<uintptr_t>(t.src) % kAlign != 0 || cfg_.slotBytes != stride_))
        {
            std::memcpy(bounce, t.src, cfg_.slotBytes);
            std::memset(static_cast<char*>(bounce) + cfg_.slotBytes, 0, stride_ - cfg_.slotBytes);
            buf = bounce;
        }
        int rc = writeFully(*io_, fd, buf, ioBytes, offset);
        if (rc != 0)
        {
            std::string where = "container " + std::to_string(container) + " slot " + std::to_string(t.slot % slotsPerContainer_);
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
    bool const viaBounce = direct_ && (reinterpret_cast<uintptr_t>(t.dst) % kAlign != 0 || cfg_.slotBytes != stride_);
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
    auto where = [&] {
        return "container " + std::to_string(t.slot / slotsPerContainer_) + " slot "
            + std::to_string(t.slot % slotsPerContainer_);
    };
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

// ---------------------------------------------------------------------------------------------
// Group commit
// ---------------------------------------------------------------------------------------------

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
            touched.insert(item.slot / slotsPerContainer_);
    std::vector<int> syncErr(numContainers_, 0);
    for (uint32_t c : touched)
        syncErr[c] = io_->fdatasync(containerFds_[c]);

    std::vector<CommitItem*> ok;
    ok.reserve(batch.size());
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& item : batch)
        {
            int err = item.put ? syncErr[item.slot / slotsPerContainer_] : 0;
            if (err != 0)
            {
                freeSlotLocked(item.slot);
                ++st_.putErrors;
                completeLocked(item.ticket,
                    ioFailure(dir_, "syncing container " + std::to_string(item.slot / slotsPerContainer_), err));
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
        text += formatRecord(r, slotsPerContainer_);
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
            if (index_.count(item->key) == 0 && v.pins == 0)
            {
                index_[item->key] = item->slot;
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
            auto it = index_.find(item->key);
            if (it != index_.end())
            {
                // The new record supersedes the old page durably.
                Slot& old = slots_[it->second];
                old.state = kRetiring;
                old.retireDurable = true;
                maybeReleaseLocked(it->second);
                it->second = item->slot;
            }
            else
                index_.emplace(item->key, item->slot);
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

// ---------------------------------------------------------------------------------------------
// Snapshot
// ---------------------------------------------------------------------------------------------

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
    std::string text = formatSnapshot(identityLine(), seq, entries, slotsPerContainer_);
    entries.clear();

    std::string const tmp = path(kSnapshotTmp);
    int fd = io_->open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int rc = fd < 0 ? fd : writeFully(*io_, fd, text.data(), text.size(), 0);
    if (rc == 0)
        rc = io_->fdatasync(fd);
    if (fd >= 0)
        io_->close(fd);
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
    syncDir();
    mainSnapshotGood_ = true;

    // Rotate the journal: index.log becomes index.log.1, which covers the backup's gap.
    std::string const header = "{\"kvcodec_disk_journal\":1,\"identity\":" + jsonQuote(identityLine()) + "}\n";
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
    syncDir();
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

// ---------------------------------------------------------------------------------------------
// Resize and defragmentation
// ---------------------------------------------------------------------------------------------

FlatJson DiskRegion::regionRecord() const
{
    FlatJson r;
    r["format"] = "1";
    r["name"] = cfg_.name;
    r["slot_bytes"] = std::to_string(cfg_.slotBytes);
    r["slot_stride"] = std::to_string(stride_);
    r["container_bytes"] = std::to_string(stride_ * slotsPerContainer_);
    r["slots_per_container"] = std::to_string(slotsPerContainer_);
    r["containers"] = std::to_string(numContainers_);
    r["codec_name"] = cfg_.codec.name;
    r["codec_format_version"] = std::to_string(cfg_.codec.formatVersion);
    r["codec_param_hash"] = cfg_.codec.paramHash;
    r["codec_params"] = cfg_.codec.paramsJson;
    r["layout"] = cfg_.layoutJson;
    return r;
}

int DiskRegion::writeRegionRecord()
{
    return writeRegionFileAt(*io_, dir_, regionRecord());
}

void DiskRegion::setLimitLocked(uint32_t limit)
{
    limit_ = std::min(limit, numSlots_);
    freeBits_.assign((size_t(numSlots_) + 63) / 64, 0);
    freeCount_ = 0;
    for (uint32_t s = 0; s < limit_; ++s)
    {
        if (slots_[s].state == kFree)
        {
            freeBits_[s / 64] |= 1ull << (s % 64);
            ++freeCount_;
        }
    }
    if (cursor_ >= limit_)
        cursor_ = 0;
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
            throw std::runtime_error("disk region " + quoted(dir_) + ": a resize or defragmentation is already running");
        exclusive_ = true;
    }
    flush(); // What was submitted before completes first (retirements included).
}

void DiskRegion::endExclusive() noexcept
{
    {
        std::lock_guard<std::mutex> lock(mu_);
        exclusive_ = false;
        setLimitLocked(numSlots_);
    }
    exclusiveCv_.notify_all();
}

void DiskRegion::relocateBelow(
    uint32_t limit, ResizeProgress const& progress, bool dropOldest, uint32_t batchPages, ResizeReport& report)
{
    auto where = [&](uint32_t slot) {
        return "container " + std::to_string(slot / slotsPerContainer_) + " slot " + std::to_string(slot % slotsPerContainer_);
    };
    std::vector<uint32_t> movers;
    std::vector<uint32_t> victims;
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (uint32_t s = limit; s < numSlots_; ++s)
        {
            if (slots_[s].state == kLive)
                movers.push_back(s);
            else if (slots_[s].state != kFree)
                throw ResizeError(StatusCode::kIoError, "disk region " + quoted(dir_) + ": " + where(s)
                    + " is held by a retirement that could not be recorded; reopen the region before resizing it");
        }
        setLimitLocked(limit);
        if (movers.size() > freeCount_)
        {
            size_t const excess = movers.size() - freeCount_;
            if (!dropOldest)
                throw ResizeError(StatusCode::kFull, "disk region " + quoted(dir_) + ": " + std::to_string(movers.size())
                    + " live pages lie at or beyond slot " + std::to_string(limit) + " but only "
                    + std::to_string(freeCount_) + " slots below it are free; erase " + std::to_string(excess)
                    + " pages first (nothing was changed)");
            // The oldest pages of the cut part go; the others still move.
            std::sort(movers.begin(), movers.end(), [&](uint32_t a, uint32_t b) { return slots_[a].seq < slots_[b].seq; });
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
                index_.erase(key);
                slots_[s].state = kRetiring;
                slots_[s].retireDurable = false;
                ++st_.erases;
                items.push_back(CommitItem{false, newTicketLocked(), std::move(key), s, slots_[s].crc, slots_[s].tag, std::nullopt});
            }
        }
        std::string const error = commit(items);
        if (!error.empty())
            throw ResizeError(StatusCode::kIoError, "disk region " + quoted(dir_) + ": dropping the oldest pages to make room failed ("
                + error + "); the region keeps its geometry");
        report.dropped += victims.size();
    }

    size_t const ioBytes = direct_ ? stride_ : cfg_.slotBytes;
    size_t const batch = size_t(std::max<uint64_t>(1, std::min<uint64_t>(batchPages, kMoveBatchBytes / stride_)));
    AlignedBuffer buffer(size_t(stride_) * std::min(batch, std::max<size_t>(movers.size(), 1)));
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
                int64_t const to = allocateSlotLocked();
                if (to < 0)
                {
                    for (size_t j = 0; j < i; ++j)
                        freeSlotLocked(mv[j].to);
                    throw ResizeError(StatusCode::kIoError, "disk region " + quoted(dir_) + ": no free slot below " + std::to_string(limit)
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
            char* buf = static_cast<char*>(buffer.p) + i * stride_;
            Move& m = mv[i];
            int rc = readFully(*io_, containerFds_[m.from / slotsPerContainer_], buf, ioBytes,
                off_t(uint64_t(m.from % slotsPerContainer_) * stride_));
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
            rc = writeFully(*io_, containerFds_[m.to / slotsPerContainer_], buf, ioBytes,
                off_t(uint64_t(m.to % slotsPerContainer_) * stride_));
            if (rc != 0)
                failure = "writing " + where(m.to) + ": " + errnoText(-rc);
        }
        if (!failure.empty())
        {
            std::lock_guard<std::mutex> lock(mu_);
            for (Move const& m : mv)
                freeSlotLocked(m.to);
            throw ResizeError(StatusCode::kIoError, "disk region " + quoted(dir_) + ": moving a page failed (" + failure + "); "
                + std::to_string(report.moved) + " pages moved before stay valid where they are and the region keeps its "
                + std::to_string(numContainers_) + " containers");
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
                    index_.erase(m.key);
                    slots_[m.from].state = kRetiring;
                    slots_[m.from].retireDurable = false;
                    ++st_.erases;
                    ++st_.checksumFailures;
                    events_.push_back("disk region " + quoted(dir_) + ": the page with key " + toHex(m.key) + " in "
                        + where(m.from) + " failed its checksum while being moved; it was retired");
                    items.push_back(CommitItem{false, newTicketLocked(), std::move(m.key), m.from, m.crc, m.tag, std::nullopt});
                    ++bad;
                }
                else
                {
                    items.push_back(CommitItem{true, newTicketLocked(), std::move(m.key), m.to, m.crc, m.tag, std::nullopt});
                    ++moved;
                }
            }
        }
        std::string const error = commit(items);
        if (!error.empty())
            throw ResizeError(StatusCode::kIoError, "disk region " + quoted(dir_) + ": recording moved pages failed (" + error + "); "
                + "every page is valid at its old or its new slot and the region keeps its "
                + std::to_string(numContainers_) + " containers");
        report.moved += moved;
        report.checksumDrops += bad;
        if (progress)
            progress(pos + n, total);
    }
}

void DiskRegion::setGeometry(uint32_t containers)
{
    uint32_t const before = numContainers_;
    uint64_t const fileBytes = stride_ * slotsPerContainer_;
    std::string const cdir = path("containers");
    auto fileOf = [&](uint32_t c) {
        char leaf[32];
        std::snprintf(leaf, sizeof(leaf), "/%04u.bin", c);
        return cdir + leaf;
    };
    auto dropAdded = [&]() {
        while (containerFds_.size() > before)
        {
            if (containerFds_.back() >= 0)
                io_->close(containerFds_.back());
            containerFds_.pop_back();
            ::unlink(fileOf(uint32_t(containerFds_.size())).c_str());
        }
        syncDir();
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
                "disk region " + quoted(dir_) + ": cannot preallocate container " + quoted(file)
                + " (" + std::to_string(fileBytes) + " bytes): " + errnoText(-rc) + "; the region keeps its "
                + std::to_string(before) + " containers");
        }
        containerFds_.push_back(dfd); // Reserved at open: never reallocates under the workers.
    }
    syncDir();

    auto apply = [&](uint32_t c) {
        std::lock_guard<std::mutex> lock(mu_);
        numContainers_ = c;
        numSlots_ = c * slotsPerContainer_;
        slots_.resize(numSlots_);
        slotKeys_.resize(numSlots_);
        std::deque<std::pair<uint64_t, uint32_t>> kept;
        for (auto const& e : fifo_)
            if (e.second < numSlots_)
                kept.push_back(e);
        fifo_.swap(kept);
        setLimitLocked(numSlots_);
        st_.slotsTotal = numSlots_;
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
        throw ResizeError(StatusCode::kIoError, "disk region " + quoted(dir_) + ": recording the new geometry failed ("
            + (snapped ? std::string(kRegionFile) + ": " + errnoText(-rc) : std::string("the snapshot could not be written"))
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
        syncDir();
    }
}

ResizeReport DiskRegion::resize(uint32_t containers, ResizeProgress const& progress, bool dropOldest, uint32_t batchPages)
{
    checkWritable("resize");
    if (containers == 0 || containers > kMaxContainers)
        throw std::invalid_argument("containers is " + std::to_string(containers) + "; valid: 1.."
            + std::to_string(kMaxContainers) + " (max_bytes / container_bytes; a region keeps at least one container)");
    if (uint64_t(containers) * slotsPerContainer_ > 0x7FFFFFFFull)
        throw std::invalid_argument("containers is " + std::to_string(containers) + ": "
            + std::to_string(uint64_t(containers) * slotsPerContainer_) + " slots; at most 2^31-1 are supported");
    if (batchPages == 0)
        throw std::invalid_argument("batch_pages is 0; it must be >= 1");
    ResizeReport report;
    report.containersBefore = numContainers_;
    beginExclusive();
    try
    {
        if (containers < numContainers_)
            relocateBelow(containers * slotsPerContainer_, progress, dropOldest, batchPages, report);
        if (containers != numContainers_)
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
    report.containersAfter = numContainers_;
    return report;
}

ResizeReport DiskRegion::defragment(ResizeProgress const& progress, uint32_t batchPages)
{
    checkWritable("defragment");
    if (batchPages == 0)
        throw std::invalid_argument("batch_pages is 0; it must be >= 1");
    ResizeReport report;
    report.containersBefore = report.containersAfter = numContainers_;
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
        cursor_ = 0; // New pages fill the first free slots after the compacted prefix.
    }
    endExclusive();
    return report;
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

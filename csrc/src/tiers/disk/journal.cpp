// SPDX-License-Identifier: Apache-2.0
#include "tiers/disk/journal.h"

#include <cstdio>
#include <cstring>

#include "kvcodec/crc32c.h"

namespace kvcodec::disk {
namespace {

char const kHexDigits[] = "0123456789abcdef";

int hexValue(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

std::string hex32(uint32_t v)
{
    char buf[9];
    for (int i = 7; i >= 0; --i)
    {
        buf[i] = kHexDigits[v & 0xF];
        v >>= 4;
    }
    buf[8] = 0;
    return buf;
}

/// A cursor over a line that consumes exact literals and numbers; parsing fails on the first
/// surprise, which is what a checksummed machine-written format wants.
struct Cursor
{
    std::string_view s;
    size_t i = 0;

    bool lit(std::string_view t)
    {
        if (s.substr(i, t.size()) != t)
            return false;
        i += t.size();
        return true;
    }

    bool u64(uint64_t& v)
    {
        size_t start = i;
        v = 0;
        while (i < s.size() && s[i] >= '0' && s[i] <= '9')
        {
            if (i - start >= 19)
                return false;
            v = v * 10 + uint64_t(s[i] - '0');
            ++i;
        }
        return i > start;
    }

    bool u32(uint32_t& v)
    {
        uint64_t w;
        if (!u64(w) || w > 0xFFFFFFFFull)
            return false;
        v = uint32_t(w);
        return true;
    }

    bool hexWord(uint32_t& v)
    {
        if (i + 8 > s.size())
            return false;
        v = 0;
        for (int k = 0; k < 8; ++k)
        {
            int h = hexValue(s[i + k]);
            if (h < 0)
                return false;
            v = (v << 4) | uint32_t(h);
        }
        i += 8;
        return true;
    }

    bool hexUntil(char end, std::string& out)
    {
        size_t j = s.find(end, i);
        if (j == std::string_view::npos)
            return false;
        if (!fromHex(s.substr(i, j - i), out))
            return false;
        i = j;
        return true;
    }
};

} // namespace

std::string toHex32(uint32_t v)
{
    return hex32(v);
}

namespace {
/// Whether `text` (ending with a newline) is whole records numbered from `firstSeq`.
bool wholeRecords(std::string_view text, uint32_t slotsPerContainer, uint32_t numSlots, uint64_t firstSeq,
    std::vector<JournalRecord>& out)
{
    out.clear();
    std::string why;
    size_t pos = 0;
    while (pos < text.size())
    {
        size_t const end = text.find('\n', pos);
        JournalRecord r;
        if (!parseRecord(text.substr(pos, end - pos), slotsPerContainer, numSlots, r, why)
            || r.seq != firstSeq + out.size())
            return false;
        out.push_back(std::move(r));
        pos = end + 1;
    }
    return !out.empty();
}
} // namespace

bool repairRecords(std::string_view text, uint32_t slotsPerContainer, uint32_t numSlots, uint64_t firstSeq,
    std::vector<JournalRecord>& out)
{
    if (text.empty() || text.size() > kMaxRepairBytes)
        return false;
    std::string buf(text);
    std::vector<JournalRecord> found, candidate;
    int matches = 0;
    for (size_t i = 0; i < buf.size(); ++i)
    {
        for (int bit = 0; bit < 8; ++bit)
        {
            buf[i] = char(buf[i] ^ (1 << bit));
            if (buf.back() == '\n' && wholeRecords(buf, slotsPerContainer, numSlots, firstSeq, candidate))
            {
                if (++matches > 1)
                    return false; // ambiguous: not a single flipped bit
                found.swap(candidate);
            }
            buf[i] = char(buf[i] ^ (1 << bit));
        }
    }
    if (matches != 1)
        return false;
    out = std::move(found);
    return true;
}

std::string toHex(std::string_view bytes)
{
    std::string out(bytes.size() * 2, '0');
    for (size_t i = 0; i < bytes.size(); ++i)
    {
        auto b = static_cast<unsigned char>(bytes[i]);
        out[2 * i] = kHexDigits[b >> 4];
        out[2 * i + 1] = kHexDigits[b & 0xF];
    }
    return out;
}

bool fromHex(std::string_view hex, std::string& out)
{
    if (hex.size() % 2 != 0)
        return false;
    out.resize(hex.size() / 2);
    for (size_t i = 0; i < out.size(); ++i)
    {
        int hi = hexValue(hex[2 * i]);
        int lo = hexValue(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out[i] = char((hi << 4) | lo);
    }
    return true;
}

std::string formatRecord(JournalRecord const& r, uint32_t slotsPerContainer)
{
    std::string line;
    line.reserve(160 + 2 * r.key.size());
    line += "{\"seq\":";
    line += std::to_string(r.seq);
    line += r.put ? ",\"op\":\"put\",\"key\":\"" : ",\"op\":\"del\",\"key\":\"";
    line += toHex(r.key);
    line += "\",\"container\":";
    line += std::to_string(r.slot / slotsPerContainer);
    line += ",\"slot\":";
    line += std::to_string(r.slot % slotsPerContainer);
    if (r.put)
    {
        line += ",\"tag\":";
        line += std::to_string(r.tag);
        line += ",\"crc\":\"";
        line += hex32(r.crc);
        line += "\"";
    }
    // The line checksum covers everything before it, so a torn or bit-flipped line is rejected.
    uint32_t lcrc = crc32cFast(line.data(), line.size());
    line += ",\"lcrc\":\"";
    line += hex32(lcrc);
    line += "\"}\n";
    return line;
}

bool parseRecord(
    std::string_view line, uint32_t slotsPerContainer, uint32_t numSlots, JournalRecord& out, std::string& why)
{
    size_t lpos = line.rfind(",\"lcrc\":\"");
    if (lpos == std::string_view::npos)
    {
        why = "no line checksum";
        return false;
    }
    Cursor tail{line, lpos + 9};
    uint32_t lcrc = 0;
    if (!tail.hexWord(lcrc) || !tail.lit("\"}") || tail.i != line.size())
    {
        why = "malformed line checksum";
        return false;
    }
    if (crc32cFast(line.data(), lpos) != lcrc)
    {
        why = "line checksum mismatch";
        return false;
    }
    Cursor c{line.substr(0, lpos)};
    uint32_t container = 0, slot = 0;
    bool ok = c.lit("{\"seq\":") && c.u64(out.seq);
    if (ok && c.lit(",\"op\":\"put\",\"key\":\""))
        out.put = true;
    else if (ok && c.lit(",\"op\":\"del\",\"key\":\""))
        out.put = false;
    else
        ok = false;
    ok = ok && c.hexUntil('"', out.key) && c.lit("\",\"container\":") && c.u32(container) && c.lit(",\"slot\":")
        && c.u32(slot);
    out.tag = 0;
    out.crc = 0;
    if (ok && out.put)
    {
        ok = c.lit(",\"tag\":") && c.u32(out.tag) && c.lit(",\"crc\":\"") && c.hexWord(out.crc) && c.lit("\"");
    }
    if (!ok || c.i != c.s.size() || out.key.empty())
    {
        why = "malformed record";
        return false;
    }
    if (slot >= slotsPerContainer || uint64_t(container) * slotsPerContainer + slot >= numSlots)
    {
        why = "container " + std::to_string(container) + " slot " + std::to_string(slot) + " is outside the region";
        return false;
    }
    out.slot = container * slotsPerContainer + slot;
    return true;
}

std::string formatSnapshot(std::string const& identityLine, uint64_t seq, std::vector<SnapshotEntry> const& entries,
    uint32_t slotsPerContainer)
{
    std::string out;
    out.reserve(256 + entries.size() * 72);
    out += "{\"kvcodec_disk_snapshot\":1,\"seq\":";
    out += std::to_string(seq);
    out += ",\"entries\":";
    out += std::to_string(entries.size());
    out += ",\"identity\":";
    out += jsonQuote(identityLine);
    out += "}\n";
    size_t bodyStart = out.size();
    char num[64];
    for (auto const& e : entries)
    {
        out += toHex(e.key);
        int n = std::snprintf(num, sizeof(num), " %u %u %u %08x %llu\n", e.slot / slotsPerContainer,
            e.slot % slotsPerContainer, e.tag, e.crc, static_cast<unsigned long long>(e.seq));
        out.append(num, size_t(n));
    }
    uint32_t bodyCrc = crc32cFast(out.data() + bodyStart, out.size() - bodyStart);
    out += "{\"end\":";
    out += std::to_string(entries.size());
    out += ",\"crc\":\"";
    out += hex32(bodyCrc);
    out += "\"}\n";
    return out;
}

bool checkSnapshot(std::string_view text, std::string const& identityLine, SnapshotView& out, std::string& why)
{
    size_t nl = text.find('\n');
    if (nl == std::string_view::npos)
    {
        why = "no header line";
        return false;
    }
    Cursor h{text.substr(0, nl)};
    uint64_t count = 0, seq = 0;
    std::string expectedIdentity = ",\"identity\":" + jsonQuote(identityLine) + "}";
    if (!(h.lit("{\"kvcodec_disk_snapshot\":1,\"seq\":") && h.u64(seq) && h.lit(",\"entries\":") && h.u64(count)))
    {
        why = "malformed header line";
        return false;
    }
    if (!h.lit(expectedIdentity) || h.i != h.s.size())
    {
        why = "written for another region identity";
        return false;
    }
    // The trailer is the last line; everything between header and trailer is the body.
    if (text.size() < 2 || text.back() != '\n')
    {
        why = "truncated (no final newline)";
        return false;
    }
    size_t trailerStart = text.rfind('\n', text.size() - 2);
    if (trailerStart == std::string_view::npos || trailerStart < nl)
    {
        why = "no trailer line";
        return false;
    }
    ++trailerStart;
    std::string_view body = text.substr(nl + 1, trailerStart - (nl + 1));
    Cursor t{text.substr(trailerStart, text.size() - 1 - trailerStart)};
    uint64_t endCount = 0;
    uint32_t bodyCrc = 0;
    if (!(t.lit("{\"end\":") && t.u64(endCount) && t.lit(",\"crc\":\"") && t.hexWord(bodyCrc) && t.lit("\"}")
            && t.i == t.s.size()))
    {
        why = "malformed or missing trailer (truncated?)";
        return false;
    }
    if (endCount != count)
    {
        why = "trailer count " + std::to_string(endCount) + " differs from header count " + std::to_string(count);
        return false;
    }
    if (crc32cFast(body.data(), body.size()) != bodyCrc)
    {
        why = "body checksum mismatch";
        return false;
    }
    out.seq = seq;
    out.count = count;
    out.body = body;
    return true;
}

namespace {

// Hex digit values (0xFF: not a digit), so the per-entry key decoding is one load per digit.
struct HexTable
{
    uint8_t v[256];
    constexpr HexTable()
        : v{}
    {
        for (int i = 0; i < 256; ++i)
            v[i] = 0xFF;
        for (int i = 0; i < 10; ++i)
            v['0' + i] = uint8_t(i);
        for (int i = 0; i < 6; ++i)
        {
            v['a' + i] = uint8_t(10 + i);
            v['A' + i] = uint8_t(10 + i);
        }
    }
};
constexpr HexTable kHex;

// Decimal field followed by `sep` (or the end of the line when sep is 0), as Cursor::u64 accepts it.
inline bool decField(char const*& p, char const* end, char sep, uint64_t& v)
{
    char const* start = p;
    v = 0;
    while (p < end && unsigned(*p - '0') < 10)
    {
        if (p - start >= 19)
            return false;
        v = v * 10 + uint64_t(*p - '0');
        ++p;
    }
    if (p == start)
        return false;
    if (sep == 0)
        return p == end;
    if (p == end || *p != sep)
        return false;
    ++p;
    return true;
}

} // namespace

char const* parseSnapshotLine(
    std::string_view line, uint32_t slotsPerContainer, uint32_t numSlots, char* keyBuf, SnapshotEntryView& out)
{
    // "<key hex> <container> <slot> <tag> <crc: 8 hex> <seq>"
    char const* p = line.data();
    char const* const end = p + line.size();
    char const* sp = static_cast<char const*>(std::memchr(p, ' ', line.size()));
    if (sp == nullptr)
        return "is malformed (no key)";
    size_t hexLen = size_t(sp - p);
    if (hexLen == 0 || hexLen % 2 != 0 || hexLen / 2 > kMaxKeyBytes)
        return "is malformed (key length)";
    for (size_t i = 0; i < hexLen / 2; ++i)
    {
        uint8_t hi = kHex.v[uint8_t(p[2 * i])];
        uint8_t lo = kHex.v[uint8_t(p[2 * i + 1])];
        if ((hi | lo) & 0xF0)
            return "is malformed (key is not hex)";
        keyBuf[i] = char((hi << 4) | lo);
    }
    p = sp + 1;
    uint64_t container = 0, slot = 0, tag = 0, seq = 0;
    if (!decField(p, end, ' ', container) || !decField(p, end, ' ', slot) || !decField(p, end, ' ', tag))
        return "is malformed (numbers)";
    if (container > 0xFFFFFFFFull || slot > 0xFFFFFFFFull || tag > 0xFFFFFFFFull)
        return "is malformed (number out of range)";
    if (end - p < 9 || p[8] != ' ')
        return "is malformed (crc)";
    uint32_t crc = 0;
    for (int k = 0; k < 8; ++k)
    {
        uint8_t h = kHex.v[uint8_t(p[k])];
        if (h & 0xF0)
            return "is malformed (crc)";
        crc = (crc << 4) | h;
    }
    p += 9;
    if (!decField(p, end, 0, seq))
        return "is malformed (seq)";
    if (slot >= slotsPerContainer || container * slotsPerContainer + slot >= numSlots)
        return "lies outside the region";
    out.key = std::string_view(keyBuf, hexLen / 2);
    out.slot = uint32_t(container * slotsPerContainer + slot);
    out.crc = crc;
    out.tag = uint32_t(tag);
    out.seq = seq;
    return nullptr;
}

bool parseSnapshot(std::string_view text, std::string const& identityLine, uint32_t slotsPerContainer,
    uint32_t numSlots, uint64_t& seq, std::vector<SnapshotEntry>& entries, std::string& why)
{
    SnapshotView snap;
    if (!checkSnapshot(text, identityLine, snap, why))
        return false;
    seq = snap.seq;
    entries.clear();
    entries.reserve(snap.count);
    return forEachSnapshotEntry(
        snap, slotsPerContainer, numSlots,
        [&](SnapshotEntryView const& e) {
            entries.push_back(SnapshotEntry{std::string(e.key), e.slot, e.crc, e.tag, e.seq});
        },
        why);
}

std::string jsonQuote(std::string_view s)
{
    std::string out = "\"";
    for (char ch : s)
    {
        auto c = static_cast<unsigned char>(ch);
        if (c == '"' || c == '\\')
        {
            out += '\\';
            out += ch;
        }
        else if (c == '\n')
            out += "\\n";
        else if (c < 0x20)
        {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
        }
        else
            out += ch;
    }
    out += '"';
    return out;
}

std::string formatFlatJson(FlatJson const& obj, std::vector<std::string> const& numeric)
{
    std::string out = "{\n";
    bool first = true;
    for (auto const& [k, v] : obj)
    {
        if (!first)
            out += ",\n";
        first = false;
        out += "  " + jsonQuote(k) + ": ";
        bool isNumber = false;
        for (auto const& n : numeric)
            isNumber = isNumber || n == k;
        out += isNumber ? v : jsonQuote(v);
    }
    out += "\n}\n";
    return out;
}

bool parseFlatJson(std::string_view text, FlatJson& out, std::string& why)
{
    size_t i = 0;
    auto ws = [&] {
        while (i < text.size() && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r'))
            ++i;
    };
    auto str = [&](std::string& v) -> bool {
        if (i >= text.size() || text[i] != '"')
            return false;
        ++i;
        v.clear();
        while (i < text.size() && text[i] != '"')
        {
            char c = text[i++];
            if (c == '\\')
            {
                if (i >= text.size())
                    return false;
                char e = text[i++];
                if (e == 'n')
                    v += '\n';
                else if (e == 't')
                    v += '\t';
                else if (e == 'u')
                {
                    if (i + 4 > text.size())
                        return false;
                    unsigned code = 0;
                    for (int k = 0; k < 4; ++k)
                    {
                        int h = hexValue(text[i + k]);
                        if (h < 0)
                            return false;
                        code = code * 16 + unsigned(h);
                    }
                    i += 4;
                    if (code >= 0x80)
                        return false; // region.json is written ASCII-only
                    v += char(code);
                }
                else
                    v += e;
            }
            else
                v += c;
        }
        if (i >= text.size())
            return false;
        ++i;
        return true;
    };
    out.clear();
    ws();
    if (i >= text.size() || text[i] != '{')
    {
        why = "not a JSON object";
        return false;
    }
    ++i;
    // Only whitespace may follow the object: anything else is damage, not content to ignore.
    auto end = [&]() -> bool {
        ++i;
        ws();
        if (i == text.size())
            return true;
        why = "unexpected bytes after the object at byte " + std::to_string(i);
        return false;
    };
    ws();
    if (i < text.size() && text[i] == '}')
        return end();
    for (;;)
    {
        std::string key, value;
        ws();
        if (!str(key))
        {
            why = "expected a string key at byte " + std::to_string(i);
            return false;
        }
        ws();
        if (i >= text.size() || text[i] != ':')
        {
            why = "expected ':' at byte " + std::to_string(i);
            return false;
        }
        ++i;
        ws();
        if (i < text.size() && text[i] == '"')
        {
            if (!str(value))
            {
                why = "bad string value for " + key;
                return false;
            }
        }
        else
        {
            size_t start = i;
            while (i < text.size() && ((text[i] >= '0' && text[i] <= '9') || text[i] == '-'))
                ++i;
            if (i == start)
            {
                why = "value of " + key + " is neither a string nor an integer";
                return false;
            }
            value = std::string(text.substr(start, i - start));
        }
        out[key] = value;
        ws();
        if (i < text.size() && text[i] == ',')
        {
            ++i;
            continue;
        }
        if (i < text.size() && text[i] == '}')
            return end();
        why = "expected ',' or '}' at byte " + std::to_string(i);
        return false;
    }
}

} // namespace kvcodec::disk

// SPDX-License-Identifier: Apache-2.0
#include "lz4_block.h"

#include <cstring>
#include <vector>

namespace kvcodec::nvcomp_plugin::lz4 {
namespace {

constexpr size_t kMinMatch = 4;
constexpr size_t kLastLiterals = 5; // The block ends with at least this many literals.
constexpr size_t kMatchStartLimit = 12; // A match starts at least this far before the end.
constexpr size_t kMaxOffset = 65535;
constexpr int kHashLog = 14;

uint32_t read32(uint8_t const* p) noexcept
{
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

uint32_t hash4(uint32_t v) noexcept
{
    return (v * 2654435761u) >> (32 - kHashLog);
}

class Writer
{
public:
    Writer(uint8_t* dst, size_t cap) noexcept : dst_(dst), cap_(cap) {}

    bool byte(unsigned v) noexcept
    {
        if (pos_ >= cap_) return false;
        dst_[pos_++] = static_cast<uint8_t>(v);
        return true;
    }

    bool bytes(uint8_t const* p, size_t n) noexcept
    {
        if (n > cap_ - pos_) return false;
        std::memcpy(dst_ + pos_, p, n);
        pos_ += n;
        return true;
    }

    // Length continuation bytes after a token nibble of 15.
    bool length(size_t rest) noexcept
    {
        for (; rest >= 255; rest -= 255)
        {
            if (!byte(255)) return false;
        }
        return byte(unsigned(rest));
    }

    [[nodiscard]] size_t size() const noexcept { return pos_; }

private:
    uint8_t* dst_;
    size_t cap_;
    size_t pos_ = 0;
};

bool sequence(Writer& w, uint8_t const* lit, size_t litLen, size_t offset, size_t matchLen) noexcept
{
    unsigned const litNibble = litLen >= 15 ? 15u : unsigned(litLen);
    size_t const m = matchLen - kMinMatch;
    unsigned const matchNibble = matchLen == 0 ? 0u : (m >= 15 ? 15u : unsigned(m));
    if (!w.byte((litNibble << 4) | matchNibble)) return false;
    if (litNibble == 15 && !w.length(litLen - 15)) return false;
    if (!w.bytes(lit, litLen)) return false;
    if (matchLen == 0) return true; // The last sequence: literals only.
    if (!w.byte(offset & 0xff) || !w.byte(offset >> 8)) return false;
    return matchNibble != 15 || w.length(m - 15);
}

} // namespace

size_t compress(uint8_t const* src, size_t n, uint8_t* dst, size_t cap) noexcept
{
    Writer w(dst, cap);
    size_t anchor = 0;
    if (n > kMatchStartLimit)
    {
        // Positions + 1; 0 marks an empty slot.
        thread_local std::vector<uint32_t> table;
        table.assign(size_t(1) << kHashLog, 0);
        size_t const matchStartEnd = n - kMatchStartLimit;
        size_t const matchEnd = n - kLastLiterals;
        size_t i = 0;
        while (i < matchStartEnd)
        {
            uint32_t const h = hash4(read32(src + i));
            size_t const cand = table[h];
            table[h] = uint32_t(i + 1);
            if (cand == 0 || i - (cand - 1) > kMaxOffset || read32(src + cand - 1) != read32(src + i))
            {
                ++i;
                continue;
            }
            size_t m = cand - 1;
            size_t start = i;
            while (start > anchor && m > 0 && src[start - 1] == src[m - 1])
            {
                --start;
                --m;
            }
            size_t len = (i - start) + kMinMatch;
            while (start + len < matchEnd && src[start + len] == src[m + len])
            {
                ++len;
            }
            if (!sequence(w, src + anchor, start - anchor, start - m, len)) return 0;
            i = start + len;
            anchor = i;
        }
    }
    if (!sequence(w, src + anchor, n - anchor, 0, 0)) return 0;
    return w.size();
}

int64_t decompress(uint8_t const* src, size_t n, uint8_t* dst, size_t cap) noexcept
{
    size_t ip = 0;
    size_t op = 0;
    while (true)
    {
        if (ip >= n) return -1;
        unsigned const token = src[ip++];
        size_t lit = token >> 4;
        if (lit == 15)
        {
            unsigned b;
            do
            {
                if (ip >= n) return -1;
                b = src[ip++];
                lit += b;
            } while (b == 255);
        }
        if (lit > n - ip || lit > cap - op) return -1;
        std::memcpy(dst + op, src + ip, lit);
        ip += lit;
        op += lit;
        if (ip == n) return int64_t(op); // A block ends right after a literal run.
        if (n - ip < 2) return -1;
        size_t const offset = size_t(src[ip]) | (size_t(src[ip + 1]) << 8);
        ip += 2;
        if (offset == 0 || offset > op) return -1;
        size_t len = (token & 15u) + kMinMatch;
        if ((token & 15u) == 15)
        {
            unsigned b;
            do
            {
                if (ip >= n) return -1;
                b = src[ip++];
                len += b;
            } while (b == 255);
        }
        if (len > cap - op) return -1;
        for (size_t k = 0; k < len; ++k, ++op) // Overlapping copies repeat the pattern.
        {
            dst[op] = dst[op - offset];
        }
    }
}

} // namespace kvcodec::nvcomp_plugin::lz4

// SPDX-License-Identifier: Apache-2.0
//
// The daemon's key -> slot map of one region: open addressing with linear probing in entries of
// one cache line that hold the key's hash and slot and, for keys of up to 50 bytes, the key itself,
// so a lookup on cold caches usually costs one line (a node-based map costs a bucket, the node
// before the match, the node and the key's bytes). Sized once for the region's slots (a region
// never holds more keys than slots), so it never grows. Not thread-safe: the server serialises.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace kvcodec::daemon {

class KeyTable
{
public:
    static constexpr uint32_t kNone = ~0u;

    /// Room for `maxKeys` keys at a load of at most 0.8.
    void reset(size_t maxKeys)
    {
        size_t capacity = 16;
        while (capacity < maxKeys + maxKeys / 4 + 1)
            capacity <<= 1;
        entries_.assign(capacity, Entry{});
        mask_ = capacity - 1;
        size_ = 0;
    }

    [[nodiscard]] size_t size() const noexcept
    {
        return size_;
    }

    /// The slot of `key`, or kNone. `keyOf[slot]` is the key of each slot (read for long keys).
    [[nodiscard]] uint32_t find(std::string_view key, std::vector<std::string> const& keyOf) const noexcept
    {
        size_t const i = indexOf(key, keyOf);
        return i == kAbsent ? kNone : entries_[i].slot;
    }

    /// Adds `key` -> `slot`; the key must be absent and fewer than reset()'s keys present.
    void insert(std::string_view key, uint32_t slot) noexcept
    {
        uint64_t const h = hashOf(key);
        size_t i = h & mask_;
        while (entries_[i].slot != kNone)
            i = (i + 1) & mask_;
        Entry& e = entries_[i];
        e.hash = h;
        e.slot = slot;
        e.length = key.size() <= kInline ? uint16_t(key.size()) : kLong;
        if (key.size() <= kInline)
            std::memcpy(e.key, key.data(), key.size());
        ++size_;
    }

    /// Removes `key`; false when it is absent. Later entries of its probe run move back into the
    /// hole (no tombstones), so lookups never slow down with churn.
    bool erase(std::string_view key, std::vector<std::string> const& keyOf) noexcept
    {
        size_t hole = indexOf(key, keyOf);
        if (hole == kAbsent)
            return false;
        for (size_t j = (hole + 1) & mask_; entries_[j].slot != kNone; j = (j + 1) & mask_)
        {
            size_t const home = entries_[j].hash & mask_;
            // The entry at j may fill the hole unless its home lies cyclically in (hole, j].
            bool const stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
            if (!stays)
            {
                entries_[hole] = entries_[j];
                hole = j;
            }
        }
        entries_[hole] = Entry{};
        --size_;
        return true;
    }

private:
    static constexpr size_t kInline = 50;
    static constexpr uint16_t kLong = 0xffff;
    static constexpr size_t kAbsent = ~size_t(0);

    struct alignas(64) Entry
    {
        uint64_t hash = 0;
        uint32_t slot = kNone;
        uint16_t length = 0; // kLong: the key is keyOf[slot]
        char key[kInline] = {};
    };
    static_assert(sizeof(Entry) == 64);

    static uint64_t hashOf(std::string_view key) noexcept
    {
        return std::hash<std::string_view>{}(key);
    }

    [[nodiscard]] size_t indexOf(std::string_view key, std::vector<std::string> const& keyOf) const noexcept
    {
        uint64_t const h = hashOf(key);
        for (size_t i = h & mask_;; i = (i + 1) & mask_)
        {
            Entry const& e = entries_[i];
            if (e.slot == kNone)
                return kAbsent;
            if (e.hash != h)
                continue;
            bool const same = e.length == kLong
                ? key.size() > kInline && keyOf[e.slot] == key
                : e.length == key.size() && std::memcmp(e.key, key.data(), key.size()) == 0;
            if (same)
                return i;
        }
    }

    std::vector<Entry> entries_;
    size_t mask_ = 0;
    size_t size_ = 0;
};

} // namespace kvcodec::daemon

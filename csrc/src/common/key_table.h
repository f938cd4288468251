// SPDX-License-Identifier: Apache-2.0
//
// A key -> slot map over a flat array: open addressing with linear probing, and an erase that
// shifts the later entries of its run back into the hole, so churn leaves no tombstones and
// lookups never slow down with it. No node per key: inserting a million keys allocates nothing,
// and a lookup on cold caches reads one entry (plus the key, where the entry does not hold it).
//
// Every key names one slot, and `keyOf[slot]` is that slot's key (a vector the owner keeps), so
// an entry may hold the key itself (InlineKeyEntry: one cache line per key, no read of keyOf for
// keys of up to 50 bytes) or only a tag of its hash (TagEntry: 8 bytes per entry, the key read
// from keyOf on a tag match). A key's home is its hash's low 32 bits masked to the table's size,
// which an entry can tell again when an erase shifts it. Not thread-safe: the owner serialises.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace kvcodec {

using KeysOfSlots = std::vector<std::string>;

/// One cache line: the key's hash, its slot and, for keys of up to 50 bytes, the key itself.
struct alignas(64) InlineKeyEntry
{
    static constexpr uint32_t kNone = ~0u;
    uint64_t hash = 0;
    uint32_t slot = kNone;
    uint16_t length = 0; // kLong: the key is keyOf[slot]
    char key[50] = {};

    [[nodiscard]] size_t home(size_t mask) const noexcept
    {
        return size_t(uint32_t(hash)) & mask;
    }
    [[nodiscard]] bool matches(std::string_view k, uint64_t h, KeysOfSlots const& keyOf) const noexcept
    {
        if (hash != h)
            return false;
        return length == kLong ? k.size() > sizeof key && slot < keyOf.size() && keyOf[slot] == k
                               : length == k.size() && std::memcmp(key, k.data(), k.size()) == 0;
    }
    void set(std::string_view k, uint64_t h, uint32_t s) noexcept
    {
        hash = h;
        slot = s;
        length = k.size() <= sizeof key ? uint16_t(k.size()) : kLong;
        if (k.size() <= sizeof key)
            std::memcpy(key, k.data(), k.size());
    }

private:
    static constexpr uint16_t kLong = 0xffff;
};
static_assert(sizeof(InlineKeyEntry) == 64);

/// Eight bytes: the slot and the hash's low 32 bits (its home and a tag); the key is keyOf[slot].
struct TagEntry
{
    static constexpr uint32_t kNone = ~0u;
    uint32_t slot = kNone;
    uint32_t tag = 0;

    [[nodiscard]] size_t home(size_t mask) const noexcept
    {
        return size_t(tag) & mask;
    }
    [[nodiscard]] bool matches(std::string_view k, uint64_t h, KeysOfSlots const& keyOf) const noexcept
    {
        return tag == uint32_t(h) && slot < keyOf.size() && keyOf[slot] == k;
    }
    void set(std::string_view, uint64_t h, uint32_t s) noexcept
    {
        slot = s;
        tag = uint32_t(h);
    }
};
static_assert(sizeof(TagEntry) == 8);

template <class Entry>
class KeyTable
{
public:
    static constexpr uint32_t kNone = Entry::kNone;

    /// Empty, with room for `maxKeys` keys at a load of at most 0.8.
    void reset(size_t maxKeys)
    {
        entries_.assign(capacityFor(maxKeys), Entry{});
        mask_ = entries_.size() - 1;
        size_ = 0;
    }

    /// Room for `maxKeys` keys at a load of at most 0.8, keeping every entry.
    void reserve(size_t maxKeys)
    {
        size_t const capacity = capacityFor(maxKeys);
        if (capacity <= entries_.size())
            return;
        std::vector<Entry> old(capacity, Entry{});
        old.swap(entries_);
        mask_ = capacity - 1;
        for (Entry const& e : old)
        {
            if (e.slot == kNone)
                continue;
            size_t i = e.home(mask_);
            while (entries_[i].slot != kNone)
                i = (i + 1) & mask_;
            entries_[i] = e;
        }
    }

    /// Every key removed (the room stays).
    void clear()
    {
        std::fill(entries_.begin(), entries_.end(), Entry{});
        size_ = 0;
    }

    [[nodiscard]] size_t size() const noexcept
    {
        return size_;
    }

    /// The slot of `key`, or kNone.
    [[nodiscard]] uint32_t find(std::string_view key, KeysOfSlots const& keyOf) const noexcept
    {
        return find(key, hashOf(key), keyOf);
    }
    /// The same, given the key's hashOf().
    [[nodiscard]] uint32_t find(std::string_view key, uint64_t h, KeysOfSlots const& keyOf) const noexcept
    {
        size_t const i = indexOf(key, h, keyOf);
        return i == kAbsent ? kNone : entries_[i].slot;
    }

    /// Starts loading the entry where a lookup of a key of hash `h` begins (a batch of lookups on
    /// cold caches then waits for many entries at once instead of one after another).
    void prefetch(uint64_t h) const noexcept
    {
        if (!entries_.empty())
            __builtin_prefetch(&entries_[homeOf(h)]);
    }

    static uint64_t hashOf(std::string_view key) noexcept
    {
        return std::hash<std::string_view>{}(key);
    }

    /// Adds `key` -> `slot`; the key must be absent. Grows when the table would pass 0.8 full.
    void insert(std::string_view key, uint32_t slot)
    {
        growFor(size_ + 1);
        uint64_t const h = hashOf(key);
        size_t i = homeOf(h);
        while (entries_[i].slot != kNone)
            i = (i + 1) & mask_;
        entries_[i].set(key, h, slot);
        ++size_;
    }

    /// Maps `key` to `slot`, whether it was there or not; returns the slot it named before, or
    /// kNone when it is new. (keyOf of the old slot is read to find it: set keyOf[slot] after.)
    uint32_t put(std::string_view key, uint32_t slot, KeysOfSlots const& keyOf)
    {
        uint64_t const h = hashOf(key);
        size_t const i = indexOf(key, h, keyOf);
        if (i != kAbsent)
        {
            uint32_t const old = entries_[i].slot;
            entries_[i].set(key, h, slot);
            return old;
        }
        insert(key, slot);
        return kNone;
    }

    /// Removes `key` (only while it names slot `only`, unless that is kNone); returns the slot it
    /// named, or kNone when nothing was removed. Later entries of its probe run move back into the
    /// hole (no tombstones).
    uint32_t erase(std::string_view key, KeysOfSlots const& keyOf, uint32_t only = kNone) noexcept
    {
        size_t hole = indexOf(key, hashOf(key), keyOf);
        if (hole == kAbsent || (only != kNone && entries_[hole].slot != only))
            return kNone;
        uint32_t const slot = entries_[hole].slot;
        for (size_t j = (hole + 1) & mask_; entries_[j].slot != kNone; j = (j + 1) & mask_)
        {
            size_t const home = entries_[j].home(mask_);
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
        return slot;
    }

private:
    static constexpr size_t kAbsent = ~size_t(0);

    /// Where the probe run of a key of hash `h` starts (Entry::home() of its entry).
    [[nodiscard]] size_t homeOf(uint64_t h) const noexcept
    {
        return size_t(uint32_t(h)) & mask_;
    }

    static size_t capacityFor(size_t maxKeys) noexcept
    {
        size_t capacity = 16;
        while (capacity < maxKeys + maxKeys / 4 + 1)
            capacity <<= 1;
        return capacity;
    }

    void growFor(size_t keys)
    {
        if (entries_.empty() || keys + keys / 4 >= entries_.size())
            reserve(std::max(keys, entries_.size()));
    }

    [[nodiscard]] size_t indexOf(std::string_view key, uint64_t h, KeysOfSlots const& keyOf) const noexcept
    {
        if (entries_.empty())
            return kAbsent;
        for (size_t i = homeOf(h);; i = (i + 1) & mask_)
        {
            Entry const& e = entries_[i];
            if (e.slot == kNone)
                return kAbsent;
            if (e.matches(key, h, keyOf))
                return i;
        }
    }

    std::vector<Entry> entries_;
    size_t mask_ = 0;
    size_t size_ = 0;
};

} // namespace kvcodec

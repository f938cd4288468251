// SPDX-License-Identifier: Apache-2.0
//
// The daemon's L2 index: regions, slots, leases, pins and LRU eviction (no I/O).
//
// Every slot is in one state: free; leased (a client writes it; its header's version is odd);
// stored (a key names it; its version is even); or retired (replaced or evicted while pinned:
// freed at its last unpin). A stored slot that some client pinned (a `get` hit not yet released)
// is never evicted nor reused, so a reader's reference stays valid until it releases it; the
// version in the header is the reader's proof of that. Not thread-safe: the server serialises.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/key_table.h"
#include "daemon/arena.h"

namespace kvcodec::daemon {

struct Counters
{
    uint64_t sets = 0, setBytes = 0, gets = 0, hits = 0, misses = 0, hitBytes = 0, evictions = 0, ephemeral = 0,
             leases = 0, aborted = 0, reclaimedPins = 0, reclaimedLeases = 0, erased = 0;
};

/// One region's answer to a key of `get`.
struct Found
{
    uint32_t slot = kMissSlot;
    uint32_t length = 0;
    uint32_t crc = 0;
    uint64_t version = 0;
    static constexpr uint32_t kMissSlot = ~0u;
};

/// True when a slot's header still shows what a `get` answered (`f`) for the key whose digest is
/// `key`: the slot was not reused nor its key replaced since.
inline bool headerShows(SlotHeader const& h, RegionLayout const& r, Found const& f, KeyDigest const& key) noexcept
{
    return h.version == f.version && h.length == f.length && h.crc == f.crc && h.region == r.region && h.key == key;
}

/// Commit statuses.
enum CommitStatus : uint8_t
{
    kStored = 0,
    kNotLeased = 1,
    kBadLength = 2,
};

class L2Index
{
public:
    explicit L2Index(std::shared_ptr<Mapping> arena)
        : arena_(std::move(arena))
    {
    }

    /// The region of (identity, page bytes), created with up to `slots` slots (what is left of the
    /// arena, at least one) the first time it is asked for. With `pageBytes` and `slots` both 0,
    /// finds the identity's region of the lowest page size without creating one. A `packed` new
    /// region puts its slots `pageBytes` apart (else 4 KiB-aligned). Throws std::invalid_argument.
    RegionLayout const& region(std::string_view identity, uint64_t pageBytes, uint32_t slots, bool packed = false);

    /// Up to `count` slots for `client` to write, evicting least recently used stored slots that
    /// nobody pinned; their versions (odd) go to `versions`.
    std::vector<uint32_t> lease(uint32_t client, uint32_t region, uint32_t count, std::vector<uint64_t>& versions);
    /// Stores a leased slot under its key; with `pin`, the slot stays pinned for `client` (as after
    /// a get of the key) instead of joining the LRU. Unless `counted`, not a client's set (a page
    /// read back from the long tier).
    CommitStatus commit(uint32_t client, uint32_t region, uint32_t slot, std::string_view key, uint32_t length,
        uint32_t crc, bool ephemeral, bool pin = false, bool counted = true);
    /// True when `key` is stored in the region (no pin, no count).
    [[nodiscard]] bool contains(uint32_t region, std::string_view key);
    /// Frees a slot leased to `client` that it will not commit (others are ignored).
    void abort(uint32_t client, uint32_t region, uint32_t slot);
    /// Where each key is stored (its slot pinned for `client`), or a miss, into `out` (one per
    /// key); the keys' table entries are loaded ahead, so misses on cold caches overlap.
    void getMany(uint32_t client, uint32_t region, std::vector<std::string_view> const& keys, Found* out);
    /// Removes `key` from the region (its slot freed, or retired while pinned); true if it was there.
    bool erase(uint32_t region, std::string_view key);
    /// Drops one pin of `client` on `slot` (an unknown one is ignored).
    void release(uint32_t client, uint32_t region, uint32_t slot);
    /// A client went away (closed or killed): its pins are released and its leases freed.
    void dropClient(uint32_t client);

    /// Pins a stored slot for `client` without counting a get (a write-back reading it).
    void hold(uint32_t client, uint32_t region, uint32_t slot);
    /// The identity and the layout a region was created with.
    [[nodiscard]] std::string const& identity(uint32_t region)
    {
        return at(region).identity;
    }
    [[nodiscard]] RegionLayout const& layout(uint32_t region)
    {
        return at(region).layout;
    }

    /// Checks that `region` exists (std::invalid_argument naming it otherwise).
    void checkRegion(uint32_t region) const;
    [[nodiscard]] Counters const& counters() const noexcept
    {
        return counters_;
    }
    [[nodiscard]] Counters& counters() noexcept
    {
        return counters_;
    }
    [[nodiscard]] std::shared_ptr<Mapping> const& arena() const noexcept
    {
        return arena_;
    }
    struct Occupancy
    {
        uint64_t regions = 0, slots = 0, free = 0, stored = 0, leased = 0, pinned = 0, arenaUsed = 0;
    };
    [[nodiscard]] Occupancy occupancy() const noexcept;

private:
    enum class State : uint8_t
    {
        Free,
        Leased,
        Stored,
        Retired,
    };
    static constexpr uint32_t kNone = ~0u;
    struct Region
    {
        RegionLayout layout;
        std::string identity;
        std::vector<uint64_t> versions;
        std::vector<State> state;
        std::vector<uint32_t> length, crc, pins, leasedBy;
        std::vector<std::string> keyOf;
        std::vector<uint32_t> prev, next; // LRU of stored, unpinned slots; slot `slots` is the list's head
        std::vector<uint32_t> free;
        KeyTable<InlineKeyEntry> keys; // key -> slot (the key of slot s is keyOf[s])
        uint64_t pinnedSlots = 0;
        bool inLru(uint32_t s) const noexcept
        {
            return prev[s] != kNone;
        }
    };

    Region& at(uint32_t region);
    void lruPush(Region& r, uint32_t s) noexcept; // most recently used end
    void lruRemove(Region& r, uint32_t s) noexcept;
    void pin(uint32_t client, Region& r, uint32_t s);
    Found getIn(uint32_t client, Region& r, std::string_view key, uint64_t hash);
    void unpin(Region& r, uint32_t s);
    void unstore(Region& r, uint32_t s);
    bool evictOne(Region& r);
    void freeSlot(Region& r, uint32_t s);

    std::shared_ptr<Mapping> arena_;
    std::vector<std::unique_ptr<Region>> regions_;
    std::map<std::pair<std::string, uint64_t>, uint32_t> byIdentity_;
    uint64_t nextOffset_ = 0;
    Counters counters_;
    // client -> (region << 32 | slot) -> pins that client holds
    std::unordered_map<uint32_t, std::unordered_map<uint64_t, uint32_t>> clientPins_;
    uint32_t pinsOwner_ = 0; // the client whose pins pinsOf_ points at (client ids start at 2)
    std::unordered_map<uint64_t, uint32_t>* pinsOf_ = nullptr;
};

} // namespace kvcodec::daemon

// SPDX-License-Identifier: Apache-2.0
#include "daemon/l2_index.h"

#include <algorithm>
#include <stdexcept>

namespace kvcodec::daemon {
namespace {

uint64_t roundUp(uint64_t n, uint64_t to) noexcept
{
    return (n + to - 1) / to * to;
}

} // namespace

RegionLayout const& L2Index::region(std::string_view identity, uint64_t pageBytes, uint32_t slots, bool packed)
{
    if (pageBytes == 0 && slots == 0)
    {
        // Find only: the region of this identity created first, whatever its page size.
        auto const it = byIdentity_.lower_bound({std::string(identity), 0});
        if (it == byIdentity_.end() || it->first.first != identity)
            throw std::invalid_argument("region '" + std::string(identity) + "' does not exist");
        return regions_[it->second]->layout;
    }
    if (pageBytes == 0 || slots == 0)
        throw std::invalid_argument(
            "page bytes " + std::to_string(pageBytes) + " and slots " + std::to_string(slots) + " must be positive");
    auto const found = byIdentity_.find({std::string(identity), pageBytes});
    if (found != byIdentity_.end())
        return regions_[found->second]->layout;
    uint64_t const room = arena_->size() - nextOffset_;
    uint64_t const stride = packed ? pageBytes : roundUp(pageBytes, kArenaPage);
    uint64_t const perSlot = stride + kHeaderBytes;
    uint64_t fit = room > 2 * kArenaPage ? std::min<uint64_t>(slots, (room - 2 * kArenaPage) / perSlot) : 0;
    while (fit > 0 && RegionLayout::bytesFor(stride, fit) > room)
        --fit;
    if (fit == 0)
        throw std::invalid_argument("the arena has " + std::to_string(room) + " bytes left, not enough for one slot of "
            + std::to_string(pageBytes) + " bytes (start the daemon with a larger --l2-bytes)");
    auto r = std::make_unique<Region>();
    r->identity = std::string(identity);
    RegionLayout& l = r->layout;
    l.region = uint32_t(regions_.size());
    l.table = nextOffset_;
    l.data = l.table + roundUp(fit * kHeaderBytes, kArenaPage);
    l.stride = stride;
    l.slots = uint32_t(fit);
    l.pageBytes = pageBytes;
    nextOffset_ = roundUp(l.end(), kArenaPage);
    r->versions.assign(fit, 0);
    r->state.assign(fit, State::Free);
    r->length.assign(fit, 0);
    r->crc.assign(fit, 0);
    r->pins.assign(fit, 0);
    r->leasedBy.assign(fit, 0);
    r->keyOf.resize(fit);
    r->keys.reset(fit);
    r->prev.assign(fit + 1, kNone);
    r->next.assign(fit + 1, kNone);
    r->prev[fit] = r->next[fit] = uint32_t(fit); // the empty list's head points at itself
    r->free.reserve(fit);
    for (uint64_t s = fit; s-- > 0;)
    {
        r->free.push_back(uint32_t(s));
        arena_->writeHeader(l, uint32_t(s), 0);
    }
    byIdentity_.emplace(std::make_pair(r->identity, pageBytes), l.region);
    regions_.push_back(std::move(r));
    return regions_.back()->layout;
}

void L2Index::checkRegion(uint32_t region) const
{
    if (region >= regions_.size())
        throw std::invalid_argument(
            "region " + std::to_string(region) + " does not exist (ask for it with 'region' first)");
}

L2Index::Region& L2Index::at(uint32_t region)
{
    checkRegion(region);
    return *regions_[region];
}

void L2Index::lruPush(Region& r, uint32_t s) noexcept
{
    uint32_t const head = r.layout.slots;
    uint32_t const last = r.prev[head];
    r.prev[s] = last;
    r.next[s] = head;
    r.next[last] = s;
    r.prev[head] = s;
}

void L2Index::lruRemove(Region& r, uint32_t s) noexcept
{
    if (!r.inLru(s))
        return;
    r.next[r.prev[s]] = r.next[s];
    r.prev[r.next[s]] = r.prev[s];
    r.prev[s] = r.next[s] = kNone;
}

std::vector<uint32_t> L2Index::lease(uint32_t client, uint32_t region, uint32_t count, std::vector<uint64_t>& versions)
{
    Region& r = at(region);
    std::vector<uint32_t> slots;
    slots.reserve(std::min(count, r.layout.slots));
    while (slots.size() < count)
    {
        if (r.free.empty() && !evictOne(r))
            break;
        uint32_t const s = r.free.back();
        r.free.pop_back();
        r.versions[s] += 1; // odd: being written
        r.state[s] = State::Leased;
        r.leasedBy[s] = client;
        arena_->writeHeader(r.layout, s, r.versions[s]);
        slots.push_back(s);
        versions.push_back(r.versions[s]);
    }
    counters_.leases += slots.size();
    return slots;
}

CommitStatus L2Index::commit(uint32_t client, uint32_t region, uint32_t s, std::string_view key, uint32_t length,
    uint32_t crc, bool ephemeral, bool pin, bool counted)
{
    Region& r = at(region);
    if (s >= r.layout.slots || r.state[s] != State::Leased || r.leasedBy[s] != client)
        return kNotLeased;
    if (length > r.layout.pageBytes)
    {
        freeSlot(r, s);
        return kBadLength;
    }
    std::string k(key);
    uint32_t const old = r.keys.find(k, r.keyOf);
    if (old != InlineKeyEntry::kNone)
        unstore(r, old);
    r.versions[s] += 1; // even: stable
    r.state[s] = State::Stored;
    r.length[s] = length;
    r.crc[s] = crc;
    arena_->writeHeader(r.layout, s, r.versions[s], length, crc, keyDigest(key));
    r.keys.insert(k, s);
    r.keyOf[s] = std::move(k);
    if (pin)
        this->pin(client, r, s);
    else
        lruPush(r, s);
    if (counted)
    {
        counters_.sets += 1;
        counters_.setBytes += length;
        counters_.ephemeral += ephemeral ? 1 : 0;
    }
    return kStored;
}

bool L2Index::contains(uint32_t region, std::string_view key)
{
    Region& r = at(region);
    return r.keys.find(key, r.keyOf) != InlineKeyEntry::kNone;
}

void L2Index::abort(uint32_t client, uint32_t region, uint32_t s)
{
    Region& r = at(region);
    if (s < r.layout.slots && r.state[s] == State::Leased && r.leasedBy[s] == client)
    {
        freeSlot(r, s);
        counters_.aborted += 1;
    }
}

void L2Index::getMany(uint32_t client, uint32_t region, std::vector<std::string_view> const& keys, Found* out)
{
    Region& r = at(region);
    constexpr size_t kAhead = 16; // entries in flight: enough to overlap the misses, few enough to stay cached
    std::vector<uint64_t> hashes(keys.size());
    for (size_t i = 0; i < keys.size(); ++i)
    {
        hashes[i] = KeyTable<InlineKeyEntry>::hashOf(keys[i]);
        if (i < kAhead)
            r.keys.prefetch(hashes[i]);
    }
    for (size_t i = 0; i < keys.size(); ++i)
    {
        if (i + kAhead < keys.size())
            r.keys.prefetch(hashes[i + kAhead]);
        out[i] = getIn(client, r, keys[i], hashes[i]);
    }
}

Found L2Index::getIn(uint32_t client, Region& r, std::string_view key, uint64_t hash)
{
    counters_.gets += 1;
    uint32_t const s = r.keys.find(key, hash, r.keyOf);
    if (s == InlineKeyEntry::kNone)
    {
        counters_.misses += 1;
        return {};
    }
    pin(client, r, s);
    counters_.hits += 1;
    counters_.hitBytes += r.length[s];
    return Found{s, r.length[s], r.crc[s], r.versions[s]};
}

void L2Index::hold(uint32_t client, uint32_t region, uint32_t s)
{
    Region& r = at(region);
    if (s < r.layout.slots && r.state[s] == State::Stored)
        pin(client, r, s);
}

void L2Index::pin(uint32_t client, Region& r, uint32_t s)
{
    lruRemove(r, s); // pinned: not evictable
    if (r.pins[s]++ == 0)
        r.pinnedSlots += 1;
    if (client != pinsOwner_)
    {
        pinsOwner_ = client;
        pinsOf_ = &clientPins_[client];
    }
    (*pinsOf_)[(uint64_t(r.layout.region) << 32) | s] += 1;
}

bool L2Index::erase(uint32_t region, std::string_view key)
{
    Region& r = at(region);
    uint32_t const s = r.keys.find(key, r.keyOf);
    if (s == InlineKeyEntry::kNone)
        return false;
    unstore(r, s);
    counters_.erased += 1;
    return true;
}

void L2Index::release(uint32_t client, uint32_t region, uint32_t s)
{
    Region& r = at(region);
    auto const c = clientPins_.find(client);
    if (c == clientPins_.end())
        return;
    auto const p = c->second.find((uint64_t(region) << 32) | s);
    if (p == c->second.end() || p->second == 0)
        return;
    --p->second; // kept at 0: the next pin of the slot needs no allocation
    unpin(r, s);
}

void L2Index::dropClient(uint32_t client)
{
    if (client == pinsOwner_)
    {
        pinsOwner_ = 0;
        pinsOf_ = nullptr;
    }
    auto const c = clientPins_.find(client);
    if (c != clientPins_.end())
    {
        for (auto const& [where, n] : c->second)
        {
            if (n == 0)
                continue;
            Region& r = *regions_[where >> 32];
            for (uint32_t i = 0; i < n; ++i)
                unpin(r, uint32_t(where));
            counters_.reclaimedPins += n;
        }
        clientPins_.erase(c);
    }
    for (auto& rp : regions_)
    {
        Region& r = *rp;
        for (uint32_t s = 0; s < r.layout.slots; ++s)
            if (r.state[s] == State::Leased && r.leasedBy[s] == client)
            {
                freeSlot(r, s);
                counters_.reclaimedLeases += 1;
            }
    }
}

void L2Index::unpin(Region& r, uint32_t s)
{
    if (--r.pins[s] != 0)
        return;
    r.pinnedSlots -= 1;
    if (r.state[s] == State::Retired)
        freeSlot(r, s);
    else if (r.state[s] == State::Stored)
        lruPush(r, s); // most recently used
}

void L2Index::unstore(Region& r, uint32_t s)
{
    r.keys.erase(r.keyOf[s], r.keyOf);
    r.keyOf[s].clear();
    lruRemove(r, s);
    if (r.pins[s] != 0)
        r.state[s] = State::Retired;
    else
        freeSlot(r, s);
}

bool L2Index::evictOne(Region& r)
{
    uint32_t const head = r.layout.slots;
    uint32_t const oldest = r.next[head];
    if (oldest == head)
        return false;
    unstore(r, oldest);
    counters_.evictions += 1;
    return true;
}

void L2Index::freeSlot(Region& r, uint32_t s)
{
    r.versions[s] += (r.versions[s] % 2) ? 1 : 2; // even, and never a version a reader holds
    r.state[s] = State::Free;
    arena_->writeHeader(r.layout, s, r.versions[s]);
    r.free.push_back(s);
}

L2Index::Occupancy L2Index::occupancy() const noexcept
{
    Occupancy o;
    o.regions = regions_.size();
    o.arenaUsed = nextOffset_;
    for (auto const& rp : regions_)
    {
        Region const& r = *rp;
        o.slots += r.layout.slots;
        o.free += r.free.size();
        o.stored += r.keys.size();
        o.pinned += r.pinnedSlots;
        for (uint32_t s = 0; s < r.layout.slots; ++s)
            o.leased += r.state[s] == State::Leased ? 1 : 0;
    }
    return o;
}

} // namespace kvcodec::daemon

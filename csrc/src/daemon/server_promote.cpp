// SPDX-License-Identifier: Apache-2.0
//
// The server's reads from the long tier: lookups parked while their pages are promoted into L2,
// prefetches, and the promoter thread that reads for both (server.h).
#include <algorithm>
#include <unistd.h>

#include "daemon/server.h"

namespace kvcodec::daemon {

void Server::answerGet(uint32_t client, uint32_t region, std::vector<std::string_view> const& keys, std::string& out)
{
    std::vector<Found> found(keys.size());
    index_.getMany(client, region, keys, found.data());
    FrameWriter w(out);
    w.put(uint8_t(Status::Ok)).put(uint32_t(keys.size()));
    for (Found const& f : found)
        w.put(f.slot).put(f.length).put(f.crc).put(uint32_t(0)).put(f.version);
    w.finish();
}

bool Server::park(Client& c, uint32_t region, std::vector<std::string_view> const& keys)
{
    if (!long_)
        return false;
    std::string const& identity = index_.identity(region);
    uint64_t const pageBytes = index_.layout(region).pageBytes;
    Promotion p;
    for (size_t i = 0; i < keys.size(); ++i)
    {
        if (!index_.contains(region, keys[i]) && long_->mayHave(identity, pageBytes, keys[i], true))
            p.missed.push_back(uint32_t(i));
    }
    if (p.missed.empty())
        return false;
    p.client = c.id;
    p.region = region;
    p.keys.assign(keys.begin(), keys.end());
    {
        std::lock_guard lock(promoteMutex_);
        lookups_.push_back(std::move(p));
    }
    promoteWake_.notify_one();
    c.parked = true;
    parkedLookups_ += 1;
    return true;
}

uint32_t Server::prefetch(FrameReader& in)
{
    Promotion p;
    p.region = in.get<uint32_t>();
    index_.checkRegion(p.region);
    uint32_t const count = in.count(4);
    for (uint32_t i = 0; i < count; ++i)
    {
        std::string_view const key = in.str();
        if (long_ && !index_.contains(p.region, key)
            && long_->mayHave(index_.identity(p.region), index_.layout(p.region).pageBytes, key, false))
        {
            p.missed.push_back(uint32_t(p.keys.size()));
            p.keys.emplace_back(key);
        }
    }
    if (p.keys.empty())
        return 0;
    size_t const wanted = p.keys.size();
    size_t queued = 0;
    {
        std::lock_guard lock(promoteMutex_);
        queued = size_t(std::min<uint64_t>(p.keys.size(), kMaxPrefetchKeys - prefetchQueued_));
        p.keys.resize(queued);
        p.missed.resize(queued);
        prefetchQueued_ += queued;
        if (queued != 0)
            prefetches_.push_back(std::move(p));
    }
    prefetchDropped_ += wanted - queued;
    prefetchKeys_ += queued;
    promoteWake_.notify_one();
    return uint32_t(queued);
}

void Server::promoter()
{
    std::unique_lock lock(promoteMutex_);
    for (;;)
    {
        promoteWake_.wait(lock, [this] { return promoteStop_ || !lookups_.empty() || !prefetches_.empty(); });
        if (promoteStop_)
            return;
        std::deque<Promotion>& from = lookups_.empty() ? prefetches_ : lookups_;
        Promotion p = std::move(from.front());
        from.pop_front();
        lock.unlock();
        bool const prefetched = p.client == 0;
        for (uint32_t i : p.missed)
            promoteOne(p.region, p.keys[i], prefetched);
        lock.lock();
        if (prefetched)
        {
            prefetchQueued_ -= p.keys.size();
            continue;
        }
        promotedLookups_.push_back(std::move(p));
        uint64_t one = 1;
        [[maybe_unused]] ssize_t n = write(promoteFd_, &one, sizeof one);
    }
}

void Server::promoteOne(uint32_t region, std::string const& key, bool prefetched)
{
    std::string identity;
    RegionLayout layout;
    uint32_t slot = 0;
    uint64_t erasures = 0;
    {
        std::lock_guard lock(mutex_);
        if (index_.contains(region, key))
            return; // stored meanwhile (by a client, or an earlier read of the same key)
        std::vector<uint64_t> versions;
        std::vector<uint32_t> const slots = index_.lease(kLongTierClient, region, 1, versions);
        if (slots.empty())
            return; // every slot pinned or leased: the lookup misses
        slot = slots[0];
        identity = index_.identity(region);
        layout = index_.layout(region);
        erasures = erasures_;
    }
    // The slot is leased to the long tier: nobody else writes or reads it until it is committed.
    uint32_t length = 0, crc = 0;
    bool const read = long_->get(identity, layout.pageBytes, key, arena_->data(layout, slot), length, crc);
    std::lock_guard lock(mutex_);
    // A client's newer page of the key, or an erase, since the read started wins over the file.
    if (!read || erasures != erasures_ || index_.contains(region, key)
        || index_.commit(kLongTierClient, region, slot, key, length, crc, true, false, false) != kStored)
    {
        index_.abort(kLongTierClient, region, slot);
        return;
    }
    promotions_ += 1;
    prefetched_ += prefetched ? 1 : 0;
}

void Server::promoted()
{
    uint64_t signals = 0;
    [[maybe_unused]] ssize_t n = read(promoteFd_, &signals, sizeof signals);
    std::vector<Promotion> done;
    {
        std::lock_guard lock(promoteMutex_);
        done.swap(promotedLookups_);
    }
    for (Promotion const& p : done)
    {
        auto const it = clients_.find(p.client);
        if (it == clients_.end())
            continue; // the client went away meanwhile: the pages stay in L2
        Client& c = *it->second;
        std::vector<std::string_view> const keys(p.keys.begin(), p.keys.end());
        answerGet(c.id, p.region, keys, c.out);
        c.parked = false;
        if (input(c)) // the requests that waited behind the lookup
            flush(c);
    }
}

void Server::stopPromoter() noexcept
{
    if (!promoterThread_.joinable())
        return;
    {
        std::lock_guard lock(promoteMutex_);
        promoteStop_ = true;
    }
    promoteWake_.notify_all();
    promoterThread_.join();
}

} // namespace kvcodec::daemon

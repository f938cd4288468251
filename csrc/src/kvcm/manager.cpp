// SPDX-License-Identifier: Apache-2.0
//
// KvCacheManager: construction, the call guard, allocation and freeing, content keys and the
// blobs a level kept from a previous manager, observers, statistics and synchronization. The
// migration transaction is in manager_migrate.cpp, its paths in manager_paths.cpp, eviction in
// manager_eviction.cpp, resize and defragmentation in manager_resize.cpp.
#include "kvcm/manager.h"
#include "runtime/log.h"

#include <algorithm>
#include <cstdio>
#include <string_view>
#include <unordered_set>

#include "kvcm/manager_internal.h"

namespace kvcodec::kvcm {

using detail::collect;
using detail::waitAll;

KvCacheManager::CallGuard::CallGuard(KvCacheManager const& m, char const* what)
    : m_(m)
{
    if (!enterNested(what))
    {
        m_.mutex_.lock();
        m_.owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
        entered_ = true;
    }
    if (m_.closed_)
    {
        // The destructor does not run for a constructor that throws: leave the mutex here.
        if (!nested_)
        {
            m_.owner_.store(std::thread::id(), std::memory_order_relaxed);
            m_.mutex_.unlock();
        }
        entered_ = false;
        throw std::logic_error(std::string(what) + "(): the KV-cache manager is closed");
    }
}

KvCacheManager::CallGuard::CallGuard(KvCacheManager const& m, char const* what, std::try_to_lock_t)
    : m_(m)
{
    if (!enterNested(what) && m_.mutex_.try_lock())
    {
        m_.owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
        entered_ = true;
    }
}

bool KvCacheManager::CallGuard::enterNested(char const* what)
{
    if (m_.owner_.load(std::memory_order_relaxed) != std::this_thread::get_id())
    {
        return false;
    }
    if (m_.inObserver_)
    {
        throw std::logic_error(std::string(what) + "() was called from a migration observer of the same "
            + "KV-cache manager while the migration holds it; observers must not call the manager (record "
            + "what to do and do it after the migration returns)");
    }
    entered_ = true;
    nested_ = true;
    return true;
}

KvCacheManager::CallGuard::~CallGuard()
{
    if (entered_ && !nested_)
    {
        m_.owner_.store(std::thread::id(), std::memory_order_relaxed);
        m_.mutex_.unlock();
    }
    entered_ = false;
}

KvCacheManager::KvCacheManager(
    KvcmConfig config, std::unique_ptr<runtime::DeviceRuntime> runtime, runtime::CodecPtr codec, int32_t codecDevice)
    : runtime_(std::move(runtime))
{
    storage_ = std::make_unique<StorageManager>(std::move(config), *runtime_, std::move(codec), codecDevice);
    stream_ = runtime_->createStream();
    for (int l = 0; l < kNumLevels; ++l)
    {
        stats_[size_t(l)].resize(storage_->numPoolGroups(CacheLevel(l)));
        ColdLevel* cold = storage_->coldLevel(CacheLevel(l));
        tracking_[size_t(l)] = cold != nullptr && cold->tracksBlobs() ? cold : nullptr;
    }
    lru_.attach(*storage_);
    buildTransferKeys();
}

KvCacheManager::~KvCacheManager()
{
    {
        // The I/O thread may still try to commit: the lock keeps it out while jobs are waited for.
        std::lock_guard<std::mutex> lock(mutex_);
        owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
        try
        {
            synchronizeAll(); // No call can be in flight: callers hold the manager while they use it.
        }
        catch (std::exception const& e)
        {
            log::write(log::Level::kError,
                std::string("synchronizing the KV-cache manager at destruction failed: ") + e.what());
        }
        owner_.store(std::thread::id(), std::memory_order_relaxed);
    }
    stopIoThread();
    deviceChecks_.reset();
    storage_.reset(); // Before the stream its ring events were recorded on.
    runtime_->destroyStream(stream_);
}

KvCacheManager::LevelKind KvCacheManager::kindOf(CacheLevel level) const noexcept
{
    ColdLevel const* cold = storage_->coldLevel(level);
    if (cold == nullptr)
    {
        return LevelKind::kHot;
    }
    return cold->access() == ColdAccess::kStaged ? LevelKind::kStaged : LevelKind::kAddressable;
}

void KvCacheManager::buildTransferKeys()
{
    size_t const n = storage_->numLifeCycles();
    for (int s = 0; s < kNumLevels; ++s)
    {
        for (int d = 0; d < kNumLevels; ++d)
        {
            auto const src = CacheLevel(s);
            auto const dst = CacheLevel(d);
            auto& keys = transfers_[size_t(s)][size_t(d)];
            auto& keyOf = transferOf_[size_t(s)][size_t(d)];
            keyOf.assign(n, -1);
            if (!storage_->hasLevel(src) || !storage_->hasLevel(dst))
            {
                continue;
            }
            uint8_t const path = pathFor(kindOf(src), kindOf(dst));
            if (path == kNoPath)
            {
                continue; // A staged level places blobs itself: nothing to relocate there.
            }
            bool const codecPath = (src == CacheLevel::kHot) != (dst == CacheLevel::kHot);
            for (size_t l = 0; l < n; ++l)
            {
                // Hot/cold conversions batch by the codec's representative; same-level copies by
                // pool groups only.
                TransferKey key{src, dst, storage_->poolGroup(src, LifeCycleId(l)),
                    storage_->poolGroup(dst, LifeCycleId(l)),
                    codecPath ? storage_->lifeCycle(LifeCycleId(l)).batchingRepresentative : -1, path};
                auto it = std::find_if(keys.begin(), keys.end(), [&](TransferKey const& k) {
                    return k.srcGroup == key.srcGroup && k.dstGroup == key.dstGroup && k.rep == key.rep;
                });
                if (it == keys.end())
                {
                    keys.push_back(key);
                    it = std::prev(keys.end());
                }
                keyOf[l] = int32_t(it - keys.begin());
            }
        }
    }
}

void KvCacheManager::checkLevel(CacheLevel level, char const* what) const
{
    if (int(level) < 0 || int(level) >= kNumLevels)
    {
        std::string valid;
        for (int l = 0; l < kNumLevels; ++l)
        {
            valid += (l == 0 ? ""
                             : l + 1 == kNumLevels ? " and "
                                                   : ", ")
                + std::to_string(l) + " (" + levelName(CacheLevel(l)) + ")";
        }
        throw std::invalid_argument(
            std::string(what) + " is " + std::to_string(int(level)) + "; valid levels are " + valid);
    }
    if (!storage_->hasLevel(level))
    {
        throw std::invalid_argument(std::string(what) + " is the " + levelName(level)
            + " level, which this manager does not have (" + StorageManager::missingLevelReason(level) + ")");
    }
}

bool KvCacheManager::isLive(PageId id) const
{
    CallGuard guard(*this, "isLive");
    return pages_.isLive(id);
}

PageInfo KvCacheManager::info(PageId id) const
{
    CallGuard guard(*this, "info");
    Page const& p = pages_[pages_.resolve(id, 0)];
    auto const level = CacheLevel(p.level);
    return {p.lifeCycle, level, p.slot, storage_->poolGroup(level, p.lifeCycle), p.inFlight};
}

void KvCacheManager::releasePage(uint32_t index) noexcept
{
    notePrefetchLeft(pages_[index], false);
    lru_.erase(index);
    keys_.erase(index);
    pages_.release(index);
}

void KvCacheManager::allocate(
    LifeCycleId lifeCycle, size_t count, PageId* out, std::optional<Stream> stream, std::string const* keys)
{
    CallGuard guard(*this, "allocate");
    if (lifeCycle < 0 || size_t(lifeCycle) >= storage_->numLifeCycles())
    {
        throw std::invalid_argument("lifecycle is " + std::to_string(lifeCycle) + "; configured layer groups are 0.."
            + std::to_string(storage_->numLifeCycles() - 1));
    }
    if (keys != nullptr)
    {
        checkNewKeys(keys, count); // Before any page exists: a refused key allocates nothing.
    }
    PoolGroupIndex const g = storage_->poolGroup(CacheLevel::kHot, lifeCycle);
    SlotPool& pool = storage_->slots(CacheLevel::kHot, g);
    if (pool.freeSlots() < count && hasJobs())
    {
        waitJobs(nullptr); // Pages on their way to the disk still hold hot slots.
    }
    if (pool.freeSlots() < count && storage_->config().autoEvict
        && pool.freeSlots() + lru_.live(CacheLevel::kHot, g) >= count)
    {
        makeRoom(CacheLevel::kHot, g, count, stream); // Evicts least-recently-used pages colder.
    }
    if (pool.freeSlots() < count)
    {
        throw CapacityError("cannot allocate " + std::to_string(count) + " hot pages of layer group "
            + std::to_string(lifeCycle) + ": hot pool group " + std::to_string(g) + " has "
            + std::to_string(pool.freeSlots()) + " free of " + std::to_string(pool.numSlots()) + " slots and "
            + std::to_string(lru_.live(CacheLevel::kHot, g)) + " evictable pages; evict, unpin or free pages first");
    }
    auto& events = detail::scratch().events;
    events.clear();
    runtime::Event* last = nullptr;
    for (size_t i = 0; i < count; ++i)
    {
        int32_t const slot = pool.take();
        collect(events, pool.ready(slot), last);
        uint32_t const index = pages_.add();
        Page& p = pages_[index];
        p.lifeCycle = lifeCycle;
        p.level = int8_t(CacheLevel::kHot);
        p.slot = slot;
        p.tick = ++clock_;
        lru_.insert(index);
        if (keys != nullptr && !keys[i].empty())
        {
            keys_.set(index, keys[i]); // Under the same lock: no eviction sees the page keyless.
        }
        out[i] = pages_.id(index);
    }
    // A new page's bytes may still be read by the transfer that vacated the slot.
    waitAll(events, stream);
}

void KvCacheManager::checkKey(std::string const& key, std::string const& what, std::optional<uint32_t> self) const
{
    if (key.size() > 254)
    {
        throw std::invalid_argument(
            what + " is " + std::to_string(key.size()) + " bytes; content keys are 1..254 bytes");
    }
    auto const owner = key.empty() ? std::nullopt : keys_.owner(key);
    if (owner && owner != self)
    {
        throw std::invalid_argument(what + " is already the content key of live page " + hexId(pages_.id(*owner))
            + "; keys are unique among live pages");
    }
}

void KvCacheManager::checkNewKeys(std::string const* keys, size_t count) const
{
    std::unordered_set<std::string_view> seen;
    for (size_t i = 0; i < count; ++i)
    {
        checkKey(keys[i], "keys[" + std::to_string(i) + "]", std::nullopt);
        if (!keys[i].empty() && !seen.insert(keys[i]).second)
        {
            throw std::invalid_argument(
                "keys[" + std::to_string(i) + "] appears twice; keys are unique among live pages");
        }
    }
}

void KvCacheManager::free(PageId const* ids, size_t count)
{
    CallGuard guard(*this, "free");
    waitForPages(ids, count); // A page in flight is freed once its transfer landed.
    uint32_t const epoch = pages_.nextEpoch();
    auto& indices = detail::scratch().pages;
    indices.resize(count);
    for (size_t i = 0; i < count; ++i)
    {
        uint32_t const index = pages_.resolve(ids[i], i);
        if (pages_[index].mark == epoch)
        {
            throw std::invalid_argument("pages[" + std::to_string(i) + "] (page " + hexId(ids[i]) + ") appears twice");
        }
        pages_[index].mark = epoch;
        indices[i] = index;
    }
    for (uint32_t index : indices)
    {
        Page const& p = pages_[index];
        auto const level = CacheLevel(p.level);
        PoolGroupIndex const group = storage_->poolGroup(level, p.lifeCycle);
        SlotPool& pool = storage_->slots(level, group);
        if (ColdLevel* cold = tracking(level))
        {
            cold->release(group, p.slot);
        }
        pool.give(p.slot, pool.ready(p.slot));
        releasePage(index);
    }
}

void KvCacheManager::setKey(PageId id, std::string const& key)
{
    CallGuard guard(*this, "setKey");
    waitForPages(&id, 1); // A page being written keeps its key until the write landed.
    uint32_t const index = pages_.resolve(id, 0);
    auto const level = CacheLevel(pages_[index].level);
    if (ColdLevel const* cold = storage_->coldLevel(level); cold != nullptr && cold->keepsKeys())
    {
        throw std::invalid_argument("page " + hexId(id) + " is at the " + levelName(level) + " level, written under "
            + "its key; set the key before the page goes to " + levelName(level));
    }
    checkKey(key, "key", index);
    keys_.set(index, key);
}

std::string KvCacheManager::key(PageId id) const
{
    CallGuard guard(*this, "key");
    return keys_.of(pages_.resolve(id, 0));
}

void KvCacheManager::findKept(
    CacheLevel level, char const* what, std::string const* keys, size_t count, PageId* out, int32_t const* lifeCycles)
{
    CallGuard guard(*this, what);
    checkLevel(level, (std::string(what) + "'s level").c_str());
    ColdLevel* cold = storage_->coldLevel(level);
    cold->maintain(false);
    // Keys no live page holds are claimed from the level in one batch: `keys` itself when that
    // is every key, each once (the usual lookup), else copies of the distinct ones.
    std::vector<size_t> where;  // The keys asked for, in order.
    std::vector<size_t> firsts; // Of those, each distinct key's first.
    where.reserve(count);
    firsts.reserve(count);
    std::vector<int32_t> seen(count < 8 ? 16 : size_t(1) << (64 - __builtin_clzll(count * 2 - 1)), -1);
    size_t const mask = seen.size() - 1;
    for (size_t i = 0; i < count; ++i)
    {
        out[i] = 0;
        auto const owner = keys_.owner(keys[i]);
        if (owner)
        {
            Page const& p = pages_[*owner];
            if (CacheLevel(p.level) == level)
            {
                out[i] = pages_.id(*owner);
            }
            continue; // A live page elsewhere holds the key; a kept blob under it was replaced.
        }
        size_t h = std::hash<std::string>{}(keys[i]) & mask;
        while (seen[h] >= 0 && keys[size_t(seen[h])] != keys[i])
        {
            h = (h + 1) & mask;
        }
        if (seen[h] < 0) // A repeat is asked once: found below through the page the first claims.
        {
            seen[h] = int32_t(i);
            firsts.push_back(i);
        }
        where.push_back(i);
    }
    if (where.empty())
    {
        return;
    }
    std::vector<std::string> copies;
    std::vector<int32_t> askLifeCycles;
    std::string const* ask = keys;
    size_t asked = count;
    if (firsts.size() != count)
    {
        for (size_t i : firsts)
        {
            copies.push_back(keys[i]);
            askLifeCycles.push_back(lifeCycles != nullptr ? lifeCycles[i] : -1);
        }
        ask = copies.data();
        asked = copies.size();
    }
    else if (lifeCycles == nullptr)
    {
        askLifeCycles.assign(count, -1);
    }
    int32_t const* askedLifeCycles = askLifeCycles.empty() ? lifeCycles : askLifeCycles.data();
    std::vector<std::optional<ClaimedBlob>> const found = cold->claimMany(ask, askedLifeCycles, asked);
    for (size_t j = 0; j < asked; ++j)
    {
        if (!found[j])
        {
            continue;
        }
        uint32_t const index = pages_.add();
        Page& p = pages_[index];
        p.lifeCycle = found[j]->lifeCycle;
        p.level = int8_t(level);
        p.slot = found[j]->slot;
        p.tick = ++clock_;
        lru_.insert(index);
        keys_.set(index, ask[j]);
        if (ask == keys)
        {
            out[j] = pages_.id(index);
        }
    }
    if (ask == keys)
    {
        return;
    }
    for (size_t i : where)
    {
        if (auto const owner = keys_.owner(keys[i]))
        {
            out[i] = pages_.id(*owner); // The same key twice in one call finds the same page.
        }
    }
}

std::optional<KvCacheManager::SharedStats> KvCacheManager::sharedStats() const
{
    CallGuard guard(*this, "sharedStats");
    auto const* shared = dynamic_cast<SharedColdLevel const*>(storage_->coldLevel(CacheLevel::kHost));
    if (shared == nullptr)
    {
        return std::nullopt;
    }
    return SharedStats{shared->connected(), shared->counters(), shared->reattached()};
}

SharedColdLevel& KvCacheManager::sharedLevel() const
{
    auto* shared = dynamic_cast<SharedColdLevel*>(storage_->coldLevel(CacheLevel::kHost));
    if (shared == nullptr)
    {
        throw std::invalid_argument("this manager has no shared host level: set config.shared");
    }
    return *shared;
}

uint64_t KvCacheManager::prefetchShared(std::string const* keys, int32_t const* lifeCycles, size_t count)
{
    CallGuard guard(*this, "prefetchShared");
    return sharedLevel().prefetch(keys, lifeCycles, count);
}

void KvCacheManager::maybeReattachShared()
{
    CallGuard guard(*this, "reattachShared");
    auto* shared = dynamic_cast<SharedColdLevel*>(storage_->coldLevel(CacheLevel::kHost));
    if (shared != nullptr && shared->reattachDue())
    {
        reattachShared(); // A failed try logged why (or found no daemon): the call goes on unshared.
    }
}

bool KvCacheManager::reattachShared()
{
    CallGuard guard(*this, "reattachShared");
    SharedColdLevel* shared = &sharedLevel();
    if (shared->connected())
    {
        return false;
    }
    synchronizeAll(); // No transfer may read or write a slot while its page moves.
    size_t const groups = shared->numPoolGroups();
    std::vector<std::vector<int32_t>> held(groups), moved;
    std::vector<std::vector<uint32_t>> owners(groups);
    for (uint32_t index = 0; index < pages_.size(); ++index)
    {
        Page const& p = pages_[index];
        if (p.level == int8_t(CacheLevel::kHost))
        {
            auto const g = size_t(storage_->poolGroup(CacheLevel::kHost, p.lifeCycle));
            held[g].push_back(p.slot);
            owners[g].push_back(index);
        }
    }
    if (!shared->reattach(held, moved))
    {
        return false;
    }
    for (size_t g = 0; g < groups; ++g)
    {
        for (size_t i = 0; i < owners[g].size(); ++i)
        {
            pages_[owners[g][i]].slot = moved[g][i];
        }
    }
    return true;
}

size_t KvCacheManager::forgetUnclaimed(CacheLevel level, char const* what)
{
    CallGuard guard(*this, what);
    checkLevel(level, (std::string(what) + "'s level").c_str());
    return storage_->coldLevel(level)->forgetUnclaimed();
}

size_t KvCacheManager::unclaimed(CacheLevel level, char const* what) const
{
    CallGuard guard(*this, what);
    ColdLevel const* cold = storage_->coldLevel(level);
    return cold ? cold->numUnclaimed() : 0;
}

void KvCacheManager::noteEvent(Stream stream, EventPtr const& event)
{
    if (!event)
    {
        return;
    }
    for (auto& [s, e] : lastEvents_)
    {
        if (s == stream)
        {
            e = event;
            return;
        }
    }
    lastEvents_.emplace_back(stream, event);
}

void KvCacheManager::notify(MigrationRecord const& record)
{
    for (auto const& [id, observer] : observers_)
    {
        try
        {
            inObserver_ = true;
            observer(record);
            inObserver_ = false;
        }
        catch (...)
        {
            inObserver_ = false;
            if (!observerError_)
            {
                observerError_ = std::current_exception();
            }
        }
    }
}

int64_t KvCacheManager::addObserver(Observer observer)
{
    CallGuard guard(*this, "addObserver");
    observers_.emplace_back(nextObserver_, std::move(observer));
    return nextObserver_++;
}

bool KvCacheManager::removeObserver(int64_t id)
{
    CallGuard guard(*this, "removeObserver");
    auto it = std::find_if(observers_.begin(), observers_.end(), [&](auto const& o) { return o.first == id; });
    if (it == observers_.end())
    {
        return false;
    }
    observers_.erase(it);
    return true;
}

std::vector<PoolGroupStats> KvCacheManager::stats(CacheLevel level) const
{
    CallGuard guard(*this, "stats");
    checkLevel(level, "level");
    harvestGpuTimes();
    return stats_[size_t(level)];
}

std::vector<std::pair<uint64_t, uint64_t>> KvCacheManager::getAndResetIterationPeakBlockStats(CacheLevel level)
{
    CallGuard guard(*this, "getAndResetIterationPeakBlockStats");
    checkLevel(level, "level");
    std::vector<std::pair<uint64_t, uint64_t>> out;
    for (size_t g = 0; g < storage_->numPoolGroups(level); ++g)
    {
        SlotPool& pool = storage_->slots(level, PoolGroupIndex(g));
        uint64_t const used = pool.usedSlots();
        out.emplace_back(used, pool.resetPeak());
    }
    return out;
}

void KvCacheManager::closeLevel(CacheLevel level, char const* what)
{
    CallGuard guard(*this, what);
    synchronizeAll();
    lru_.clear(level);
    storage_->closeLevel(level);
    tracking_[size_t(level)] = nullptr;
    closed_ = true; // Every later call (from any thread) is refused.
}

void KvCacheManager::closeTiers()
{
    CallGuard guard(*this, "close");
    synchronizeAll();
    // The host level too: a shared one holds leases and pins in the cache daemon that other
    // processes wait for, and a handle of a non-blocking call can keep this core alive long after.
    for (CacheLevel const level : {CacheLevel::kHost, CacheLevel::kDisk, CacheLevel::kRemote})
    {
        if (storage_->hasLevel(level))
        {
            lru_.clear(level);
            storage_->closeLevel(level);
            tracking_[size_t(level)] = nullptr;
        }
    }
    closed_ = true; // Every later call (from any thread) is refused.
}

void KvCacheManager::findRemote(std::string const* keys, int32_t const* lifeCycles, size_t count, PageId* out)
{
    std::vector<std::string> offered;
    uint64_t token = 0;
    {
        CallGuard guard(*this, "findRemote");
        checkLevel(CacheLevel::kRemote, "findRemote's level");
        std::vector<LifeCycleId> offeredLifeCycles;
        for (size_t i = 0; i < count; ++i)
        {
            if (lifeCycles[i] >= int32_t(storage_->numLifeCycles()))
            {
                throw std::invalid_argument("lifecycles[" + std::to_string(i) + "] is " + std::to_string(lifeCycles[i])
                    + "; the manager has " + std::to_string(storage_->numLifeCycles()) + " lifecycles");
            }
            if (lifeCycles[i] >= 0)
            {
                offered.push_back(keys[i]);
                offeredLifeCycles.push_back(LifeCycleId(lifeCycles[i]));
            }
        }
        token = storage_->remoteLevel()->offer(offered, offeredLifeCycles);
    }
    // The offers that no page claimed (the key is already at another level, or its group has no
    // free slot) are withdrawn, whether or not findKept() succeeded.
    struct Withdraw
    {
        KvCacheManager& m;
        std::vector<std::string> const& keys;
        uint64_t token;
        ~Withdraw()
        {
            m.withdrawRemoteOffers(keys, token);
        }
    } withdraw{*this, offered, token};
    findKept(CacheLevel::kRemote, "findRemote", keys, count, out);
}

void KvCacheManager::withdrawRemoteOffers(std::vector<std::string> const& keys, uint64_t token) noexcept
{
    try
    {
        CallGuard guard(*this, "findRemote");
        if (RemoteColdLevel* remote = storage_->remoteLevel())
        {
            remote->withdraw(keys, token);
        }
    }
    catch (...)
    {
        // A closed manager or no memory: the offers stay until a claim or the level's end.
    }
}

size_t KvCacheManager::remoteOffers() const
{
    CallGuard guard(*this, "remoteOffers");
    RemoteColdLevel* remote = storage_->remoteLevel();
    return remote ? remote->numOffered() : 0;
}

void KvCacheManager::synchronize()
{
    CallGuard guard(*this, "synchronize");
    synchronizeAll();
    storage_->maintain(true);
}

void KvCacheManager::synchronizeAll()
{
    waitJobs(nullptr);
    for (auto& [s, e] : lastEvents_)
    {
        e->synchronize();
    }
    lastEvents_.clear();
}

} // namespace kvcodec::kvcm

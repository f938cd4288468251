// SPDX-License-Identifier: Apache-2.0
#include "kvcm/manager.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

namespace kvcodec::kvcm {
namespace {

std::string hexId(PageId id)
{
    char buf[32];
    std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(id));
    return buf;
}

PageId makeId(uint32_t index, uint32_t generation) noexcept
{
    return (PageId(generation) << 32) | index;
}

// Scratch reused across calls so a warm migration allocates nothing.
struct Scratch
{
    std::vector<uint32_t> pages;
    std::vector<uint32_t> order;
    std::vector<int32_t> bucket;
    std::vector<size_t> starts;
    std::vector<size_t> fill;
    std::vector<int32_t> dstSlots;
    std::vector<uint64_t> needs;
    std::vector<PageIndexPair> pairs;
    std::vector<runtime::Event*> events;
    std::vector<PageIndexPair> codecPairs;
    std::vector<uint32_t> leaseIndex;
    std::vector<int32_t> diskSlots;
    std::vector<std::byte*> blobs;
    std::vector<disk::StatusCode> status;
    std::vector<std::string> messages;
};
thread_local Scratch tScratch;

template <typename Entry>
bool laterVictimOf(Entry const& a, Entry const& b) noexcept
{
    if (a.priority != b.priority)
    {
        return a.priority > b.priority;
    }
    if (a.tick != b.tick)
    {
        return a.tick > b.tick;
    }
    return a.index > b.index;
}

// Waits on each distinct event once; consecutive pages usually share one.
void waitAll(std::vector<runtime::Event*>& events, std::optional<Stream> stream)
{
    std::sort(events.begin(), events.end());
    events.erase(std::unique(events.begin(), events.end()), events.end());
    for (runtime::Event* e : events)
    {
        if (stream)
        {
            e->waitOn(*stream);
        }
        else
        {
            e->synchronize();
        }
    }
}

// `last` remembers the previous event of one source of events (source slots, destination
// slots), so runs of pages protected by one event add it once.
void collect(std::vector<runtime::Event*>& events, EventPtr const& e, runtime::Event*& last)
{
    if (e && e.get() != last)
    {
        events.push_back(e.get());
        last = e.get();
    }
}

} // namespace

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

KvCacheManager::KvCacheManager(KvcmConfig config, std::unique_ptr<runtime::DeviceRuntime> runtime,
    runtime::CodecPtr codec, int32_t codecDevice)
    : runtime_(std::move(runtime))
{
    // Page ids carry a generation that starts at a per-manager random value, so an id of one
    // manager is (with probability 1 - 2^-31) refused by another instead of naming its page.
    std::random_device entropy;
    generationBase_ = 1u + (uint32_t(entropy()) ^ uint32_t(reinterpret_cast<uintptr_t>(this) >> 4)) % 0x7FFFFFFFu;
    storage_ = std::make_unique<StorageManager>(std::move(config), *runtime_, std::move(codec), codecDevice);
    stream_ = runtime_->createStream();
    for (int l = 0; l < kNumLevels; ++l)
    {
        stats_[size_t(l)].resize(storage_->numPoolGroups(CacheLevel(l)));
        lru_[size_t(l)].resize(storage_->numPoolGroups(CacheLevel(l)));
    }
    buildTransferKeys();
}

KvCacheManager::~KvCacheManager()
{
    try
    {
        synchronizeAll(); // No call can be in flight: callers hold the manager while they use it.
    }
    catch (std::exception const& e)
    {
        std::fprintf(stderr, "kvcodec: synchronizing the KV-cache manager at destruction failed: %s\n", e.what());
    }
    storage_.reset(); // Before the stream its ring events were recorded on.
    runtime_->destroyStream(stream_);
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
            auto& keys = keys_[size_t(s)][size_t(d)];
            auto& keyOf = keyOf_[size_t(s)][size_t(d)];
            keyOf.assign(n, -1);
            if (!storage_->hasLevel(src) || !storage_->hasLevel(dst)
                || (src == CacheLevel::kDisk && dst == CacheLevel::kDisk))
            {
                continue; // The disk regions place blobs themselves: nothing to relocate there.
            }
            bool const codecPath = (src == CacheLevel::kHot) != (dst == CacheLevel::kHot);
            for (size_t l = 0; l < n; ++l)
            {
                // Hot/cold conversions batch by the codec's representative; same-level copies by
                // pool groups only.
                TransferKey key{src, dst, storage_->poolGroup(src, LifeCycleId(l)),
                    storage_->poolGroup(dst, LifeCycleId(l)),
                    codecPath ? storage_->lifeCycle(LifeCycleId(l)).representative : -1};
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
        throw std::invalid_argument(std::string(what) + " is " + std::to_string(int(level))
            + "; valid levels are 0 (hot), 1 (host) and 2 (disk)");
    }
    if (!storage_->hasLevel(level))
    {
        throw std::invalid_argument(std::string(what) + " is the " + levelName(level)
            + " level, which this manager does not have ("
            + (level == CacheLevel::kDisk ? "config.disk is not set" : "config.hostQuotaBytes is 0") + ")");
    }
}

uint32_t KvCacheManager::resolve(PageId id, size_t position) const
{
    uint32_t const index = uint32_t(id & 0xffffffffu);
    uint32_t const generation = uint32_t(id >> 32);
    if (index >= pages_.size() || pages_[index].generation != generation || pages_[index].level < 0)
    {
        bool const issued = index < pages_.size()
            && uint32_t(generation - generationBase_) <= uint32_t(pages_[index].generation - generationBase_);
        throw StalePageError("pages[" + std::to_string(position) + "] (page " + hexId(id) + ") is "
            + (issued ? "stale: it was freed or dropped" : "not a page of this manager"));
    }
    return index;
}

bool KvCacheManager::isLive(PageId id) const
{
    CallGuard guard(*this, "isLive");
    uint32_t const index = uint32_t(id & 0xffffffffu);
    return index < pages_.size() && pages_[index].generation == uint32_t(id >> 32) && pages_[index].level >= 0;
}

PageInfo KvCacheManager::info(PageId id) const
{
    CallGuard guard(*this, "info");
    Page const& p = pages_[resolve(id, 0)];
    auto const level = CacheLevel(p.level);
    return {p.lifeCycle, level, p.slot, storage_->poolGroup(level, p.lifeCycle)};
}

void KvCacheManager::releasePage(uint32_t index) noexcept
{
    lruErase(index);
    auto const k = pageKeys_.empty() ? pageKeys_.end() : pageKeys_.find(index);
    if (k != pageKeys_.end())
    {
        keyOwner_.erase(k->second);
        pageKeys_.erase(k);
    }
    Page& p = pages_[index];
    p.level = -1;
    p.slot = -1;
    p.pins = 0;
    p.priority = 0;
    ++p.generation;
    freePages_.push_back(index);
}

void KvCacheManager::allocate(LifeCycleId lifeCycle, size_t count, PageId* out, std::optional<Stream> stream)
{
    CallGuard guard(*this, "allocate");
    if (lifeCycle < 0 || size_t(lifeCycle) >= storage_->numLifeCycles())
    {
        throw std::invalid_argument("lifecycle is " + std::to_string(lifeCycle) + "; configured layer groups are 0.."
            + std::to_string(storage_->numLifeCycles() - 1));
    }
    PoolGroupIndex const g = storage_->poolGroup(CacheLevel::kHot, lifeCycle);
    SlotPool& pool = storage_->slots(CacheLevel::kHot, g);
    if (pool.freeSlots() < count && storage_->config().autoEvict
        && pool.freeSlots() + lru_[size_t(CacheLevel::kHot)][size_t(g)].live >= count)
    {
        makeRoom(CacheLevel::kHot, g, count, stream); // Evicts least-recently-used pages colder.
    }
    if (pool.freeSlots() < count)
    {
        throw CapacityError("cannot allocate " + std::to_string(count) + " hot pages of layer group "
            + std::to_string(lifeCycle) + ": hot pool group " + std::to_string(g) + " has "
            + std::to_string(pool.freeSlots()) + " free of " + std::to_string(pool.numSlots()) + " slots and "
            + std::to_string(lru_[size_t(CacheLevel::kHot)][size_t(g)].live)
            + " evictable pages; evict, unpin or free pages first");
    }
    auto& events = tScratch.events;
    events.clear();
    runtime::Event* last = nullptr;
    for (size_t i = 0; i < count; ++i)
    {
        int32_t const slot = pool.take();
        collect(events, pool.ready(slot), last);
        uint32_t index;
        if (!freePages_.empty())
        {
            index = freePages_.back();
            freePages_.pop_back();
        }
        else
        {
            index = uint32_t(pages_.size());
            pages_.emplace_back();
            pages_.back().generation = generationBase_;
        }
        Page& p = pages_[index];
        p.lifeCycle = lifeCycle;
        p.level = int8_t(CacheLevel::kHot);
        p.slot = slot;
        p.tick = ++clock_;
        lruInsert(index);
        out[i] = makeId(index, p.generation);
    }
    // A new page's bytes may still be read by the transfer that vacated the slot.
    waitAll(events, stream);
}

void KvCacheManager::free(PageId const* ids, size_t count)
{
    CallGuard guard(*this, "free");
    if (++epoch_ == 0)
    {
        for (auto& p : pages_) p.mark = 0;
        epoch_ = 1;
    }
    auto& indices = tScratch.pages;
    indices.resize(count);
    for (size_t i = 0; i < count; ++i)
    {
        uint32_t const index = resolve(ids[i], i);
        if (pages_[index].mark == epoch_)
        {
            throw std::invalid_argument("pages[" + std::to_string(i) + "] (page " + hexId(ids[i]) + ") appears twice");
        }
        pages_[index].mark = epoch_;
        indices[i] = index;
    }
    for (uint32_t index : indices)
    {
        Page const& p = pages_[index];
        auto const level = CacheLevel(p.level);
        PoolGroupIndex const group = storage_->poolGroup(level, p.lifeCycle);
        SlotPool& pool = storage_->slots(level, group);
        if (level == CacheLevel::kDisk)
        {
            storage_->diskLevel()->release(group, p.slot);
        }
        pool.give(p.slot, pool.ready(p.slot));
        releasePage(index);
    }
}

MigrationResult KvCacheManager::migrate(
    PageId const* ids, size_t count, CacheLevel dst, Stream stream, std::optional<CacheLevel> requiredSource)
{
    CallGuard guard(*this, "migrate");
    checkLevel(dst, "the destination level");
    if (stream == nullptr || stream == cudaStreamLegacy)
    {
        stream = stream_; // Blocking: ordered after work on the legacy default stream.
    }
    MigrationResult result;
    if (count == 0)
    {
        return result;
    }
    if (++epoch_ == 0)
    {
        for (auto& p : pages_) p.mark = 0;
        epoch_ = 1;
    }
    Scratch& s = tScratch;
    size_t const d = size_t(dst);
    std::array<size_t, kNumLevels + 1> base{};
    for (int l = 0; l < kNumLevels; ++l)
    {
        base[size_t(l) + 1] = base[size_t(l)] + keys_[size_t(l)][d].size();
    }
    size_t const numBuckets = base[kNumLevels];

    // Resolve every page and count them per (source level, transfer key) bucket.
    s.pages.resize(count);
    s.bucket.resize(count);
    s.starts.assign(numBuckets + 1, 0);
    for (size_t i = 0; i < count; ++i)
    {
        uint32_t const index = resolve(ids[i], i);
        Page& p = pages_[index];
        if (p.mark == epoch_)
        {
            throw std::invalid_argument("pages[" + std::to_string(i) + "] (page " + hexId(ids[i]) + ") appears twice");
        }
        if (requiredSource && CacheLevel(p.level) != *requiredSource)
        {
            throw std::invalid_argument("pages[" + std::to_string(i) + "] (page " + hexId(ids[i]) + ") is at the "
                + levelName(CacheLevel(p.level)) + " level; this call moves pages from the " + levelName(*requiredSource)
                + " level only");
        }
        if (dst == CacheLevel::kDisk && CacheLevel(p.level) == CacheLevel::kDisk)
        {
            throw std::invalid_argument("pages[" + std::to_string(i) + "] (page " + hexId(ids[i])
                + ") is already at the disk level; the disk tier places its blobs itself (no relocation)");
        }
        p.mark = epoch_;
        size_t const src = size_t(p.level);
        int32_t const k = keyOf_[src][d][size_t(p.lifeCycle)];
        int32_t const b = int32_t(base[src]) + k;
        s.pages[i] = index;
        s.bucket[i] = b;
        ++s.starts[size_t(b) + 1];
    }
    for (size_t b = 0; b < numBuckets; ++b)
    {
        s.starts[b + 1] += s.starts[b];
    }
    s.fill.assign(s.starts.begin(), s.starts.end() - 1);
    s.order.resize(count);
    for (size_t i = 0; i < count; ++i)
    {
        s.order[s.fill[size_t(s.bucket[i])]++] = s.pages[i];
    }

    auto keyOfBucket = [&](size_t b) -> TransferKey const& {
        size_t src = 0;
        while (b >= base[src + 1])
        {
            ++src;
        }
        return keys_[src][d][b - base[src]];
    };

    // Checked decodes (cold -> hot with a codec that reports page statuses) write one status
    // byte per page into mapped host memory; the buffer is free here: every migration waits for
    // its checks before returning.
    checkRanges_.clear();
    checkPages_.clear();
    statusUsed_ = 0;
    if (dst == CacheLevel::kHot && storage_->checkedDecode() && count > statusCapacity_)
    {
        size_t const capacity = std::max(count, 2 * statusCapacity_);
        statusBuf_ = runtime::Allocation(*runtime_, runtime::MemoryKind::kMappedHost, capacity);
        statusCapacity_ = capacity;
    }

    // Step 1: every destination slot is allocated before any work is submitted.
    s.needs.assign(storage_->numPoolGroups(dst), 0);
    for (size_t b = 0; b < numBuckets; ++b)
    {
        if (s.starts[b + 1] > s.starts[b])
        {
            s.needs[size_t(keyOfBucket(b).dstGroup)] += s.starts[b + 1] - s.starts[b];
        }
    }
    for (size_t g = 0; g < s.needs.size(); ++g)
    {
        SlotPool& pool = storage_->slots(dst, PoolGroupIndex(g));
        if (s.needs[g] > pool.freeSlots())
        {
            throw CapacityError("cannot migrate " + std::to_string(count) + " pages to the " + levelName(dst) + " level: "
                + std::to_string(s.needs[g]) + " go to its pool group " + std::to_string(g) + ", which has "
                + std::to_string(pool.freeSlots()) + " free of " + std::to_string(pool.numSlots()) + " slots");
        }
    }
    s.dstSlots.resize(count);
    for (size_t b = 0; b < numBuckets; ++b)
    {
        if (s.starts[b + 1] == s.starts[b])
        {
            continue;
        }
        SlotPool& pool = storage_->slots(dst, keyOfBucket(b).dstGroup);
        for (size_t i = s.starts[b]; i < s.starts[b + 1]; ++i)
        {
            s.dstSlots[i] = pool.take();
        }
    }

    // Steps 2-5 per transfer (one codec call's worth of pages at most).
    for (size_t b = 0; b < numBuckets; ++b)
    {
        if (s.starts[b + 1] == s.starts[b])
        {
            continue;
        }
        TransferKey const& key = keyOfBucket(b);
        size_t const chunk = chunkPages(key);
        for (size_t pos = s.starts[b]; pos < s.starts[b + 1]; pos += chunk)
        {
            size_t n = std::min(chunk, s.starts[b + 1] - pos);
            std::string error;
            bool ok = false;
            try
            {
                ok = transfer(key, &s.order[pos], &s.dstSlots[pos], n, stream, result, error);
            }
            catch (std::exception const& e)
            {
                error = e.what();
            }
            if (ok)
            {
                continue;
            }
            // Roll back: the failed transfer's destination slots may have seen partial work, so
            // they become reusable after what is on the stream now; later slots were untouched.
            EventPtr partial;
            try
            {
                partial = runtime_->record(stream);
            }
            catch (...)
            {
                runtime_->synchronize(stream);
            }
            SlotPool& failed = storage_->slots(dst, key.dstGroup);
            for (size_t i = pos; i < pos + n; ++i)
            {
                failed.give(s.dstSlots[i], partial);
            }
            size_t rest = pos + std::min(chunk, s.starts[b + 1] - pos);
            for (size_t bb = b; bb < numBuckets; ++bb)
            {
                size_t const end = s.starts[bb + 1];
                if (end <= rest)
                {
                    continue;
                }
                SlotPool& pool = storage_->slots(dst, keyOfBucket(bb).dstGroup);
                for (size_t i = std::max(rest, s.starts[bb]); i < end; ++i)
                {
                    pool.give(s.dstSlots[i], pool.ready(s.dstSlots[i]));
                }
            }
            // Committed checked decodes are settled first: a page whose blob was bad is dropped,
            // never reported committed.
            std::string checkError;
            try
            {
                finishChecks(stream, result);
            }
            catch (std::exception const& e)
            {
                checkError = std::string(" (waiting for the committed pages' decode statuses failed too: ") + e.what() + ")";
            }
            throw MigrationFailure("migration to the " + std::string(levelName(dst)) + " level failed after "
                    + std::to_string(result.moved) + " of " + std::to_string(count) + checkError
                    + " pages were committed; the other pages stay where they were and can be retried: " + error,
                result.moved);
        }
    }
    finishChecks(stream, result);
    if (observerError_)
    {
        std::exception_ptr e = observerError_;
        observerError_ = nullptr;
        std::rethrow_exception(e);
    }
    return result;
}

void KvCacheManager::finishChecks(Stream stream, MigrationResult& result)
{
    if (checkRanges_.empty())
    {
        return;
    }
    // One wait per migration (never per page), sleeping rather than spinning; then only the
    // status bytes are read on the host, never the blobs.
    runtime_->waitBlocking(stream);
    auto const* status = reinterpret_cast<uint8_t const*>(statusBuf_.data());
    for (CheckRange const& range : checkRanges_)
    {
        for (size_t i = range.first; i < range.first + range.count; ++i)
        {
            uint8_t const st = status[i];
            if (st != kPageOk)
            {
                int const reason = st < kNumDropReasons ? int(st) : int(kPageDecodeFailed);
                dropPage(checkPages_[i], range.key.src, range.key.srcGroup, reason, result);
                // The page was counted onboarded when its decode was submitted.
                uint64_t const coldBytes = storage_->pageBytes(range.key.src, range.key.srcGroup);
                for (auto* st2 : {&stats_[size_t(range.key.src)][size_t(range.key.srcGroup)],
                         &stats_[size_t(CacheLevel::kHot)][size_t(range.key.dstGroup)]})
                {
                    --st2->pagesOnboarded;
                    st2->bytesOnboarded -= coldBytes;
                }
                --result.moved;
            }
        }
    }
    checkRanges_.clear();
    checkPages_.clear();
    statusUsed_ = 0;
}

void KvCacheManager::dropPage(
    uint32_t index, CacheLevel srcLevel, PoolGroupIndex srcGroup, int reason, MigrationResult& result)
{
    Page const& p = pages_[index];
    if (p.level >= 0)
    {
        PoolGroupIndex const g = storage_->poolGroup(CacheLevel(p.level), p.lifeCycle);
        SlotPool& pool = storage_->slots(CacheLevel(p.level), g);
        pool.give(p.slot, pool.ready(p.slot));
    }
    auto& st = stats_[size_t(srcLevel)][size_t(srcGroup)];
    ++st.pagesDropped;
    ++st.droppedBy[size_t(reason)];
    result.dropped.push_back(makeId(index, p.generation));
    releasePage(index);
}

// Defined before its callers and inline, so the migration loop inlines it.
inline void KvCacheManager::lruPush(LruQueue& q, Page& p, uint32_t index)
{
    if (q.heap.size() >= 2 * q.live + 64)
    {
        // Stale entries outnumber the live ones: sweep them out (amortized O(1) per insert).
        if (q.live == 0)
        {
            q.heap.clear(); // All stale (every page left, as after migrating a whole batch away).
        }
        else
        {
            auto const stale = [&](LruEntry const& e) { return pages_[e.index].lruStamp != e.stamp; };
            q.heap.erase(std::remove_if(q.heap.begin(), q.heap.end(), stale), q.heap.end());
            std::make_heap(q.heap.begin(), q.heap.end(), laterVictimOf<LruEntry>);
        }
    }
    LruEntry const entry{p.priority, index, p.tick, lruSerial_ + 1};
    // Sift up by hand (std::push_heap re-reads the entry it just stored): a new tick is the
    // largest of its priority, so this usually stops at the first parent.
    size_t i = q.heap.size();
    q.heap.emplace_back();
    LruEntry* heap = q.heap.data();
    while (i > 0)
    {
        size_t const parent = (i - 1) / 2;
        if (!laterVictimOf(heap[parent], entry))
        {
            break;
        }
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = entry;
    p.lruStamp = ++lruSerial_;
    ++q.live;
}

bool KvCacheManager::transfer(TransferKey const& key, uint32_t const* pages, int32_t* dstSlots, size_t& count,
    Stream stream, MigrationResult& result, std::string& error)
{
    Scratch& s = tScratch;
    SlotPool& srcPool = storage_->slots(key.src, key.srcGroup);
    SlotPool& dstPool = storage_->slots(key.dst, key.dstGroup);
    bool const fromHot = key.src == CacheLevel::kHot;
    bool const toHot = key.dst == CacheLevel::kHot;
    int32_t const envelope = storage_->config().envelopeFormatVersion;
    // A codec with a checked decode verifies each blob where it reads it and reports a status
    // per page (read once per migration in finishChecks); otherwise a declared envelope is
    // checked on the host before decoding.
    bool const checked = !fromHot && toHot && storage_->checkedDecode();
    bool const hostCheck = !fromHot && toHot && envelope >= 0 && !checked;
    auto* mutablePages = const_cast<uint32_t*>(pages);
    DiskColdLevel* disk = storage_->diskLevel();
    bool const srcDisk = key.src == CacheLevel::kDisk;
    bool const dstDisk = key.dst == CacheLevel::kDisk;
    // The pinned page ring slice of a hot <-> disk transfer: blobs are encoded into it before
    // being written, or read into it before being decoded. Released (recording its event on
    // the stream when it owns one) when this transfer returns.
    std::optional<StagingBuffer> lease;
    auto acquireRing = [&](uint64_t pageBytes, std::optional<Stream> owner) {
        StagingManager* ring = storage_->pageRing();
        size_t const bytes = size_t(count * pageBytes);
        size_t const alignment = std::min<size_t>(size_t(pageBytes & (~pageBytes + 1)), 4096);
        lease = ring->acquire(bytes, bytes, size_t(pageBytes), alignment, owner);
        if (!lease)
        {
            error = "the pinned page ring (" + std::to_string(ring->capacity()) + " bytes) has no free range of "
                + std::to_string(bytes) + " bytes";
        }
        return lease.has_value();
    };

    // Disk sources are read first, on this thread (the region's workers do the I/O): into a ring
    // slice for a decode, straight into the host-tier slots for a raw copy. A missing blob or a
    // checksum mismatch drops the page like a failed envelope check; an I/O error fails the
    // transfer with nothing changed.
    if (srcDisk)
    {
        uint64_t const pageBytes = storage_->pageBytes(key.src, key.srcGroup);
        s.blobs.resize(count);
        s.diskSlots.resize(count);
        if (toHot)
        {
            // Synchronous acquisition: the host writes the slice, so earlier decodes reading
            // these ring bytes must have finished.
            if (!acquireRing(pageBytes, std::nullopt))
            {
                return false;
            }
            for (size_t i = 0; i < count; ++i)
            {
                s.blobs[i] = lease->data() + i * pageBytes;
            }
        }
        else
        {
            std::byte* base = storage_->coldLevel(key.dst)->accessibleBase(key.dstGroup);
            for (size_t i = 0; i < count; ++i)
            {
                if (EventPtr const& e = dstPool.ready(dstSlots[i]))
                {
                    e->synchronize(); // The host writes the slot.
                }
                s.blobs[i] = base + uint64_t(dstSlots[i]) * pageBytes;
            }
        }
        for (size_t i = 0; i < count; ++i)
        {
            s.diskSlots[i] = pages_[pages[i]].slot;
        }
        disk->read(key.srcGroup, s.diskSlots.data(), s.blobs.data(), count, s.status, s.messages);
        for (size_t i = 0; i < count; ++i)
        {
            disk::StatusCode const c = s.status[i];
            if (c != disk::StatusCode::kOk && c != disk::StatusCode::kNotFound
                && c != disk::StatusCode::kChecksumMismatch)
            {
                error = "disk read of cold pool group " + std::to_string(key.srcGroup) + " failed ("
                    + disk::statusName(c) + "): " + s.messages[i];
                return false;
            }
        }
        s.leaseIndex.resize(count);
        size_t kept = 0;
        for (size_t i = 0; i < count; ++i)
        {
            uint32_t const index = pages[i];
            Page const& p = pages_[index];
            bool good = s.status[i] == disk::StatusCode::kOk;
            int reason = s.status[i] == disk::StatusCode::kNotFound ? kDropDiskMissing : kDropDiskChecksum;
            if (good && hostCheck)
            {
                reason = int(checkColdPageEnvelope(s.blobs[i], pageBytes, uint16_t(envelope)));
                good = reason == int(EnvelopeStatus::kOk);
            }
            if (good)
            {
                mutablePages[kept] = index;
                dstSlots[kept] = dstSlots[i];
                s.leaseIndex[kept] = uint32_t(i);
                ++kept;
                continue;
            }
            disk->release(key.srcGroup, p.slot);
            dstPool.give(dstSlots[i], dstPool.ready(dstSlots[i]));
            dropPage(index, key.src, key.srcGroup, reason, result);
        }
        count = kept;
        if (count == 0)
        {
            return true;
        }
    }

    // Without a checked decode, a declared envelope is checked on the host before decoding: a
    // blob that did not fit or fails its checksum is dropped (the page becomes a miss), never
    // decoded. The host reads the blobs, so the transfers that wrote them must have finished:
    // one wait per distinct event, then the fast CRC over each blob.
    if (hostCheck && !srcDisk)
    {
        ColdLevel* cold = storage_->coldLevel(key.src);
        uint64_t const blobBytes = cold->pageBytes(key.srcGroup);
        s.events.clear();
        runtime::Event* last = nullptr;
        for (size_t i = 0; i < count; ++i)
        {
            collect(s.events, srcPool.ready(pages_[pages[i]].slot), last);
        }
        waitAll(s.events, std::nullopt);
        size_t kept = 0;
        for (size_t i = 0; i < count; ++i)
        {
            uint32_t const index = pages[i];
            Page const& p = pages_[index];
            std::byte const* blob = cold->hostBlob(key.srcGroup, p.slot);
            EnvelopeStatus const st
                = blob == nullptr ? EnvelopeStatus::kOk : checkColdPageEnvelope(blob, blobBytes, uint16_t(envelope));
            if (st == EnvelopeStatus::kOk)
            {
                mutablePages[kept] = index;
                dstSlots[kept] = dstSlots[i];
                ++kept;
                continue;
            }
            dstPool.give(dstSlots[i], dstPool.ready(dstSlots[i]));
            dropPage(index, key.src, key.srcGroup, int(st), result);
        }
        count = kept;
        if (count == 0)
        {
            return true;
        }
    }

    // Room for step 5's queue entries, taken before anything is submitted (step 5 cannot fail).
    {
        auto& heap = lru_[size_t(key.dst)][size_t(key.dstGroup)].heap;
        if (heap.capacity() < heap.size() + count)
        {
            heap.reserve(std::max(heap.size() + count, 2 * heap.capacity()));
        }
    }

    // Step 2: the stream waits for the source pages and the destination slots.
    s.events.clear();
    s.pairs.resize(count);
    runtime::Event* lastSrc = nullptr;
    runtime::Event* lastDst = nullptr;
    for (size_t i = 0; i < count; ++i)
    {
        int32_t const srcSlot = pages_[pages[i]].slot;
        collect(s.events, srcPool.ready(srcSlot), lastSrc);
        collect(s.events, dstPool.ready(dstSlots[i]), lastDst);
        s.pairs[i] = {dstSlots[i], srcSlot};
    }
    waitAll(s.events, stream);

    // Step 3: submit, then record the one finish event.
    uint8_t* status = checked ? reinterpret_cast<uint8_t*>(statusBuf_.data()) + statusUsed_ : nullptr;
    bool ok;
    double seconds = 0;
    uint64_t const callsBefore = storage_->codecCalls();
    if (fromHot && dstDisk)
    {
        // Hot -> disk: encode into a ring slice on the stream, wait for the encode on the host
        // (correctness first: the region's workers read the slice), then write the blobs.
        uint64_t const pageBytes = storage_->pageBytes(key.dst, key.dstGroup);
        ok = acquireRing(pageBytes, stream);
        if (ok)
        {
            s.codecPairs.resize(count);
            s.blobs.resize(count);
            for (size_t i = 0; i < count; ++i)
            {
                s.codecPairs[i] = {int32_t(i), s.pairs[i].src};
                s.blobs[i] = lease->data() + i * pageBytes;
            }
            auto const t0 = std::chrono::steady_clock::now();
            ok = storage_->transcode(true, key.rep, lease->data(), s.codecPairs.data(), count, stream, error);
            seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        if (ok)
        {
            if (EventPtr const encoded = runtime_->record(stream))
            {
                encoded->synchronize(); // (The host backend returns no event: its work is done.)
            }
            for (size_t i = 0; i < count; ++i)
            {
                disk->assign(key.dstGroup, dstSlots[i], contentKey(pages[i]), pages_[pages[i]].lifeCycle);
            }
            ok = disk->write(key.dstGroup, dstSlots, s.blobs.data(), count, error);
        }
    }
    else if (srcDisk && toHot)
    {
        // Disk -> hot: decode from the ring slice the blobs were read into.
        s.codecPairs.resize(count);
        for (size_t i = 0; i < count; ++i)
        {
            s.codecPairs[i] = {dstSlots[i], int32_t(s.leaseIndex[i])};
        }
        lease->setStream(stream);
        auto const t0 = std::chrono::steady_clock::now();
        ok = storage_->transcode(false, key.rep, lease->data(), s.codecPairs.data(), count, stream, error, status);
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    else if (srcDisk)
    {
        ok = true; // Disk -> host: the raw blobs were read into the host-tier slots above.
    }
    else if (dstDisk)
    {
        // Host -> disk: raw blob copy straight from the host-tier slots (the level synchronizes
        // the stream first: the slots' last transfers must have finished).
        for (size_t i = 0; i < count; ++i)
        {
            disk->assign(key.dstGroup, dstSlots[i], contentKey(pages[i]), pages_[pages[i]].lifeCycle);
        }
        ok = storage_->copyCold(key.src, key.srcGroup, key.dst, key.dstGroup, s.pairs.data(), count, stream, error);
    }
    else if (fromHot != toHot)
    {
        ColdLevel* cold = storage_->coldLevel(fromHot ? key.dst : key.src);
        std::byte* coldBase = cold->accessibleBase(fromHot ? key.dstGroup : key.srcGroup);
        if (coldBase == nullptr)
        {
            error = std::string("the ") + levelName(cold->level()) + " level is not GPU-accessible; the codec cannot "
                + "address it without a staging hop";
            return false;
        }
        auto const t0 = std::chrono::steady_clock::now();
        ok = storage_->transcode(fromHot, key.rep, coldBase, s.pairs.data(), count, stream, error, status);
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    else if (fromHot)
    {
        ok = storage_->copyHot(key.srcGroup, s.pairs.data(), count, stream, error);
    }
    else
    {
        ok = storage_->copyCold(key.src, key.srcGroup, key.dst, key.dstGroup, s.pairs.data(), count, stream, error);
    }
    if (!ok)
    {
        return false;
    }
    EventPtr const finish = runtime_->record(stream);
    noteEvent(stream, finish);

    // Step 4: attach the event to the destination slots (the source slots get it when released
    // in step 5); notify observers.
    for (size_t i = 0; i < count; ++i)
    {
        dstPool.setReady(dstSlots[i], finish);
    }
    uint64_t const dstPageBytes = storage_->pageBytes(key.dst, key.dstGroup);
    uint64_t const calls = storage_->codecCalls() - callsBefore;
    auto& srcStats = stats_[size_t(key.src)][size_t(key.srcGroup)];
    auto& dstStats = stats_[size_t(key.dst)][size_t(key.dstGroup)];
    if (fromHot && !toHot)
    {
        for (auto* st : {&srcStats, &dstStats})
        {
            st->pagesOffloaded += count;
            st->bytesOffloaded += count * dstPageBytes;
            st->codecCalls += calls;
            st->codecSeconds += seconds;
        }
    }
    else if (!fromHot && toHot)
    {
        uint64_t const coldBytes = storage_->pageBytes(key.src, key.srcGroup);
        for (auto* st : {&srcStats, &dstStats})
        {
            st->pagesOnboarded += count;
            st->bytesOnboarded += count * coldBytes;
            st->codecCalls += calls;
            st->codecSeconds += seconds;
        }
    }
    else
    {
        dstStats.pagesCopied += count;
    }
    if (!observers_.empty())
    {
        notify({key.src, key.dst, key.srcGroup, key.dstGroup, key.rep, count, count * dstPageBytes});
    }

    // Step 5: ownership moves to the destination; the source slots are released. Every page
    // leaves the source group's eviction queue and joins the destination group's (unless pinned).
    LruQueue& srcQueue = lru_[size_t(key.src)][size_t(key.srcGroup)];
    LruQueue& dstQueue = lru_[size_t(key.dst)][size_t(key.dstGroup)];
    bool const hotter = key.dst < key.src;
    for (size_t i = 0; i < count; ++i)
    {
        Page& p = pages_[pages[i]];
        if (srcDisk)
        {
            disk->release(key.srcGroup, p.slot);
        }
        srcPool.give(p.slot, finish);
        if (p.lruStamp != 0)
        {
            p.lruStamp = 0;
            --srcQueue.live;
        }
        p.level = int8_t(key.dst);
        p.slot = dstSlots[i];
        if (hotter)
        {
            p.tick = ++clock_; // Brought hotter to be used; an eviction keeps the page's age.
        }
        if (p.pins == 0)
        {
            lruPush(dstQueue, p, pages[i]);
        }
    }
    result.moved += count;
    if (checked)
    {
        checkRanges_.push_back({key, statusUsed_, count});
        checkPages_.insert(checkPages_.end(), pages, pages + count);
        statusUsed_ += count;
    }
    return true;
}

size_t KvCacheManager::chunkPages(TransferKey const& key) const noexcept
{
    bool const hotDisk = (key.src == CacheLevel::kHot && key.dst == CacheLevel::kDisk)
        || (key.src == CacheLevel::kDisk && key.dst == CacheLevel::kHot);
    if (!hotDisk)
    {
        return kMaxPairsPerCall;
    }
    // One ring slice per transfer, at most half the ring: with no lease live between transfers
    // a slice this size always fits (the ring holds at least three of the largest cold pages).
    PoolGroupIndex const g = key.src == CacheLevel::kDisk ? key.srcGroup : key.dstGroup;
    uint64_t const pageBytes = storage_->pageBytes(CacheLevel::kDisk, g);
    uint64_t const pages = storage_->pageRing()->capacity() / pageBytes / 2;
    return size_t(std::max<uint64_t>(1, std::min<uint64_t>(pages, kMaxPairsPerCall)));
}

std::string const& KvCacheManager::contentKey(uint32_t index) const noexcept
{
    static std::string const none;
    auto const it = pageKeys_.find(index);
    return it == pageKeys_.end() ? none : it->second;
}

void KvCacheManager::setKey(PageId id, std::string const& key)
{
    CallGuard guard(*this, "setKey");
    uint32_t const index = resolve(id, 0);
    if (key.size() > 254)
    {
        throw std::invalid_argument("key is " + std::to_string(key.size()) + " bytes; content keys are 1..254 bytes");
    }
    if (CacheLevel(pages_[index].level) == CacheLevel::kDisk)
    {
        throw std::invalid_argument("page " + hexId(id) + " is at the disk level, written under its key; set the key "
            + "before the page goes to disk");
    }
    if (!key.empty())
    {
        auto const owner = keyOwner_.find(key);
        if (owner != keyOwner_.end() && owner->second != index)
        {
            throw std::invalid_argument("key is already the content key of live page "
                + hexId(makeId(owner->second, pages_[owner->second].generation)) + "; keys are unique among live pages");
        }
    }
    auto const old = pageKeys_.find(index);
    if (old != pageKeys_.end())
    {
        keyOwner_.erase(old->second);
        pageKeys_.erase(old);
    }
    if (!key.empty())
    {
        pageKeys_.emplace(index, key);
        keyOwner_.emplace(key, index);
    }
}

std::string KvCacheManager::key(PageId id) const
{
    CallGuard guard(*this, "key");
    return contentKey(resolve(id, 0));
}

void KvCacheManager::findOnDisk(std::string const* keys, size_t count, PageId* out)
{
    CallGuard guard(*this, "findOnDisk");
    checkLevel(CacheLevel::kDisk, "findOnDisk's level");
    DiskColdLevel* disk = storage_->diskLevel();
    for (size_t i = 0; i < count; ++i)
    {
        out[i] = 0;
        auto const owner = keyOwner_.find(keys[i]);
        if (owner != keyOwner_.end())
        {
            Page const& p = pages_[owner->second];
            if (CacheLevel(p.level) == CacheLevel::kDisk)
            {
                out[i] = makeId(owner->second, p.generation);
            }
            continue; // A live page elsewhere holds the key; a disk blob under it was replaced.
        }
        auto const found = disk->claim(keys[i]);
        if (!found)
        {
            continue;
        }
        uint32_t index;
        if (!freePages_.empty())
        {
            index = freePages_.back();
            freePages_.pop_back();
        }
        else
        {
            index = uint32_t(pages_.size());
            pages_.emplace_back();
            pages_.back().generation = generationBase_;
        }
        Page& p = pages_[index];
        p.lifeCycle = found->lifeCycle;
        p.level = int8_t(CacheLevel::kDisk);
        p.slot = found->slot;
        p.tick = ++clock_;
        lruInsert(index);
        pageKeys_.emplace(index, keys[i]);
        keyOwner_.emplace(keys[i], index);
        out[i] = makeId(index, p.generation);
    }
}

size_t KvCacheManager::forgetUnclaimedOnDisk()
{
    CallGuard guard(*this, "forgetUnclaimedOnDisk");
    checkLevel(CacheLevel::kDisk, "forgetUnclaimedOnDisk's level");
    return storage_->diskLevel()->forgetUnclaimed();
}

size_t KvCacheManager::unclaimedOnDisk() const
{
    CallGuard guard(*this, "unclaimedOnDisk");
    DiskColdLevel const* disk = storage_->diskLevel();
    return disk ? disk->numUnclaimed() : 0;
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

void KvCacheManager::lruInsert(uint32_t index)
{
    lruErase(index); // At most one live entry per page.
    Page& p = pages_[index];
    if (p.level < 0 || p.pins > 0)
    {
        return;
    }
    auto const level = CacheLevel(p.level);
    lruPush(lru_[size_t(level)][size_t(storage_->poolGroup(level, p.lifeCycle))], p, index);
}

void KvCacheManager::lruErase(uint32_t index) noexcept
{
    Page& p = pages_[index];
    if (p.lruStamp == 0)
    {
        return;
    }
    p.lruStamp = 0; // Its entry is stale from now on.
    auto const level = CacheLevel(p.level);
    auto& groups = lru_[size_t(level)];
    auto const g = size_t(storage_->mapping(level).empty() ? -1 : storage_->poolGroup(level, p.lifeCycle));
    if (g < groups.size())
    {
        --groups[g].live;
    }
}

void KvCacheManager::lruVictims(LruQueue& q, size_t count, std::vector<uint32_t>& out)
{
    // Pops the next live entries (dropping the stale ones met on the way), then pushes the live
    // ones back: the queue keeps every page until a migration actually moves it out.
    out.clear();
    out.reserve(count);
    thread_local std::vector<LruEntry> taken;
    taken.clear();
    taken.reserve(count);
    while (taken.size() < count && !q.heap.empty())
    {
        std::pop_heap(q.heap.begin(), q.heap.end(), laterVictimOf<LruEntry>);
        LruEntry const e = q.heap.back();
        q.heap.pop_back();
        if (pages_[e.index].lruStamp == e.stamp)
        {
            taken.push_back(e);
            out.push_back(e.index);
        }
    }
    for (LruEntry const& e : taken)
    {
        q.heap.push_back(e); // Within the capacity just popped: cannot throw.
        std::push_heap(q.heap.begin(), q.heap.end(), laterVictimOf<LruEntry>);
    }
}

std::optional<CacheLevel> KvCacheManager::colderLevel(CacheLevel level) const noexcept
{
    for (int l = int(level) + 1; l < kNumLevels; ++l)
    {
        if (storage_->hasLevel(CacheLevel(l)))
        {
            return CacheLevel(l);
        }
    }
    return std::nullopt;
}

void KvCacheManager::touch(PageId const* ids, size_t count)
{
    CallGuard guard(*this, "touch");
    for (size_t i = 0; i < count; ++i)
    {
        resolve(ids[i], i); // All checked before any changes.
    }
    for (size_t i = 0; i < count; ++i)
    {
        uint32_t const index = uint32_t(ids[i] & 0xffffffffu);
        lruErase(index);
        Page& p = pages_[index];
        p.tick = ++clock_;
        lruInsert(index);
        ++stats_[size_t(p.level)][size_t(storage_->poolGroup(CacheLevel(p.level), p.lifeCycle))].hits;
    }
}

void KvCacheManager::pin(PageId const* ids, size_t count, bool pinned)
{
    CallGuard guard(*this, "pin");
    for (size_t i = 0; i < count; ++i)
    {
        uint32_t const index = resolve(ids[i], i);
        if (!pinned && pages_[index].pins == 0)
        {
            throw std::invalid_argument("pages[" + std::to_string(i) + "] (page " + hexId(ids[i])
                + ") is not pinned; unpin only pages pinned before (pins nest)");
        }
    }
    for (size_t i = 0; i < count; ++i)
    {
        uint32_t const index = uint32_t(ids[i] & 0xffffffffu);
        Page& p = pages_[index];
        if (pinned)
        {
            lruErase(index);
            ++p.pins;
        }
        else if (--p.pins == 0)
        {
            lruInsert(index);
        }
    }
}

void KvCacheManager::setPriority(PageId const* ids, size_t count, int32_t priority)
{
    CallGuard guard(*this, "setPriority");
    for (size_t i = 0; i < count; ++i)
    {
        resolve(ids[i], i);
    }
    for (size_t i = 0; i < count; ++i)
    {
        uint32_t const index = uint32_t(ids[i] & 0xffffffffu);
        lruErase(index);
        pages_[index].priority = priority;
        lruInsert(index);
    }
}

uint32_t KvCacheManager::pins(PageId id) const
{
    CallGuard guard(*this, "pins");
    return pages_[resolve(id, 0)].pins;
}

size_t KvCacheManager::evictable(CacheLevel level, PoolGroupIndex group) const
{
    CallGuard guard(*this, "evictable");
    checkLevel(level, "level");
    if (group < 0 || size_t(group) >= lru_[size_t(level)].size())
    {
        throw std::invalid_argument("pool group is " + std::to_string(group) + "; the " + levelName(level)
            + " level has " + std::to_string(lru_[size_t(level)].size()) + " pool groups");
    }
    return lru_[size_t(level)][size_t(group)].live;
}

void KvCacheManager::makeRoom(CacheLevel level, PoolGroupIndex group, uint64_t freeSlots, std::optional<Stream> stream)
{
    CallGuard guard(*this, "makeRoom");
    size_t const candidates = evictable(level, group);
    SlotPool& pool = storage_->slots(level, group);
    if (pool.freeSlots() >= freeSlots)
    {
        return;
    }
    uint64_t const need = freeSlots - pool.freeSlots();
    if (candidates < need)
    {
        throw CapacityError(std::string("cannot free ") + std::to_string(freeSlots) + " slots in the " + levelName(level)
            + " level's pool group " + std::to_string(group) + ": it has " + std::to_string(pool.freeSlots())
            + " free of " + std::to_string(pool.numSlots()) + " slots and " + std::to_string(candidates)
            + " evictable pages (the others are pinned)");
    }
    // Victims are copied out first: the cascade below changes other levels' orders only.
    std::vector<uint32_t> victims;
    lruVictims(lru_[size_t(level)][size_t(group)], size_t(need), victims);
    auto& stats = stats_[size_t(level)][size_t(group)];
    std::optional<CacheLevel> const next = colderLevel(level);
    if (!next)
    {
        // The last level drops: the page is gone, its handles stale (the engine sees a miss).
        for (uint32_t index : victims)
        {
            Page const& p = pages_[index];
            if (level == CacheLevel::kDisk)
            {
                storage_->diskLevel()->release(group, p.slot);
            }
            pool.give(p.slot, pool.ready(p.slot));
            releasePage(index);
        }
        stats.drops += need;
        return;
    }
    std::vector<uint64_t> needs(storage_->numPoolGroups(*next), 0);
    for (uint32_t index : victims)
    {
        ++needs[size_t(storage_->poolGroup(*next, pages_[index].lifeCycle))];
    }
    for (size_t g = 0; g < needs.size(); ++g)
    {
        if (needs[g] > 0)
        {
            makeRoom(*next, PoolGroupIndex(g), needs[g], stream);
        }
    }
    std::vector<PageId> ids;
    ids.reserve(victims.size());
    for (uint32_t index : victims)
    {
        ids.push_back(makeId(index, pages_[index].generation));
    }
    // The normal migration transaction; ordered after the caller's work on `stream`.
    MigrationResult const moved = migrate(ids.data(), ids.size(), *next, stream ? *stream : stream_);
    stats.evictions += moved.moved;
}

void KvCacheManager::checkResizable(CacheLevel level, char const* what) const
{
    (void)what;
    checkLevel(level, "level"); // Every level the manager has can be resized and defragmented.
}

uint64_t KvCacheManager::hotCapacitySlots(PoolGroupIndex group) const
{
    CallGuard guard(*this, "hotCapacitySlots");
    auto const& groups = storage_->hotGroups();
    if (group < 0 || size_t(group) >= groups.size())
    {
        throw std::invalid_argument("pool group is " + std::to_string(group) + "; the hot level has "
            + std::to_string(groups.size()) + " pool groups");
    }
    return groups[size_t(group)].capacitySlots;
}

uint64_t KvCacheManager::compact(CacheLevel level, std::vector<uint64_t> const& limits, Stream stream)
{
    // Page indices in slots at or above their group's limit; every other free slot of the group
    // is withheld so the relocation can only land below the limit.
    std::vector<PageId> ids;
    for (uint32_t index = 0; index < pages_.size(); ++index)
    {
        Page const& p = pages_[index];
        if (p.level == int8_t(level)
            && uint64_t(p.slot) >= limits[size_t(storage_->poolGroup(level, p.lifeCycle))])
        {
            ids.push_back(makeId(index, p.generation));
        }
    }
    if (ids.empty())
    {
        return 0;
    }
    size_t const groups = storage_->numPoolGroups(level);
    for (size_t g = 0; g < groups; ++g)
    {
        storage_->slots(level, PoolGroupIndex(g)).withhold(limits[g]);
    }
    MigrationResult moved;
    try
    {
        moved = migrate(ids.data(), ids.size(), level, stream);
    }
    catch (...)
    {
        for (size_t g = 0; g < groups; ++g)
        {
            storage_->slots(level, PoolGroupIndex(g)).restore();
        }
        throw;
    }
    for (size_t g = 0; g < groups; ++g)
    {
        storage_->slots(level, PoolGroupIndex(g)).restore();
    }
    return moved.moved;
}

void KvCacheManager::resize(CacheLevel level, uint64_t quotaBytes, std::optional<Stream> stream)
{
    CallGuard guard(*this, "resize");
    checkResizable(level, "resize");
    if (quotaBytes == 0)
    {
        throw std::invalid_argument(std::string("quota_bytes is 0; a level's quota must be positive (the ")
            + levelName(level) + " level cannot be removed at run time)");
    }
    if (level == CacheLevel::kDisk)
    {
        resizeDisk(quotaBytes, stream ? *stream : stream_);
        return;
    }
    std::vector<uint64_t> const target = storage_->projectSlots(level, quotaBytes);
    size_t const groups = storage_->numPoolGroups(level);
    // Everything is checked before anything changes.
    for (size_t g = 0; g < groups; ++g)
    {
        SlotPool& pool = storage_->slots(level, PoolGroupIndex(g));
        if (level == CacheLevel::kHot && target[g] > storage_->hotGroups()[g].capacitySlots)
        {
            throw std::invalid_argument("quota_bytes is " + std::to_string(quotaBytes) + ": hot pool group "
                + std::to_string(g) + " would need " + std::to_string(target[g]) + " slots but its pools were reserved for "
                + std::to_string(storage_->hotGroups()[g].capacitySlots) + " (config.maxGpuQuotaBytes is "
                + std::to_string(std::max(storage_->config().maxGpuQuotaBytes, storage_->config().gpuQuotaBytes))
                + "); the hot pools never move, so raise max_gpu_quota at construction");
        }
        uint64_t const used = pool.usedSlots();
        size_t const candidates = lru_[size_t(level)][g].live;
        if (used > target[g] && used - target[g] > candidates)
        {
            throw CapacityError("cannot resize the " + std::string(levelName(level)) + " level to " + std::to_string(quotaBytes)
                + " bytes: its pool group " + std::to_string(g) + " would have " + std::to_string(target[g])
                + " slots but holds " + std::to_string(used) + " pages of which only " + std::to_string(candidates)
                + " are evictable (the others are pinned); nothing was changed");
        }
    }
    Stream const s = stream ? *stream : stream_;
    // Shrinking: evict what no longer fits, then move the pages beyond the new count below it.
    bool shrinks = false;
    for (size_t g = 0; g < groups; ++g)
    {
        SlotPool& pool = storage_->slots(level, PoolGroupIndex(g));
        if (target[g] < pool.numSlots())
        {
            shrinks = true;
            makeRoom(level, PoolGroupIndex(g), pool.numSlots() - target[g], s);
        }
    }
    if (shrinks)
    {
        std::vector<uint64_t> limits(groups);
        for (size_t g = 0; g < groups; ++g)
        {
            limits[g] = std::min(target[g], storage_->slots(level, PoolGroupIndex(g)).numSlots());
        }
        compact(level, limits, s);
    }
    for (size_t g = 0; g < groups; ++g)
    {
        if (level == CacheLevel::kHot)
        {
            storage_->hotGroup(PoolGroupIndex(g)).slots.setNumSlots(target[g]);
        }
        else if (target[g] != storage_->slots(level, PoolGroupIndex(g)).numSlots())
        {
            storage_->hostLevel()->resize(PoolGroupIndex(g), target[g]);
        }
    }
    storage_->setQuota(level, quotaBytes);
}

uint64_t KvCacheManager::defragment(CacheLevel level, std::optional<Stream> stream)
{
    CallGuard guard(*this, "defragment");
    checkResizable(level, "defragment");
    if (level == CacheLevel::kDisk)
    {
        return defragmentDisk();
    }
    size_t const groups = storage_->numPoolGroups(level);
    std::vector<uint64_t> limits(groups);
    for (size_t g = 0; g < groups; ++g)
    {
        limits[g] = storage_->slots(level, PoolGroupIndex(g)).usedSlots();
    }
    uint64_t const moved = compact(level, limits, stream ? *stream : stream_);
    for (size_t g = 0; g < groups; ++g)
    {
        SlotPool& pool = storage_->slots(level, PoolGroupIndex(g));
        pool.setNumSlots(pool.numSlots()); // The free list restarts at the lowest free slot.
    }
    return moved;
}

void KvCacheManager::renumberDisk(std::vector<uint64_t> const& limits)
{
    // Logical slots only: a disk page's bytes live wherever its region put them, under its key.
    DiskColdLevel* disk = storage_->diskLevel();
    size_t const groups = limits.size();
    std::vector<std::vector<int32_t>> vacated(groups);
    for (size_t g = 0; g < groups; ++g)
    {
        disk->slots(PoolGroupIndex(g)).withhold(limits[g]);
    }
    for (uint32_t index = 0; index < pages_.size(); ++index)
    {
        Page& p = pages_[index];
        if (p.level != int8_t(CacheLevel::kDisk))
        {
            continue;
        }
        auto const g = size_t(storage_->poolGroup(CacheLevel::kDisk, p.lifeCycle));
        if (uint64_t(p.slot) < limits[g])
        {
            continue;
        }
        SlotPool& pool = disk->slots(PoolGroupIndex(g));
        int32_t const to = pool.take(); // Free slots below the limit >= pages above it (checked by the caller).
        disk->moveSlot(PoolGroupIndex(g), p.slot, to);
        vacated[g].push_back(p.slot);
        p.slot = to;
    }
    for (size_t g = 0; g < groups; ++g)
    {
        std::vector<int32_t> const more = disk->renumberUnclaimed(PoolGroupIndex(g), limits[g]);
        vacated[g].insert(vacated[g].end(), more.begin(), more.end());
        SlotPool& pool = disk->slots(PoolGroupIndex(g));
        pool.restore();
        for (int32_t s : vacated[g])
        {
            pool.give(s, nullptr);
        }
    }
}

void KvCacheManager::resizeDisk(uint64_t quotaBytes, Stream stream)
{
    DiskColdLevel* disk = storage_->diskLevel();
    std::vector<uint64_t> const target = disk->slotsFor(quotaBytes);
    size_t const groups = disk->numPoolGroups();
    size_t const level = size_t(CacheLevel::kDisk);
    for (size_t g = 0; g < groups; ++g)
    {
        SlotPool& pool = disk->slots(PoolGroupIndex(g));
        uint64_t const used = pool.usedSlots();
        size_t const candidates = lru_[level][g].live + disk->numUnclaimed(PoolGroupIndex(g));
        if (used > target[g] && used - target[g] > candidates)
        {
            throw CapacityError("cannot resize the disk level to " + std::to_string(quotaBytes) + " bytes: its pool group "
                + std::to_string(g) + " would have " + std::to_string(target[g]) + " slots but holds "
                + std::to_string(used) + " pages of which only " + std::to_string(candidates)
                + " are evictable (the others are pinned); nothing was changed");
        }
    }
    // The disk is the last level: what does not fit is dropped, unclaimed pages found at open
    // first (nobody asked for them), then the least recently used (counted in drops).
    std::vector<uint64_t> limits(groups);
    for (size_t g = 0; g < groups; ++g)
    {
        SlotPool& pool = disk->slots(PoolGroupIndex(g));
        if (target[g] < pool.numSlots())
        {
            uint64_t const need = pool.numSlots() - target[g];
            if (pool.freeSlots() < need)
            {
                disk->dropUnclaimed(PoolGroupIndex(g), size_t(need - pool.freeSlots()));
            }
            makeRoom(CacheLevel::kDisk, PoolGroupIndex(g), need, stream);
        }
        limits[g] = std::min(target[g], pool.numSlots());
    }
    renumberDisk(limits);
    disk->resize(quotaBytes);
}

uint64_t KvCacheManager::defragmentDisk()
{
    DiskColdLevel* disk = storage_->diskLevel();
    size_t const groups = disk->numPoolGroups();
    std::vector<uint64_t> limits(groups);
    for (size_t g = 0; g < groups; ++g)
    {
        limits[g] = disk->slots(PoolGroupIndex(g)).usedSlots();
    }
    renumberDisk(limits);
    for (size_t g = 0; g < groups; ++g)
    {
        SlotPool& pool = disk->slots(PoolGroupIndex(g));
        pool.setNumSlots(pool.numSlots()); // The free list restarts at the lowest free slot.
    }
    return disk->defragment();
}

void KvCacheManager::closeDisk()
{
    CallGuard guard(*this, "closeDisk");
    synchronizeAll();
    lru_[size_t(CacheLevel::kDisk)].clear();
    storage_->closeDisk();
    closed_ = true; // Every later call (from any thread) is refused.
}

void KvCacheManager::synchronize()
{
    CallGuard guard(*this, "synchronize");
    synchronizeAll();
}

void KvCacheManager::synchronizeAll()
{
    for (auto& [s, e] : lastEvents_)
    {
        e->synchronize();
    }
    lastEvents_.clear();
}

} // namespace kvcodec::kvcm

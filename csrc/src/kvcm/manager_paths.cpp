// SPDX-License-Identifier: Apache-2.0
//
// The migration paths. A transfer's path is chosen once, when the transfer keys are built, from
// a table indexed by the kinds of its source and destination levels (hot, an addressable cold
// level, a staged cold level: ColdAccess); each path is one function. Every path ends in the
// same steps: the stream waits for the source pages and the destination slots (step 2), the
// path submits its work (step 3), and commit() records the finish event, counts, notifies and
// moves ownership (steps 4-5). Nothing here names a concrete level.
#include "kvcm/manager.h"

#include <algorithm>
#include <chrono>

#include "kvcm/manager_internal.h"
#include "runtime/log.h"
#include "runtime/nvtx.h"

namespace kvcodec::kvcm {

using detail::collect;
using detail::waitAll;

namespace detail {

Scratch& scratch() noexcept
{
    thread_local Scratch s;
    return s;
}

} // namespace detail

namespace {

enum PathId : uint8_t
{
    kCopyHot,           ///< hot -> hot: per-pool copies inside a hot pool group.
    kEncodeAddressable, ///< hot -> addressable: the codec encodes into the level's blobs.
    kEncodeStaged,      ///< hot -> staged: encode into a staging slice, then write the blobs.
    kDecodeAddressable, ///< addressable -> hot: the codec decodes the level's blobs.
    kCopyAddressable,   ///< addressable -> addressable: raw blob copies.
    kWriteStaged,       ///< addressable -> staged: write the blobs straight from the source slots.
    kDecodeStaged,      ///< staged -> hot: read into a staging slice, then decode it.
    kReadAddressable,   ///< staged -> addressable: read straight into the destination slots.
    kNumPaths,
};

} // namespace

uint8_t KvCacheManager::pathFor(LevelKind src, LevelKind dst) noexcept
{
    // A staged level has no path to itself: it places its blobs itself (no relocation).
    static constexpr uint8_t kTable[kNumKinds][kNumKinds] = {
        /* hot         -> */ {kCopyHot, kEncodeAddressable, kEncodeStaged},
        /* addressable -> */ {kDecodeAddressable, kCopyAddressable, kWriteStaged},
        /* staged      -> */ {kDecodeStaged, kReadAddressable, kNoPath},
    };
    return kTable[size_t(src)][size_t(dst)];
}

size_t KvCacheManager::chunkPages(TransferKey const& key) const noexcept
{
    if (key.path != kEncodeStaged && key.path != kDecodeStaged)
    {
        return kMaxPairsPerCall;
    }
    // One staging slice per transfer, sized so that it always fits with no other slice live.
    bool const toStaged = key.path == kEncodeStaged;
    ColdLevel const* staged = storage_->coldLevel(toStaged ? key.dst : key.src);
    uint64_t const pages = staged->maxStagedPages(toStaged ? key.dstGroup : key.srcGroup);
    return size_t(std::max<uint64_t>(1, std::min<uint64_t>(pages, kMaxPairsPerCall)));
}

bool KvCacheManager::transfer(TransferKey const& key, uint32_t* pages, int32_t* dstSlots, size_t& count, Stream stream,
    MigrationResult& result, std::string& error)
{
    static constexpr Path kPaths[kNumPaths] = {&KvCacheManager::copyHotToHot, &KvCacheManager::encodeToAddressable,
        &KvCacheManager::encodeToStaged, &KvCacheManager::decodeFromAddressable, &KvCacheManager::copyAddressable,
        &KvCacheManager::writeToStaged, &KvCacheManager::decodeFromStaged, &KvCacheManager::readToAddressable};
    bool const toHot = key.dst == CacheLevel::kHot;
    bool const fromHot = key.src == CacheLevel::kHot;
    int32_t const envelope = storage_->config().envelopeFormatVersion;
    // A codec with a checked decode verifies each blob where it reads it and reports a status
    // per page (read once per migration in finishChecks); otherwise a declared envelope is
    // checked on the host before decoding.
    bool const checked = !fromHot && toHot && storage_->checkedDecode();
    Transfer t{key, pages, dstSlots, count, stream, result, error, storage_->slots(key.src, key.srcGroup),
        storage_->slots(key.dst, key.dstGroup), !fromHot && toHot && envelope >= 0 && !checked, uint16_t(envelope),
        checked ? reinterpret_cast<uint8_t*>(statusBuf_.data()) + statusUsed_ : nullptr, checked, 0, std::nullopt};
    // NVTX range names by (source, destination) level: static strings, nothing built per call.
    static char const* const kRanges[kNumLevels][kNumLevels]
        = {{"kvcodec transfer hot->hot", "kvcodec transfer hot->host", "kvcodec transfer hot->disk",
               "kvcodec transfer hot->remote"},
            {"kvcodec transfer host->hot", "kvcodec transfer host->host", "kvcodec transfer host->disk",
                "kvcodec transfer host->remote"},
            {"kvcodec transfer disk->hot", "kvcodec transfer disk->host", "kvcodec transfer disk->disk",
                "kvcodec transfer disk->remote"},
            {"kvcodec transfer remote->hot", "kvcodec transfer remote->host", "kvcodec transfer remote->disk",
                "kvcodec transfer remote->remote"}};
    nvtx::Range range(kRanges[size_t(key.src)][size_t(key.dst)], count);
    if (!(this->*kPaths[key.path])(t))
    {
        return false;
    }
    if (count > 0 && !t.deferred) // Zero: every page was dropped before anything was submitted.
    {
        EventPtr const finish = runtime_->record(t.stream);
        commit(t, t.calls, finish);
    }
    return true;
}

// Room for step 5's queue entries, taken before anything is submitted (step 5 cannot fail);
// then step 2: the stream waits for the source pages and the destination slots.
void KvCacheManager::waitForSlots(Transfer& t)
{
    detail::Scratch& s = detail::scratch();
    {
        auto& heap = lru_.queue(t.key.dst, t.key.dstGroup).heap;
        if (heap.capacity() < heap.size() + t.count)
        {
            heap.reserve(std::max(heap.size() + t.count, 2 * heap.capacity()));
        }
    }
    s.events.clear();
    s.pairs.resize(t.count);
    runtime::Event* lastSrc = nullptr;
    runtime::Event* lastDst = nullptr;
    for (size_t i = 0; i < t.count; ++i)
    {
        int32_t const srcSlot = pages_[t.pages[i]].slot;
        collect(s.events, t.srcPool.ready(srcSlot), lastSrc);
        collect(s.events, t.dstPool.ready(t.dstSlots[i]), lastDst);
        s.pairs[i] = {t.dstSlots[i], srcSlot};
    }
    waitAll(s.events, t.stream);
}

bool KvCacheManager::transcode(
    Transfer& t, bool encode, std::byte* coldBase, PageIndexPair const* pairs, uint8_t* status)
{
    nvtx::Range range(encode ? "kvcodec encode" : "kvcodec decode", t.count);
    // GPU timing (opt-in): timed events around the call, read once both completed (harvestGpuTimes).
    bool const timed = gpuTiming_ && timedCalls_.size() < kMaxTimedCalls;
    EventPtr start = timed ? runtime_->recordTimed(t.stream) : nullptr;
    uint64_t const callsBefore = t.calls;
    auto const t0 = std::chrono::steady_clock::now();
    bool const ok
        = storage_->transcode(encode, t.key.rep, coldBase, pairs, t.count, t.stream, t.error, status, &t.calls);
    t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (start && ok)
    {
        EventPtr end = runtime_->recordTimed(t.stream);
        if (end)
        {
            timedCalls_.push_back({std::move(start), std::move(end), encode, t.key.src, t.key.srcGroup, t.key.dst,
                t.key.dstGroup, t.calls - callsBefore});
        }
    }
    harvestGpuTimes();
    return ok;
}

// Adds the GPU time of every timed codec call whose events completed (never waits) to the
// direction's counters of both pool groups; a call whose events report a device error is
// logged and left uncounted.
void KvCacheManager::harvestGpuTimes() const noexcept
{
    while (!timedCalls_.empty())
    {
        TimedCall& c = timedCalls_.front();
        std::optional<double> seconds;
        try
        {
            seconds = runtime_->elapsedSeconds(*c.start, *c.end);
            if (!seconds)
            {
                return; // Pending (calls on one stream complete in order; other streams wait).
            }
        }
        catch (std::exception const& e)
        {
            log::write(log::Level::kWarning, std::string("the GPU time of a codec call is lost: ") + e.what());
        }
        if (seconds)
        {
            for (auto [level, group] : {std::pair{c.srcLevel, c.srcGroup}, std::pair{c.dstLevel, c.dstGroup}})
            {
                auto& groups = stats_[size_t(level)];
                if (group >= 0 && size_t(group) < groups.size())
                {
                    PoolGroupStats& st = groups[size_t(group)];
                    (c.encode ? st.encodeGpuCalls : st.decodeGpuCalls) += c.calls;
                    (c.encode ? st.encodeGpuSeconds : st.decodeGpuSeconds) += *seconds;
                }
            }
        }
        timedCalls_.pop_front();
    }
}

bool KvCacheManager::setCodecGpuTiming(bool on)
{
    CallGuard guard(*this, "setCodecGpuTiming");
    gpuTiming_ = on && runtime_->timesEvents();
    return gpuTiming_;
}

bool KvCacheManager::copyHotToHot(Transfer& t)
{
    waitForSlots(t);
    return storage_->copyHot(t.key.srcGroup, detail::scratch().pairs.data(), t.count, t.stream, t.error);
}

// Hot <-> an addressable cold level: the codec reads or writes the cold slots in place (the
// destination's when encoding, the source's when decoding).
bool KvCacheManager::transcodeAddressable(Transfer& t, bool encode)
{
    waitForSlots(t);
    ColdLevel* cold = storage_->coldLevel(encode ? t.key.dst : t.key.src);
    std::byte* coldBase = cold->accessibleBase(encode ? t.key.dstGroup : t.key.srcGroup);
    if (coldBase == nullptr)
    {
        t.error = std::string("the ") + levelName(cold->level()) + " level is not GPU-accessible; the codec cannot "
            + "address it without a staging hop";
        return false;
    }
    return transcode(t, encode, coldBase, detail::scratch().pairs.data(), t.status);
}

bool KvCacheManager::encodeToAddressable(Transfer& t)
{
    return transcodeAddressable(t, true);
}

// Keeps the pages whose source blob passes `check(i)` (EnvelopeStatus::kOk); each other one has
// its slots released and is dropped (a miss), with the status as its reason. False when every
// page was dropped.
template <class Check>
bool KvCacheManager::keepChecked(Transfer& t, Check&& check)
{
    size_t kept = 0;
    for (size_t i = 0; i < t.count; ++i)
    {
        EnvelopeStatus const st = check(i);
        if (st == EnvelopeStatus::kOk)
        {
            t.pages[kept] = t.pages[i];
            t.dstSlots[kept] = t.dstSlots[i];
            ++kept;
            continue;
        }
        dropChecked(t, i, int(st));
    }
    t.count = kept;
    return kept > 0;
}

// Without a checked decode, a declared envelope is checked on the host before decoding: a blob
// that did not fit or fails its checksum is dropped (the page becomes a miss), never decoded.
// The host reads the blobs, so the transfers that wrote them must have finished: one wait per
// distinct event, then the fast CRC over each blob.
bool KvCacheManager::checkEnvelopes(Transfer& t)
{
    detail::Scratch& s = detail::scratch();
    ColdLevel* cold = storage_->coldLevel(t.key.src);
    uint64_t const blobBytes = cold->pageBytes(t.key.srcGroup);
    s.events.clear();
    runtime::Event* last = nullptr;
    for (size_t i = 0; i < t.count; ++i)
    {
        collect(s.events, t.srcPool.ready(pages_[t.pages[i]].slot), last);
    }
    waitAll(s.events, std::nullopt);
    return keepChecked(t, [&](size_t i) {
        std::byte const* blob = cold->hostBlob(t.key.srcGroup, pages_[t.pages[i]].slot);
        return blob == nullptr ? EnvelopeStatus::kOk : checkColdPageEnvelope(blob, blobBytes, t.envelope);
    });
}

// A page whose source blob failed a host check: its slots are released and it is dropped (a miss).
void KvCacheManager::dropChecked(Transfer& t, size_t i, int reason)
{
    uint32_t const index = t.pages[i];
    if (ColdLevel* cold = tracking(t.key.src))
    {
        cold->release(t.key.srcGroup, pages_[index].slot);
    }
    t.dstPool.give(t.dstSlots[i], t.dstPool.ready(t.dstSlots[i]));
    dropPage(index, t.key.src, t.key.srcGroup, reason, t.result);
}

// A source level whose blobs other processes can reach (the shared host level) confirms each
// blob before anything reads it; one that fails is dropped. False when every page was.
bool KvCacheManager::verifySources(Transfer& t)
{
    ColdLevel* cold = storage_->coldLevel(t.key.src);
    if (cold == nullptr || !cold->verifiesBlobs())
    {
        return true;
    }
    detail::Scratch& s = detail::scratch();
    s.verifySlots.resize(t.count);
    s.verified.resize(t.count);
    for (size_t i = 0; i < t.count; ++i)
    {
        s.verifySlots[i] = pages_[t.pages[i]].slot;
    }
    cold->verifyBlobs(t.key.srcGroup, s.verifySlots.data(), t.count, s.verified.data());
    return keepChecked(
        t, [&s](size_t i) { return s.verified[i] != 0 ? EnvelopeStatus::kOk : EnvelopeStatus::kBadChecksum; });
}

bool KvCacheManager::decodeFromAddressable(Transfer& t)
{
    if (checksOnDevice(t))
    {
        return decodeWithDeviceChecks(t);
    }
    if (overlapsChecks(t))
    {
        return decodeWithChecksAhead(t);
    }
    if (!verifySources(t) || (t.hostCheck && !checkEnvelopes(t)))
    {
        return true; // Every page was dropped.
    }
    return transcodeAddressable(t, false);
}

bool KvCacheManager::copyAddressable(Transfer& t)
{
    if (!verifySources(t))
    {
        return true; // Every page was dropped.
    }
    waitForSlots(t);
    return storage_->copyCold(t.key.src, t.key.srcGroup, t.key.dst, t.key.dstGroup, detail::scratch().pairs.data(),
        t.count, t.stream, t.error);
}

// Staged -> hot: a job reads the blobs into a staging slice on the I/O thread; its commit drops
// what is missing or corrupt and decodes the rest from the slice on the transfer's stream
// (commitJob), so the decode of one transfer runs while the next one's blobs are still read.
// The host writes the slice, so it is acquired synchronously: earlier decodes reading it have
// finished. While every slice is held by jobs in flight the job waits for one without its
// caller (stageWaiting(), when a job commits and frees its slice).
bool KvCacheManager::decodeFromStaged(Transfer& t)
{
    ColdLevel* cold = storage_->coldLevel(t.key.src);
    t.lease = cold->stage(t.key.srcGroup, t.count, std::nullopt, t.error);
    if (!t.lease && !hasJobs())
    {
        return false; // Nothing else holds the ring: the slice cannot fit.
    }
    t.error.clear();
    auto job = std::make_unique<Job>();
    job->decode = true;
    job->hostCheck = t.hostCheck;
    job->envelope = t.envelope;
    job->checked = t.checked;
    job->srcSlots.resize(t.count);
    job->status.assign(t.count, BlobStatus::kFailed);
    for (size_t i = 0; i < t.count; ++i)
    {
        job->srcSlots[i] = pages_[t.pages[i]].slot;
    }
    fillJob(t, *job);
    if (t.lease)
    {
        useSlice(*job, std::move(*t.lease));
        t.lease.reset();
    }
    job->unstaged = !job->lease;
    enqueue(std::move(job));
    return true;
}

// A staged job's slice: blob i of its pages lies at data() + i * the blob size (read into it, or
// encoded into it for a deferred write).
void KvCacheManager::useSlice(Job& job, StagingBuffer lease)
{
    uint64_t const pageBytes = job.write ? storage_->pageBytes(job.key.dst, job.key.dstGroup)
                                         : storage_->pageBytes(job.key.src, job.key.srcGroup);
    job.blobs.resize(job.pages.size());
    for (size_t i = 0; i < job.blobs.size(); ++i)
    {
        job.blobs[i] = lease.data() + i * pageBytes;
    }
    job.lease = std::move(lease);
}

// Queues a staged job whose blob i lies at base + slotOf(i) * pageBytes (the sources of a
// write, the destinations of a read); its pages are in flight until it commits.
template <class SlotOf>
bool KvCacheManager::queueJob(
    Transfer& t, std::unique_ptr<Job> job, std::byte* base, uint64_t pageBytes, SlotOf const& slotOf)
{
    job->blobs.resize(t.count);
    for (size_t i = 0; i < t.count; ++i)
    {
        job->blobs[i] = base + uint64_t(slotOf(i)) * pageBytes;
    }
    fillJob(t, *job);
    enqueue(std::move(job));
    return true;
}

// Staged -> addressable: a job reads the blobs straight into the destination slots; the
// destination slots' earlier transfers are host-waited for by the I/O thread (the host writes them).
bool KvCacheManager::readToAddressable(Transfer& t)
{
    uint64_t const pageBytes = storage_->pageBytes(t.key.src, t.key.srcGroup);
    std::byte* base = storage_->coldLevel(t.key.dst)->accessibleBase(t.key.dstGroup);
    auto job = std::make_unique<Job>();
    job->srcSlots.resize(t.count);
    job->status.assign(t.count, BlobStatus::kFailed);
    runtime::Event* last = nullptr;
    for (size_t i = 0; i < t.count; ++i)
    {
        if (EventPtr const& e = t.dstPool.ready(t.dstSlots[i]); e && e.get() != last)
        {
            job->waits.push_back(e);
            last = e.get();
        }
        job->srcSlots[i] = pages_[t.pages[i]].slot;
    }
    int32_t const* dstSlots = t.dstSlots;
    return queueJob(t, std::move(job), base, pageBytes, [dstSlots](size_t i) { return dstSlots[i]; });
}

bool KvCacheManager::encodeToStaged(Transfer& t)
{
    detail::Scratch& s = detail::scratch();
    waitForSlots(t);
    // Encode into a staging slice on the stream; a job's I/O thread waits for the encode's event
    // (never the caller), then writes the blobs. The slice is released when the job commits.
    // While every slice is held by jobs in flight, free host-tier slots stage the blobs instead,
    // or the job waits for a slice with its encode (stageWaiting()): the caller waits for no
    // earlier write.
    ColdLevel* cold = storage_->coldLevel(t.key.dst);
    uint64_t const pageBytes = cold->pageBytes(t.key.dstGroup);
    t.lease = cold->stage(t.key.dstGroup, t.count, t.stream, t.error);
    if (!t.lease && hasJobs())
    {
        t.error.clear();
        if (encodeToHostSlots(t))
        {
            return true;
        }
        auto job = std::make_unique<Job>();
        job->write = true;
        job->unstaged = true;
        job->encodeLater = true;
        job->srcSlots.resize(t.count);
        for (size_t i = 0; i < t.count; ++i)
        {
            job->srcSlots[i] = s.pairs[i].src;
        }
        fillJob(t, *job);
        enqueue(std::move(job));
        return true;
    }
    if (!t.lease)
    {
        return false;
    }
    s.codecPairs.resize(t.count);
    for (size_t i = 0; i < t.count; ++i)
    {
        s.codecPairs[i] = {int32_t(i), s.pairs[i].src};
    }
    std::unique_ptr<Job> job = encodeJob(t, t.lease->data());
    if (!job)
    {
        return false;
    }
    std::byte* const slice = t.lease->data();
    job->lease = std::move(t.lease);
    t.lease.reset();
    return queueJob(t, std::move(job), slice, pageBytes, [](size_t i) { return i; });
}

bool KvCacheManager::encodeToHostSlots(Transfer& t)
{
    if (!storage_->hasLevel(CacheLevel::kHost))
    {
        return false;
    }
    ColdLevel* cold = storage_->coldLevel(t.key.dst);
    ColdLevel* host = storage_->coldLevel(CacheLevel::kHost);
    PoolGroupIndex const g = storage_->poolGroup(CacheLevel::kHost, pages_[t.pages[0]].lifeCycle);
    std::byte* base = host->accessibleBase(g);
    uint64_t const pageBytes = cold->pageBytes(t.key.dstGroup);
    SlotPool& pool = storage_->slots(CacheLevel::kHost, g);
    if (base == nullptr || host->pageBytes(g) != pageBytes || pool.freeSlots() < t.count)
    {
        return false;
    }
    detail::Scratch& s = detail::scratch();
    std::vector<int32_t> slots(t.count);
    s.events.clear();
    runtime::Event* last = nullptr;
    s.codecPairs.resize(t.count);
    for (size_t i = 0; i < t.count; ++i)
    {
        int32_t const slot = pool.take();
        slots[i] = slot;
        collect(s.events, pool.ready(slot), last); // Whatever last read the slot (a decode).
        s.codecPairs[i] = {slot, s.pairs[i].src};
    }
    waitAll(s.events, t.stream);
    std::unique_ptr<Job> job = encodeJob(t, base);
    if (!job)
    {
        EventPtr const done = runtime_->record(t.stream);
        for (int32_t slot : slots)
        {
            pool.give(slot, done);
        }
        return false;
    }
    job->hostGroup = g;
    job->hostSlots = std::move(slots);
    int32_t const* hostSlots = job->hostSlots.data();
    return queueJob(t, std::move(job), base, pageBytes, [hostSlots](size_t i) { return hostSlots[i]; });
}

bool KvCacheManager::writeToStaged(Transfer& t)
{
    if (!verifySources(t))
    {
        return true; // Every page was dropped.
    }
    detail::Scratch& s = detail::scratch();
    waitForSlots(t);
    // Raw blob writes straight from the source slots; the I/O thread host-waits for the slots'
    // last transfers (an event recorded on the stream now) before the writes read them.
    ColdLevel* src = storage_->coldLevel(t.key.src);
    std::byte* base = src->accessibleBase(t.key.srcGroup);
    if (base == nullptr)
    {
        t.error = "neither cold level is GPU-accessible; a blob copy between them needs a staging hop";
        return false;
    }
    std::unique_ptr<Job> job = writeJob(t, 0);
    uint64_t const stride = src->pageBytes(t.key.srcGroup);
    return queueJob(t, std::move(job), base, stride, [&s](size_t i) { return s.pairs[i].src; });
}

// Staged -> hot, once the blobs are read: the stream waits for the destination slots' earlier
// transfers, the codec decodes from the slice, and the slice is released behind the decode.
// Without a checked decode (or on the host backend, where the decode is done when it returns)
// the pages commit now, ordered on the stream like any transfer; a checked decode's job is
// queued again so the I/O thread waits for it (never the caller), then settleDecode() drops the
// pages whose status is bad and commits the rest. Uses no per-thread scratch: it may run inside
// another migration that waits for a job.
bool KvCacheManager::decodeJob(Job& job, size_t kept)
{
    SlotPool& dstPool = storage_->slots(job.key.dst, job.key.dstGroup);
    std::vector<runtime::Event*> events;
    std::vector<PageIndexPair> pairs(kept);
    runtime::Event* last = nullptr;
    for (size_t i = 0; i < kept; ++i)
    {
        collect(events, dstPool.ready(job.dstSlots[i]), last);
        pairs[i] = {job.dstSlots[i], int32_t(job.leaseIndex[i])};
    }
    uint8_t* status = nullptr;
    if (job.checked)
    {
        job.checkStatus = takeStatusBuffer(kept);
        status = reinterpret_cast<uint8_t*>(job.checkStatus.data());
    }
    std::string error;
    size_t n = kept;
    Transfer t{job.key, job.pages.data(), job.dstSlots.data(), n, job.stream, job.owner->result_, error,
        storage_->slots(job.key.src, job.key.srcGroup), dstPool, false, 0, status, false, 0, std::nullopt};
    bool ok = false;
    EventPtr finish;
    try
    {
        waitAll(events, job.stream);
        ok = transcode(t, false, job.lease->data(), pairs.data(), status);
        finish = runtime_->record(job.stream);
    }
    catch (std::exception const& e)
    {
        ok = false;
        error = e.what();
        try
        {
            runtime_->synchronize(job.stream); // No event: the slots are free once the stream is.
        }
        catch (...)
        {
        }
    }
    job.lease->setStream(job.stream);
    job.lease.reset(); // Reusable once the decode finished.
    if (!ok)
    {
        failJob(job, kept, finish,
            "decoding the blobs read from the " + std::string(levelName(job.key.src)) + " level failed: " + error);
        return true;
    }
    job.calls = t.calls;
    job.seconds = t.seconds;
    job.finish = finish;
    if (!job.checked || !finish)
    {
        settleDecode(job);
        return true;
    }
    for (uint32_t index : job.pages)
    {
        pages_[index].inFlight = true; // Until the statuses are read.
    }
    job.decoded = true;
    job.waits.assign(1, finish);
    return false;
}

// A write job whose I/O waits for the work submitted on the transfer's stream so far (the
// encode, or the source slots' last transfers): an event recorded now, null on the host
// backend, whose work is done.
// The job of a staged write whose blobs the scratch's codec pairs place at `base`: its encode
// submitted now on the call's stream, or on the CPU backend left to the I/O thread. Null when the
// encode failed (t.error says why).
std::unique_ptr<KvCacheManager::Job> KvCacheManager::encodeJob(Transfer& t, std::byte* base)
{
    std::vector<PageIndexPair> const& pairs = detail::scratch().codecPairs;
    if (encodesOnIoThread())
    {
        auto job = std::make_unique<Job>();
        job->write = true;
        deferEncode(*job, base, pairs.data(), t.count);
        return job;
    }
    uint64_t const callsBefore = t.calls;
    if (!transcode(t, true, base, pairs.data(), nullptr))
    {
        return nullptr;
    }
    return writeJob(t, t.calls - callsBefore);
}

std::unique_ptr<KvCacheManager::Job> KvCacheManager::writeJob(Transfer& t, uint64_t calls)
{
    auto job = std::make_unique<Job>();
    job->write = true;
    job->calls = calls;
    job->finish = runtime_->record(t.stream);
    if (job->finish)
    {
        job->waits.push_back(job->finish);
    }
    return job;
}

// Drops a page whose staged read missed or failed its checksum (a miss), as the read path
// does: its level slot and its unused destination slot are released.
void KvCacheManager::dropUnread(
    TransferKey const& key, uint32_t index, int32_t dstSlot, int reason, MigrationResult& result)
{
    storage_->coldLevel(key.src)->release(key.srcGroup, pages_[index].slot);
    SlotPool& dst = storage_->slots(key.dst, key.dstGroup);
    dst.give(dstSlot, dst.ready(dstSlot));
    dropPage(index, key.src, key.srcGroup, reason, result);
}

// The pages, destination slots and names of a transfer become a job's; the job is queued and
// the pages are in flight until it commits (commitJob).
void KvCacheManager::fillJob(Transfer& t, Job& job)
{
    job.key = t.key;
    job.stream = t.stream;
    job.seconds = t.seconds;
    job.pages.assign(t.pages, t.pages + t.count);
    job.dstSlots.assign(t.dstSlots, t.dstSlots + t.count);
    job.generations.resize(t.count);
    for (size_t i = 0; i < t.count; ++i)
    {
        job.generations[i] = pages_[t.pages[i]].generation;
    }
    if (job.write)
    {
        job.keys.resize(t.count);
        job.names.resize(t.count);
        for (size_t i = 0; i < t.count; ++i)
        {
            job.keys[i] = keys_.of(t.pages[i]);
            job.names[i] = {&job.keys[i], pages_[t.pages[i]].lifeCycle};
        }
    }
    t.deferred = true;
}

// A finished job's commit: the same steps 4-5 as a synchronous transfer.
void KvCacheManager::commitPages(Job& job, size_t count, EventPtr const& finish)
{
    size_t n = count;
    Transfer t{job.key, job.pages.data(), job.dstSlots.data(), n, job.stream, job.owner->result_, job.error,
        storage_->slots(job.key.src, job.key.srcGroup), storage_->slots(job.key.dst, job.key.dstGroup), false, 0,
        nullptr, false, job.seconds, std::nullopt};
    commit(t, job.calls, finish);
}

// Step 4: attach the finish event to the destination slots (the source slots get it when
// released in step 5); count; notify observers. Step 5: ownership moves to the destination; the
// source slots are released. Every page leaves the source group's eviction queue and joins the
// destination group's (unless pinned).
void KvCacheManager::commit(Transfer& t, uint64_t calls, EventPtr const& finish)
{
    TransferKey const& key = t.key;
    size_t const count = t.count;
    noteEvent(t.stream, finish);
    for (size_t i = 0; i < count; ++i)
    {
        t.dstPool.setReady(t.dstSlots[i], finish);
    }
    bool const fromHot = key.src == CacheLevel::kHot;
    bool const toHot = key.dst == CacheLevel::kHot;
    uint64_t const dstPageBytes = storage_->pageBytes(key.dst, key.dstGroup);
    auto& srcStats = stats_[size_t(key.src)][size_t(key.srcGroup)];
    auto& dstStats = stats_[size_t(key.dst)][size_t(key.dstGroup)];
    if (fromHot != toHot)
    {
        // A codec transfer: an encode (offload, hot -> cold) or a decode (onboard, cold -> hot).
        uint64_t const srcPageBytes = storage_->pageBytes(key.src, key.srcGroup);
        uint64_t const coldBytes = fromHot ? dstPageBytes : srcPageBytes;
        uint64_t const hotBytes = fromHot ? srcPageBytes : dstPageBytes;
        for (auto* st : {&srcStats, &dstStats})
        {
            (fromHot ? st->pagesOffloaded : st->pagesOnboarded) += count;
            (fromHot ? st->bytesOffloaded : st->bytesOnboarded) += count * coldBytes;
            (fromHot ? st->hotBytesOffloaded : st->hotBytesOnboarded) += count * hotBytes;
            st->codecCalls += calls;
            st->codecSeconds += t.seconds;
            (fromHot ? st->encodeCalls : st->decodeCalls) += calls;
            (fromHot ? st->encodeSeconds : st->decodeSeconds) += t.seconds;
        }
    }
    else
    {
        dstStats.pagesCopied += count;
    }
    LruQueue& srcQueue = lru_.queue(key.src, key.srcGroup);
    LruQueue& dstQueue = lru_.queue(key.dst, key.dstGroup);
    ColdLevel* const releaseFrom = tracking(key.src);
    ColdLevel* const landsIn = tracking(key.dst);
    bool const hotter = key.dst < key.src;
    for (size_t i = 0; i < count; ++i)
    {
        Page& p = pages_[t.pages[i]];
        if (p.prefetched && key.src == CacheLevel::kHost)
        {
            notePrefetchLeft(p, toHot);
        }
        if (releaseFrom != nullptr)
        {
            releaseFrom->release(key.srcGroup, p.slot);
        }
        t.srcPool.give(p.slot, finish);
        if (p.lruStamp != 0)
        {
            p.lruStamp = 0;
            --srcQueue.live;
        }
        p.level = int8_t(key.dst);
        p.slot = t.dstSlots[i];
        if (landsIn != nullptr)
        {
            landsIn->landed(key.dstGroup, p.slot, p.lifeCycle, keys_.of(t.pages[i]), finish);
        }
        if (hotter)
        {
            p.tick = ++clock_; // Brought hotter to be used; an eviction keeps the page's age.
        }
        if (p.pins == 0)
        {
            lru_.push(dstQueue, p, t.pages[i]);
        }
    }
    t.result.moved += count;
    if (t.checked)
    {
        checkRanges_.push_back({key, statusUsed_, count});
        checkPages_.insert(checkPages_.end(), t.pages, t.pages + count);
        statusUsed_ += count;
    }
    if (!observers_.empty())
    {
        // Last: the page table is consistent whatever an observer does (it may raise).
        notify({key.src, key.dst, key.srcGroup, key.dstGroup, key.rep, count, count * dstPageBytes});
    }
}

} // namespace kvcodec::kvcm

// SPDX-License-Identifier: Apache-2.0
//
// The codec work of staged jobs that runs on the manager's I/O thread. On the CPU backend a codec
// call works on the thread that makes it: an eviction's encode run by its caller, or a read's
// decode run while its commit holds the manager's lock, would block every caller for the whole
// call. So the I/O thread encodes a write's pages before submitting its writes, and decodes a
// read's blobs once they landed, both without the manager's lock; the commit then only settles
// the pages. Codec calls stay one at a time (StorageManager::transcode). On a GPU the codec work
// is queued on the call's stream instead, and the I/O thread only waits for it.
#include <chrono>

#include "kvcm/manager.h"
#include "kvcm/manager_internal.h"

namespace kvcodec::kvcm {

bool KvCacheManager::encodesOnIoThread() const noexcept
{
    return runtime_->codecDevice() == KVCODEC_DEVICE_CPU;
}

void KvCacheManager::deferEncode(Job& job, std::byte* base, PageIndexPair const* pairs, size_t count)
{
    job.encodeOnIo = true;
    job.encodeBase = base;
    job.encodePairs.assign(pairs, pairs + count);
}

// The hot slots stay as they are while the job is in flight (its pages are, and the call's rule
// says their bytes do too); the destination (slice or host slots) is the job's alone. The codec
// is shared with the callers' calls: StorageManager::transcode serializes them.
bool KvCacheManager::encodeOnIoThread(Job& job) noexcept
{
    std::string error;
    uint64_t calls = 0;
    bool ok = false;
    auto const t0 = std::chrono::steady_clock::now();
    try
    {
        ok = storage_->transcode(true, job.key.rep, job.encodeBase, job.encodePairs.data(), job.encodePairs.size(),
            job.stream, error, nullptr, &calls);
    }
    catch (std::exception const& e)
    {
        error = e.what();
    }
    job.calls += calls;
    job.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!ok)
    {
        job.error = "encoding the pages for the " + std::string(levelName(job.key.dst)) + " level failed: " + error;
    }
    return ok;
}

bool KvCacheManager::decodesOnIoThread(Job const& job) const noexcept
{
    return job.decode && !job.write && job.error.empty() && encodesOnIoThread(); // started: never cancelled
}

// The read's batch is completed here (a staged level guards its own state), its pages' blobs
// checked as the commit checks them, and the good ones decoded from the slice into the job's
// destination slots, which nothing else uses while the job is in flight. The commit drops the
// others and settles the decoded pages from job.decodeStatus.
void KvCacheManager::decodeOnIoThread(Job& job) noexcept
{
    ColdLevel* cold = storage_->coldLevel(job.key.src);
    size_t const n = job.pages.size();
    std::string error;
    job.decodedOnIo = true;
    if (!cold->complete(job.io, error))
    {
        job.error = std::move(error);
        return;
    }
    uint64_t calls = 0;
    bool ok = false;
    auto const t0 = std::chrono::steady_clock::now();
    try
    {
        uint64_t const blobBytes = cold->pageBytes(job.key.srcGroup);
        std::vector<PageIndexPair> pairs;
        pairs.reserve(n);
        for (size_t i = 0; i < n; ++i)
        {
            if (blobReadable(job, i, blobBytes) == int(EnvelopeStatus::kOk))
            {
                pairs.push_back({job.dstSlots[i], int32_t(i)});
            }
        }
        if (pairs.empty())
        {
            return; // The commit drops every page.
        }
        job.decodeStatus.assign(job.checked ? pairs.size() : 0, 0);
        ok = storage_->transcode(false, job.key.rep, job.lease->data(), pairs.data(), pairs.size(), job.stream, error,
            job.checked ? job.decodeStatus.data() : nullptr, &calls);
    }
    catch (std::exception const& e)
    {
        error = e.what();
    }
    job.calls = calls;
    job.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!ok)
    {
        job.error
            = "decoding the blobs read from the " + std::string(levelName(job.key.src)) + " level failed: " + error;
    }
}

int KvCacheManager::blobReadable(Job const& job, size_t i, uint64_t blobBytes) const noexcept
{
    if (job.status[i] != BlobStatus::kOk)
    {
        return unreadReason(job.status[i]);
    }
    return job.hostCheck ? int(checkColdPageEnvelope(job.blobs[i], blobBytes, job.envelope)) : int(EnvelopeStatus::kOk);
}

} // namespace kvcodec::kvcm

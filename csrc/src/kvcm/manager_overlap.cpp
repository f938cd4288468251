// SPDX-License-Identifier: Apache-2.0
//
// Decoding from a level whose blobs other processes can reach (the shared host level) on the CPU
// backend, with the checks of the next chunk of pages running on a helper thread while this chunk
// decodes. Checked first then decoded, the CRC pass and the decode each left one of the host's
// cores idle; overlapped, the decode starts after one chunk's check and the rest of the checks
// run beside it. A page is still decoded only once its blob passed.
#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "kvcm/manager.h"
#include "kvcm/manager_internal.h"

namespace kvcodec::kvcm {
namespace {

constexpr uint64_t kChunkBytes = 1ULL << 20; ///< Blob bytes checked per step.

} // namespace

bool KvCacheManager::overlapsChecks(Transfer const& t) const noexcept
{
    ColdLevel const* cold = storage_->coldLevel(t.key.src);
    return cold != nullptr && cold->verifiesBlobs() && !t.hostCheck && t.status == nullptr
        && runtime_->codecDevice() == KVCODEC_DEVICE_CPU
        && t.count * cold->pageBytes(t.key.srcGroup) >= 2 * kChunkBytes;
}

bool KvCacheManager::decodeWithChecksAhead(Transfer& t)
{
    ColdLevel const& cold = *storage_->coldLevel(t.key.src);
    size_t const n = t.count;
    size_t const chunk
        = std::max<size_t>(1, size_t(kChunkBytes / std::max<uint64_t>(1, cold.pageBytes(t.key.srcGroup))));
    std::vector<int32_t> slots(n);
    std::vector<uint8_t> ok(n, 0);
    for (size_t i = 0; i < n; ++i)
    {
        slots[i] = pages_[t.pages[i]].slot;
    }
    // The helper checks chunks 1, 2, ... in order; `checked` is how many pages it has finished.
    // It only reads the level (ColdLevel::verifyBlobs is const): the pages that fail are dropped,
    // which changes the level, after it was joined.
    std::mutex mutex;
    std::condition_variable progress;
    size_t checked = std::min(chunk, n);
    bool stop = false;
    std::thread helper([&] {
        for (size_t begin = chunk; begin < n; begin += chunk)
        {
            {
                std::lock_guard lock(mutex);
                if (stop)
                    return;
            }
            size_t const end = std::min(begin + chunk, n);
            cold.verifyBlobs(t.key.srcGroup, slots.data() + begin, end - begin, ok.data() + begin);
            std::lock_guard lock(mutex);
            checked = end;
            progress.notify_all();
        }
    });
    struct Join
    {
        std::thread& thread;
        std::mutex& mutex;
        bool& stop;
        void now()
        {
            {
                std::lock_guard lock(mutex);
                stop = true;
            }
            if (thread.joinable())
                thread.join();
        }
        ~Join() // also when a step throws
        {
            now();
        }
    } join{helper, mutex, stop};
    cold.verifyBlobs(t.key.srcGroup, slots.data(), std::min(chunk, n), ok.data());

    std::vector<uint32_t> failedPages;
    std::vector<int32_t> failedSlots;
    size_t kept = 0;
    bool good = true;
    double seconds = 0;
    for (size_t begin = 0; begin < n && good; begin += chunk)
    {
        size_t const end = std::min(begin + chunk, n);
        {
            std::unique_lock lock(mutex);
            progress.wait(lock, [&] { return checked >= end; });
        }
        // This chunk's pages that passed, moved down after those kept so far.
        size_t const first = kept;
        for (size_t i = begin; i < end; ++i)
        {
            if (ok[i] == 0)
            {
                failedPages.push_back(t.pages[i]);
                failedSlots.push_back(t.dstSlots[i]);
                continue;
            }
            t.pages[kept] = t.pages[i];
            t.dstSlots[kept] = t.dstSlots[i];
            ++kept;
        }
        size_t count = kept - first;
        if (count == 0)
            continue;
        Transfer part{t.key, t.pages + first, t.dstSlots + first, count, t.stream, t.result, t.error, t.srcPool,
            t.dstPool, false, t.envelope, nullptr, false, 0.0, std::nullopt, false};
        good = transcodeAddressable(part, false);
        seconds += part.seconds;
        if (!good)
        {
            // Unfinished: the pages not decoded yet go back in line behind this chunk's, so that
            // the migration gives every one of them back.
            for (size_t i = end; i < n; ++i)
            {
                t.pages[kept] = t.pages[i];
                t.dstSlots[kept] = t.dstSlots[i];
                ++kept;
            }
        }
    }
    join.now(); // before the failed pages are dropped: the helper reads the level
    t.count = kept;
    t.seconds += seconds;
    dropFailedChecks(t, failedPages, failedSlots);
    return good;
}

// The pages of `t` whose blobs failed their checksums (their pages and destination slots taken out
// of `t` already): each has its slots released and is dropped (a miss).
void KvCacheManager::dropFailedChecks(Transfer& t, std::vector<uint32_t>& pages, std::vector<int32_t>& dstSlots)
{
    size_t failed = pages.size();
    Transfer dropped{t.key, pages.data(), dstSlots.data(), failed, t.stream, t.result, t.error, t.srcPool, t.dstPool,
        false, t.envelope, nullptr, false, 0.0, std::nullopt, false};
    for (size_t i = 0; i < failed; ++i)
    {
        dropChecked(dropped, i, int(EnvelopeStatus::kBadChecksum));
    }
}

} // namespace kvcodec::kvcm

// SPDX-License-Identifier: Apache-2.0
//
// The shared host level's publications: keyed pages committed to the daemon under their keys
// with the CRC-32C of their bytes, the checksums computed on the level's checksum thread.
#include <algorithm>
#include <optional>
#include <string_view>

#include "kvcm/parallel_crcs.h"
#include "kvcm/shared_level.h"
#include "kvcodec/crc32c.h"

namespace kvcodec::kvcm {

// Commits the landed keyed pages whose encodes completed and whose CRC-32C the checksum thread
// computed; queues the checksums of those that just completed. With `waitWrites` (the end of a
// blocking call) every encode and checksum is waited for, and those not queued yet are computed
// here. Each committed page is kept pinned for this manager.
void SharedColdLevel::publish(SharedLevelGroup& g, bool waitWrites)
{
    std::vector<uint32_t> slots;
    std::vector<std::string_view> keys;
    std::vector<uint32_t> lengths;
    std::vector<uint32_t> crcs;
    std::vector<size_t> which;
    std::vector<size_t> here; // Entries of `slots` whose checksum is computed on this thread.
    auto batch = std::make_shared<SharedCrcBatch>();
    std::vector<size_t> batched; // Entries of g.publish whose checksum goes to the thread.
    auto commitLater = [&](size_t i, std::optional<uint32_t> crc) {
        auto const& p = g.publish[i];
        slots.push_back(uint32_t(p.slot));
        keys.emplace_back(p.key);
        lengths.push_back(uint32_t(g.pageBytes));
        crcs.push_back(crc.value_or(0));
        which.push_back(i);
        if (!crc)
        {
            here.push_back(slots.size() - 1);
        }
    };
    for (size_t i = 0; i < g.publish.size(); ++i)
    {
        auto& p = g.publish[i];
        if (p.generation != g.generation[size_t(p.slot)])
        {
            p.slot = -1; // The page left before it was published: the slot is still a private lease.
            continue;
        }
        if (p.written && waitWrites)
        {
            p.written->synchronize();
        }
        else if (p.written && !p.written->query())
        {
            continue;
        }
        if (p.crc)
        {
            if (waitWrites)
            {
                awaitChecksum(*p.crc);
            }
            else
            {
                std::lock_guard lock(crcMu_);
                if (!p.crc->done)
                {
                    continue;
                }
            }
            commitLater(i, p.crc->crcs[p.crcAt]);
        }
        else if (waitWrites)
        {
            commitLater(i, std::nullopt);
        }
        else
        {
            p.crcAt = batch->blobs.size();
            batch->blobs.push_back(arena_->data(g.layout, uint32_t(p.slot)));
            batched.push_back(i);
        }
    }
    if (!batched.empty())
    {
        batch->arena = arena_;
        batch->bytes = g.pageBytes;
        batch->crcs.resize(batch->blobs.size());
        bool const queued = checksumLater(batch);
        for (size_t i : batched)
        {
            if (queued)
            {
                g.publish[i].crc = batch;
            }
            else
            {
                commitLater(i, std::nullopt); // No checksum thread: computed here, as at the end of a call.
            }
        }
    }
    if (!here.empty())
    {
        detail::parallelCrcs(here.size(), here.size() * g.pageBytes, [&](size_t j) {
            size_t const k = here[j];
            crcs[k] = crc32cFast(arena_->data(g.layout, slots[k]), lengths[k]);
        });
    }
    if (!slots.empty())
    {
        std::vector<uint8_t> const st = client_->commit(g.layout, slots, keys, lengths, false, true, crcs.data());
        for (size_t j = 0; j < which.size(); ++j)
        {
            auto& p = g.publish[which[j]];
            if (j < st.size() && st[j] == daemon::kStored)
            {
                daemon::SlotHeader const h = arena_->readHeader(g.layout, uint32_t(p.slot));
                g.pinned[size_t(p.slot)] = SharedLevelGroup::kPublished;
                g.expected[size_t(p.slot)] = daemon::Found{uint32_t(p.slot), uint32_t(h.length), h.crc, h.version};
                g.digest[size_t(p.slot)] = daemon::keyDigest(p.key);
                ++counters_.published;
            }
            p.slot = -1; // Done (a refused commit leaves the slot a private lease).
        }
    }
    g.publish.erase(
        std::remove_if(g.publish.begin(), g.publish.end(), [](auto const& p) { return p.slot < 0; }), g.publish.end());
}

bool SharedColdLevel::checksumLater(std::shared_ptr<SharedCrcBatch> const& batch) noexcept
{
    try
    {
        std::lock_guard lock(crcMu_);
        if (!crcThread_.joinable())
        {
            crcThread_ = std::thread([this] { checksumLoop(); });
        }
        crcQueue_.push_back(batch);
    }
    catch (std::exception const&)
    {
        return false; // No thread (or no memory): the caller computes them.
    }
    crcCv_.notify_all();
    return true;
}

void SharedColdLevel::awaitChecksum(SharedCrcBatch const& batch)
{
    std::unique_lock lock(crcMu_);
    crcCv_.wait(lock, [&] { return batch.done; });
}

void SharedColdLevel::checksumLoop() noexcept
{
    std::unique_lock lock(crcMu_);
    for (;;)
    {
        crcCv_.wait(lock, [&] { return crcStop_ || !crcQueue_.empty(); });
        if (crcStop_)
        {
            return;
        }
        std::shared_ptr<SharedCrcBatch> const batch = crcQueue_.front();
        crcQueue_.pop_front();
        lock.unlock();
        // The blobs' encodes completed and their pages stay at this level until committed (a page
        // that leaves first bumps its slot's generation, and its checksum is not used).
        detail::parallelCrcs(batch->blobs.size(), batch->blobs.size() * batch->bytes,
            [&](size_t i) { batch->crcs[i] = crc32cFast(batch->blobs[i], batch->bytes); });
        lock.lock();
        batch->done = true;
        crcCv_.notify_all();
    }
}

} // namespace kvcodec::kvcm

// SPDX-License-Identifier: Apache-2.0
//
// Decoding from a level whose blobs other processes can reach (the shared host level) on a GPU.
// Checked on the host, the blobs' CRC-32C ran at about half the speed at which the GPU copies
// them out of the arena, and the decode waited for it. Here each chunk of blobs is copied into
// device memory on a stream of the check's own, checksummed there by a kernel on a second one,
// and decoded from that copy once its checksums match: the check runs where the bytes go anyway,
// and the bytes the codec reads can no longer change after they were checked. Chunks rotate
// through a fixed staging area, so the copy of one chunk overlaps the check and the decode of
// those before it. A page is still decoded only once its blob passed.
//
// Pages whose blobs need no CRC (slots leased to this manager, or verify_crc off) take the same
// way without the kernel: measured on an H100 host, codecs decoded a copy in device memory faster
// than they read the arena in place. Blobs are copied in the order of their slots, neighbouring
// slots as one copy.
#include <algorithm>
#include <utility>
#include <vector>

#include "kvcm/manager.h"
#include "kvcm/manager_internal.h"
#include "runtime/log.h"

namespace kvcodec::kvcm {
namespace {

// Overridable at build time (-DKVCODEC_DEVICE_CHECK_CHUNK_MIB=..., ..._STAGE_MIB=...) for tuning.
#ifndef KVCODEC_DEVICE_CHECK_CHUNK_MIB
#define KVCODEC_DEVICE_CHECK_CHUNK_MIB 4
#endif
#ifndef KVCODEC_DEVICE_CHECK_STAGE_MIB
#define KVCODEC_DEVICE_CHECK_STAGE_MIB 32
#endif
/// Blob bytes copied and checked per step.
constexpr uint64_t kChunkBytes = uint64_t(KVCODEC_DEVICE_CHECK_CHUNK_MIB) << 20;
/// Device memory the steps rotate through.
constexpr uint64_t kStageBytes = uint64_t(KVCODEC_DEVICE_CHECK_STAGE_MIB) << 20;

} // namespace

KvCacheManager::DeviceChecks::~DeviceChecks()
{
    try
    {
        for (Stream st : {stream, kernels})
        {
            if (st != nullptr)
            {
                runtime.synchronize(st);
            }
        }
        for (EventPtr const& e : regionFree)
        {
            if (e)
            {
                e->synchronize();
            }
        }
    }
    catch (std::exception const& e)
    {
        log::write(log::Level::kError, std::string("waiting for the device checks at destruction failed: ") + e.what());
    }
    for (Stream st : {stream, kernels})
    {
        if (st != nullptr)
        {
            runtime.destroyStream(st);
        }
    }
}

bool KvCacheManager::checksOnDevice(Transfer const& t) const noexcept
{
    ColdLevel const* cold = storage_->coldLevel(t.key.src);
    return cold != nullptr && cold->verifiesBlobs() && !t.hostCheck && t.status == nullptr
        && runtime_->codecDevice() != KVCODEC_DEVICE_CPU;
}

// The staging area for blobs of `pageBytes`: `chunk` pages per region, regions enough to fill
// kStageBytes (at least one). Reallocated only when the page size changes, after the decodes
// that read the old one.
KvCacheManager::DeviceChecks& KvCacheManager::deviceChecks(uint64_t pageBytes)
{
    if (!deviceChecks_)
    {
        deviceChecks_ = std::make_unique<DeviceChecks>(*runtime_);
        deviceChecks_->stream = runtime_->createStream();
        deviceChecks_->kernels = runtime_->createStream();
    }
    DeviceChecks& d = *deviceChecks_;
    if (d.pageBytes == pageBytes)
    {
        return d;
    }
    for (EventPtr& e : d.regionFree)
    {
        if (e)
        {
            e->synchronize();
        }
    }
    runtime_->synchronize(d.stream);
    runtime_->synchronize(d.kernels);
    d.pageBytes = 0;
    d.stage = runtime::Allocation();
    d.words = runtime::Allocation();
    d.chunk = size_t(std::max<uint64_t>(1, kChunkBytes / pageBytes));
    size_t const regions = size_t(std::max<uint64_t>(1, kStageBytes / (d.chunk * pageBytes)));
    size_t const capacity = d.chunk * regions;
    d.stage = runtime::Allocation(*runtime_, runtime::MemoryKind::kDevice, size_t(capacity * pageBytes));
    d.words = runtime::Allocation(*runtime_, runtime::MemoryKind::kMappedHost, 2 * capacity * sizeof(uint32_t));
    d.regionFree.assign(regions, nullptr);
    d.pageBytes = pageBytes;
    return d;
}

bool KvCacheManager::decodeWithDeviceChecks(Transfer& t)
{
    ColdLevel& cold = *storage_->coldLevel(t.key.src);
    PoolGroupIndex const group = t.key.srcGroup;
    uint64_t const pageBytes = cold.pageBytes(group);
    // In the order of their slots, so that neighbouring slots are copied as one run (copyBlobs).
    std::vector<std::pair<int32_t, uint32_t>> bySlot(t.count); // (slot, index in t)
    for (size_t i = 0; i < t.count; ++i)
    {
        bySlot[i] = {pages_[t.pages[i]].slot, uint32_t(i)};
    }
    if (!std::is_sorted(bySlot.begin(), bySlot.end()))
    {
        std::sort(bySlot.begin(), bySlot.end());
        std::vector<uint32_t> const pages(t.pages, t.pages + t.count);
        std::vector<int32_t> const dstSlots(t.dstSlots, t.dstSlots + t.count);
        for (size_t i = 0; i < t.count; ++i)
        {
            t.pages[i] = pages[bySlot[i].second];
            t.dstSlots[i] = dstSlots[bySlot[i].second];
        }
    }
    std::vector<int32_t> slots(t.count);
    std::vector<uint8_t> ok(t.count);
    std::vector<uint32_t> crc(t.count);
    std::vector<uint32_t> length(t.count);
    for (size_t i = 0; i < t.count; ++i)
    {
        slots[i] = bySlot[i].first;
    }
    cold.checkHeaders(group, slots.data(), t.count, ok.data(), crc.data(), length.data());
    // Headers that fail are dropped before anything is copied; the rest move down, with their
    // slots and expectations, in order.
    size_t n = 0;
    bool anyCrc = false;
    for (size_t i = 0; i < t.count; ++i)
    {
        if (ok[i] == 0 || (ok[i] == 2 && length[i] > pageBytes))
        {
            dropChecked(t, i, int(EnvelopeStatus::kBadChecksum));
            continue;
        }
        anyCrc = anyCrc || ok[i] == 2;
        t.pages[n] = t.pages[i];
        t.dstSlots[n] = t.dstSlots[i];
        slots[n] = slots[i];
        ok[n] = ok[i];
        crc[n] = crc[i];
        length[n] = ok[i] == 2 ? length[i] : 0;
        ++n;
    }
    t.count = n;
    if (n == 0)
    {
        return true; // Every page was dropped.
    }
    waitForSlots(t); // The decodes, on t.stream, wait for the source and destination slots.
    DeviceChecks& d = deviceChecks(pageBytes);
    {
        // The copies, on the check's stream, wait for the source slots' writers.
        detail::Scratch& s = detail::scratch();
        s.events.clear();
        runtime::Event* last = nullptr;
        for (size_t i = 0; i < n; ++i)
        {
            detail::collect(s.events, t.srcPool.ready(pages_[t.pages[i]].slot), last);
        }
        detail::waitAll(s.events, d.stream);
    }
    size_t const regions = d.regionFree.size();
    size_t const chunks = (n + d.chunk - 1) / d.chunk;
    auto* lengths = reinterpret_cast<uint32_t*>(d.words.data());
    uint32_t* crcs = lengths + regions * d.chunk;
    std::vector<EventPtr> checked(chunks);
    std::vector<std::byte*> dsts(d.chunk);
    // Chunk c: copied into region c % regions once the decode that read it last has finished,
    // then checksummed there on the second stream, while the next chunk is copied.
    auto issue = [&](size_t c) {
        size_t const r = c % regions;
        size_t const first = c * d.chunk;
        size_t const m = std::min(d.chunk, n - first);
        if (d.regionFree[r])
        {
            d.regionFree[r]->waitOn(d.stream);
        }
        std::byte* const base = d.stage.data() + r * d.chunk * pageBytes;
        for (size_t j = 0; j < m; ++j)
        {
            dsts[j] = base + j * pageBytes; // consecutive: neighbouring slots go as one copy
            lengths[r * d.chunk + j] = length[first + j];
        }
        if (!cold.copyOut(group, slots.data() + first, dsts.data(), m, d.stream, t.error))
        {
            return false;
        }
        if (EventPtr copied = runtime_->record(d.stream))
        {
            copied->waitOn(d.kernels);
        }
        if (anyCrc
            && !runtime_->checksums(base, pageBytes, lengths + r * d.chunk, m, crcs + r * d.chunk, d.kernels, t.error))
        {
            return false;
        }
        checked[c] = runtime_->record(d.kernels);
        return true;
    };
    std::vector<uint32_t> failedPages;
    std::vector<int32_t> failedSlots;
    std::vector<PageIndexPair> pairs;
    size_t kept = 0;
    size_t rest = n; // The first page neither decoded nor dropped when a step fails.
    double seconds = 0;
    try
    {
        size_t issued = 0;
        for (size_t c = 0; c < chunks && rest == n; ++c)
        {
            for (; issued < chunks && issued < c + regions; ++issued)
            {
                if (!issue(issued))
                {
                    rest = c * d.chunk;
                    break;
                }
            }
            if (rest != n)
            {
                break;
            }
            checked[c]->synchronize();
            size_t const r = c % regions;
            size_t const first = c * d.chunk;
            size_t const end = std::min(first + d.chunk, n);
            // This chunk's pages that passed move down after those kept so far; each decodes
            // from its copy, slot r * chunk + j of the staging area.
            pairs.clear();
            size_t const from = kept;
            for (size_t i = first; i < end; ++i)
            {
                if (ok[i] == 2 && crcs[r * d.chunk + (i - first)] != crc[i])
                {
                    failedPages.push_back(t.pages[i]);
                    failedSlots.push_back(t.dstSlots[i]);
                    continue;
                }
                pairs.push_back({t.dstSlots[i], int32_t(r * d.chunk + (i - first))});
                t.pages[kept] = t.pages[i];
                t.dstSlots[kept] = t.dstSlots[i];
                ++kept;
            }
            size_t count = kept - from;
            if (count > 0)
            {
                Transfer part{t.key, t.pages + from, t.dstSlots + from, count, t.stream, t.result, t.error, t.srcPool,
                    t.dstPool, false, t.envelope, nullptr, false, 0.0, std::nullopt, false};
                bool const decoded = transcode(part, false, d.stage.data(), pairs.data(), nullptr);
                seconds += part.seconds;
                t.calls += part.calls;
                if (!decoded)
                {
                    rest = end; // This chunk's kept pages are given back with the rest.
                }
            }
            d.regionFree[r] = runtime_->record(t.stream);
        }
    }
    catch (std::exception const& e)
    {
        t.error = std::string("checking blobs on the device failed: ") + e.what();
        rest = std::min(rest, kept + failedPages.size()); // Pages [0, kept) and the failed ones are settled.
    }
    if (rest != n)
    {
        // Unfinished: the pages not decoded yet go back in line behind those kept, so that the
        // migration gives every one of them back. Nothing may still write the staging area when
        // the next call reuses it.
        for (size_t i = rest; i < n; ++i)
        {
            t.pages[kept] = t.pages[i];
            t.dstSlots[kept] = t.dstSlots[i];
            ++kept;
        }
        try
        {
            runtime_->synchronize(d.stream);
            runtime_->synchronize(d.kernels);
        }
        catch (std::exception const& e)
        {
            log::write(log::Level::kError, std::string("waiting for the device checks failed: ") + e.what());
        }
    }
    t.count = kept;
    t.seconds += seconds;
    dropFailedChecks(t, failedPages, failedSlots);
    return rest == n;
}

} // namespace kvcodec::kvcm

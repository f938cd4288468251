// SPDX-License-Identifier: Apache-2.0
#include "kvcm/levels.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace kvcodec::kvcm {

SlotPool::SlotPool(uint64_t numSlots)
    : ready_(numSlots)
    , count_(numSlots)
{
    free_.reserve(numSlots);
    for (uint64_t s = numSlots; s-- > 0;)
    {
        free_.push_back(int32_t(s)); // take() pops slot 0 first
    }
}

uint64_t SlotPool::resetPeak() noexcept
{
    uint64_t const peak = peak_;
    peak_ = usedSlots();
    return peak;
}

int32_t SlotPool::take() noexcept
{
    int32_t const slot = free_.back();
    free_.pop_back();
    peak_ = std::max(peak_, usedSlots());
    return slot;
}

void SlotPool::give(int32_t slot, EventPtr ready) noexcept
{
    if (size_t(slot) < retireOnGive_.size() && retireOnGive_[size_t(slot)] != 0)
    {
        retireOnGive_[size_t(slot)] = 0;
        withholdOne(slot);
        retired_.emplace_back(slot, ready); // Reserved by ownOnly() and takeRetired().
        ready_[size_t(slot)] = std::move(ready);
        return;
    }
    ready_[size_t(slot)] = std::move(ready);
    free_.push_back(slot);
}

void SlotPool::ownOnly(std::vector<int32_t> const& mine)
{
    std::vector<uint8_t> own(count_, 0);
    for (int32_t s : mine)
    {
        own[size_t(s)] = 1;
    }
    free_.clear();
    withheld_.clear();
    // give() never allocates: every list can hold every slot.
    free_.reserve(count_);
    withheld_.reserve(count_);
    retired_.reserve(count_);
    withheldAt_.assign(count_, -1);
    for (uint64_t s = count_; s-- > 0;)
    {
        if (own[s] != 0)
        {
            free_.push_back(int32_t(s));
        }
        else
        {
            withholdOne(int32_t(s));
        }
    }
    retireOnGive_.assign(count_, 0);
}

void SlotPool::withholdOne(int32_t slot) noexcept
{
    withheldAt_[size_t(slot)] = int64_t(withheld_.size());
    withheld_.push_back(slot);
}

bool SlotPool::unwithholdOne(int32_t slot) noexcept
{
    int64_t const at = withheldAt_[size_t(slot)];
    if (at < 0)
    {
        return false;
    }
    int32_t const last = withheld_.back();
    withheld_[size_t(at)] = last;
    withheldAt_[size_t(last)] = at;
    withheld_.pop_back();
    withheldAt_[size_t(slot)] = -1;
    return true;
}

void SlotPool::adopt(std::vector<int32_t> const& slots, bool asFree) noexcept
{
    for (int32_t s : slots)
    {
        asFree ? adoptOne(s) : unwithholdOne(s);
    }
    peak_ = std::max(peak_, usedSlots());
}

bool SlotPool::adoptOne(int32_t slot) noexcept
{
    if (!unwithholdOne(slot))
    {
        return false;
    }
    free_.push_back(slot);
    return true;
}

void SlotPool::retireOnGive(int32_t slot)
{
    retireOnGive_[size_t(slot)] = 1;
}

std::vector<std::pair<int32_t, EventPtr>> SlotPool::takeRetired()
{
    std::vector<std::pair<int32_t, EventPtr>> out = std::move(retired_);
    retired_.clear();
    retired_.reserve(count_);
    return out;
}

void SlotPool::withhold(uint64_t limit)
{
    auto const keep = std::stable_partition(free_.begin(), free_.end(), [&](int32_t s) { return uint64_t(s) < limit; });
    withheld_.insert(withheld_.end(), keep, free_.end());
    free_.erase(keep, free_.end());
}

void SlotPool::restore()
{
    free_.insert(free_.end(), withheld_.begin(), withheld_.end());
    withheld_.clear();
}

uint64_t SlotPool::freeAtOrAbove(uint64_t limit) const noexcept
{
    auto const above = [&](int32_t s) { return uint64_t(s) >= limit; };
    return uint64_t(
        std::count_if(free_.begin(), free_.end(), above) + std::count_if(withheld_.begin(), withheld_.end(), above));
}

void SlotPool::setNumSlots(uint64_t numSlots)
{
    restore();
    std::vector<bool> isFree(std::max(numSlots, count_), false);
    for (int32_t s : free_)
    {
        isFree[size_t(s)] = true;
    }
    for (uint64_t s = count_; s < numSlots; ++s)
    {
        isFree[size_t(s)] = true;
    }
    if (ready_.size() < numSlots)
    {
        ready_.resize(numSlots);
    }
    count_ = numSlots;
    free_.clear();
    for (uint64_t s = numSlots; s-- > 0;)
    {
        if (isFree[size_t(s)])
        {
            free_.push_back(int32_t(s)); // take() pops the lowest first
        }
    }
    peak_ = std::max(peak_, usedSlots());
}

std::optional<StagingBuffer> ColdLevel::stage(
    PoolGroupIndex group, size_t count, std::optional<Stream> owner, std::string& error)
{
    (void)group;
    (void)count;
    (void)owner;
    error = std::string("the ") + levelName(level()) + " level does not stage blobs";
    return std::nullopt;
}

BlobIo ColdLevel::submitRead(
    PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count, BlobStatus* status) noexcept
{
    (void)group;
    (void)slots;
    (void)dsts;
    for (size_t i = 0; i < count; ++i)
    {
        status[i] = BlobStatus::kFailed;
    }
    return BlobIo{1};
}

BlobIo ColdLevel::submitWrite(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs,
    BlobName const* names, size_t count) noexcept
{
    (void)group;
    (void)slots;
    (void)srcs;
    (void)names;
    (void)count;
    return BlobIo{1};
}

bool ColdLevel::complete(BlobIo io, std::string& error) noexcept
{
    (void)io;
    error = std::string("the ") + levelName(level()) + " level takes no staged reads or writes";
    return false;
}

HostColdLevel::HostColdLevel(runtime::DeviceRuntime& runtime, std::vector<std::pair<uint64_t, uint64_t>> const& groups)
    : runtime_(runtime)
{
    groups_.reserve(groups.size());
    for (auto const& [pageBytes, numSlots] : groups)
    {
        groups_.push_back(
            Pool{std::make_shared<runtime::HostMem>(runtime, pageBytes * numSlots), pageBytes, SlotPool(numSlots)});
    }
}

void HostColdLevel::resize(PoolGroupIndex group, uint64_t numSlots)
{
    Pool& pool = groups_[size_t(group)];
    uint64_t const old = pool.slots.numSlots();
    std::vector<bool> used(old, true);
    // The old pool's bytes may still be read or written by transfers: wait for all of them.
    runtime::Event* last = nullptr;
    for (uint64_t s = 0; s < old; ++s)
    {
        EventPtr const& e = pool.slots.ready(int32_t(s));
        if (e && e.get() != last)
        {
            e->synchronize();
            last = e.get();
        }
        pool.slots.setReady(int32_t(s), nullptr);
    }
    pool.slots.restore();
    for (int32_t s : pool.slots.freeList())
    {
        used[size_t(s)] = false;
    }
    auto memory = std::make_shared<runtime::HostMem>(runtime_, size_t(pool.pageBytes * numSlots));
    // Runs of used slots are copied on the host (both pools are host memory on every backend).
    for (uint64_t s = 0; s < old;)
    {
        if (!used[size_t(s)])
        {
            ++s;
            continue;
        }
        uint64_t e = s;
        while (e < old && used[size_t(e)])
        {
            ++e;
        }
        if (e > numSlots)
        {
            throw std::logic_error("HostColdLevel::resize: a used slot lies beyond the new slot count");
        }
        std::memcpy(memory->data() + s * pool.pageBytes, pool.memory->data() + s * pool.pageBytes,
            size_t((e - s) * pool.pageBytes));
        s = e;
    }
    pool.memory = std::move(memory);
    pool.slots.setNumSlots(numSlots);
}

bool copyBlobs(runtime::DeviceRuntime& runtime, std::byte* base, uint64_t pageBytes, int32_t const* slots,
    std::byte* const* dsts, std::byte const* const* srcs, size_t count, Stream stream, std::string& error) noexcept
{
    // Exactly one of `dsts` (copies out of the pool) and `srcs` (copies into it) is given.
    thread_local std::vector<void*> to;
    thread_local std::vector<void const*> from;
    thread_local std::vector<size_t> sizes;
    try
    {
        to.clear();
        from.clear();
        sizes.clear();
        for (size_t i = 0; i < count; ++i)
        {
            std::byte* blob = base + uint64_t(slots[i]) * pageBytes;
            std::byte const* other = dsts != nullptr ? dsts[i] : srcs[i];
            // A blob that continues the previous copy on both sides joins it: the copy engines
            // move a copy of one 64 KiB page far below the link's speed, and pages moved
            // together mostly lie in neighbouring slots.
            bool const joins = i > 0 && slots[i] == slots[i - 1] + 1
                && other == (dsts != nullptr ? dsts[i - 1] : srcs[i - 1]) + pageBytes;
            if (joins)
            {
                sizes.back() += size_t(pageBytes);
                continue;
            }
            to.push_back(dsts != nullptr ? static_cast<void*>(dsts[i]) : blob);
            from.push_back(dsts != nullptr ? static_cast<void const*>(blob) : srcs[i]);
            sizes.push_back(size_t(pageBytes));
        }
    }
    catch (std::exception const& e)
    {
        error = e.what();
        return false;
    }
    return runtime.copyBatch(to.data(), from.data(), sizes.data(), to.size(), stream, error);
}

bool HostColdLevel::copy(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts,
    std::byte const* const* srcs, size_t count, Stream stream, std::string& error) noexcept
{
    Pool const& pool = groups_[size_t(group)];
    return copyBlobs(runtime_, pool.memory->data(), pool.pageBytes, slots, dsts, srcs, count, stream, error);
}

bool HostColdLevel::copyOut(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count,
    Stream stream, std::string& error) noexcept
{
    return copy(group, slots, dsts, nullptr, count, stream, error);
}

bool HostColdLevel::copyIn(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count,
    Stream stream, std::string& error) noexcept
{
    return copy(group, slots, nullptr, srcs, count, stream, error);
}

void HostColdLevel::applyQuota(std::vector<uint64_t> const& slots, uint64_t quota)
{
    (void)quota; // The manager's projection already turned it into slot counts.
    for (size_t g = 0; g < groups_.size(); ++g)
    {
        if (slots[g] != groups_[g].slots.numSlots())
        {
            resize(PoolGroupIndex(g), slots[g]);
        }
    }
}

} // namespace kvcodec::kvcm

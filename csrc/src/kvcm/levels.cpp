// SPDX-License-Identifier: Apache-2.0
#include "kvcm/levels.h"

#include <algorithm>

namespace kvcodec::kvcm {

SlotPool::SlotPool(uint64_t numSlots)
    : ready_(numSlots)
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
    ready_[size_t(slot)] = std::move(ready);
    free_.push_back(slot);
}

HostColdLevel::HostColdLevel(runtime::DeviceRuntime& runtime, std::vector<std::pair<uint64_t, uint64_t>> const& groups)
    : runtime_(runtime)
{
    pools_.reserve(groups.size());
    for (auto const& [pageBytes, numSlots] : groups)
    {
        pools_.push_back(Pool{runtime::HostMem(runtime, pageBytes * numSlots), pageBytes, SlotPool(numSlots)});
    }
}

bool HostColdLevel::copy(PoolGroupIndex group, int32_t const* slots, std::byte* const* others, size_t count, bool out,
    Stream stream, std::string& error) noexcept
{
    thread_local std::vector<void*> dsts;
    thread_local std::vector<void const*> srcs;
    thread_local std::vector<size_t> sizes;
    try
    {
        Pool const& pool = pools_[size_t(group)];
        dsts.resize(count);
        srcs.resize(count);
        sizes.assign(count, pool.pageBytes);
        for (size_t i = 0; i < count; ++i)
        {
            std::byte* blob = pool.memory.data() + uint64_t(slots[i]) * pool.pageBytes;
            dsts[i] = out ? static_cast<void*>(others[i]) : blob;
            srcs[i] = out ? static_cast<void const*>(blob) : others[i];
        }
    }
    catch (std::exception const& e)
    {
        error = e.what();
        return false;
    }
    return runtime_.copyBatch(dsts.data(), srcs.data(), sizes.data(), count, stream, error);
}

bool HostColdLevel::copyOut(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count,
    Stream stream, std::string& error) noexcept
{
    return copy(group, slots, dsts, count, true, stream, error);
}

bool HostColdLevel::copyIn(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count,
    Stream stream, std::string& error) noexcept
{
    return copy(group, slots, const_cast<std::byte* const*>(srcs), count, false, stream, error);
}

} // namespace kvcodec::kvcm

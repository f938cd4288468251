// SPDX-License-Identifier: Apache-2.0
#include "kvcm/staging.h"
#include "runtime/log.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace kvcodec::kvcm {
namespace {

runtime::Allocation const& allocationOf(StagingManager::Backing const& backing) noexcept
{
    return std::visit([](auto const& a) -> runtime::Allocation const& { return a; }, backing);
}

bool isPowerOfTwo(size_t v) noexcept
{
    return v != 0 && (v & (v - 1)) == 0;
}

} // namespace

StagingManager::StagingManager(runtime::DeviceRuntime& runtime, Backing backing)
    : runtime_(runtime)
    , backing_(std::move(backing))
{
    if (capacity() == 0)
    {
        throw std::invalid_argument("a staging manager needs a non-empty backing allocation");
    }
    ranges_.push_back({0, capacity(), false, nullptr});
}

StagingManager::~StagingManager()
{
    if (live_ != 0)
    {
        // A lease is a non-owning view of this manager's bytes; outliving it is a programming
        // error that would leave asynchronous work writing freed memory.
        // To stderr at once: the process aborts before a sink could deliver it.
        log::writeStderr(
            log::Level::kError, "a staging manager was destroyed with " + std::to_string(live_) + " live lease(s)");
        std::abort();
    }
    for (auto& r : ranges_)
    {
        if (r.event)
        {
            try
            {
                r.event->synchronize();
            }
            catch (std::exception const& e)
            {
                log::write(log::Level::kError, std::string("synchronizing a staging event failed: ") + e.what());
            }
        }
    }
}

runtime::MemoryKind StagingManager::kind() const noexcept
{
    return allocationOf(backing_).kind();
}

std::byte* StagingManager::base() const noexcept
{
    return allocationOf(backing_).data();
}

size_t StagingManager::capacity() const noexcept
{
    return allocationOf(backing_).size();
}

std::vector<StagingManager::RangeInfo> StagingManager::ranges() const
{
    std::vector<RangeInfo> out;
    out.reserve(ranges_.size());
    for (auto const& r : ranges_)
    {
        out.push_back({r.offset, r.size, r.live, r.event.get()});
    }
    return out;
}

StagingManager::Iter StagingManager::splitAt(size_t offset)
{
    for (auto it = ranges_.begin(); it != ranges_.end(); ++it)
    {
        if (it->offset == offset)
        {
            return it;
        }
        if (it->offset < offset && offset < it->offset + it->size)
        {
            Range tail{offset, it->offset + it->size - offset, it->live, it->event};
            it->size = offset - it->offset;
            return ranges_.insert(std::next(it), std::move(tail));
        }
    }
    return ranges_.end();
}

bool StagingManager::tryRun(size_t runStart, size_t runEnd, size_t minBytes, size_t maxBytes, size_t granularity,
    size_t alignment, size_t& outOffset, size_t& outSize) const
{
    auto const baseAddr = reinterpret_cast<uintptr_t>(base());
    uintptr_t const aligned = (baseAddr + runStart + alignment - 1) & ~uintptr_t(alignment - 1);
    size_t const start = size_t(aligned - baseAddr);
    if (start >= runEnd)
    {
        return false;
    }
    size_t const available = (runEnd - start) / granularity * granularity;
    if (available < minBytes)
    {
        return false;
    }
    outOffset = start;
    outSize = available < maxBytes ? available : maxBytes;
    return true;
}

std::optional<StagingBuffer> StagingManager::acquire(
    size_t minBytes, size_t maxBytes, size_t granularity, size_t alignment, std::optional<Stream> owner)
{
    if (granularity == 0)
    {
        throw std::invalid_argument("staging granularity is 0; it must be positive");
    }
    if (!isPowerOfTwo(alignment))
    {
        throw std::invalid_argument(
            "staging alignment is " + std::to_string(alignment) + "; it must be a power of two");
    }
    if (granularity % alignment != 0)
    {
        throw std::invalid_argument("staging granularity " + std::to_string(granularity)
            + " is not a multiple of the alignment " + std::to_string(alignment)
            + "; every granularity-sized slice of a lease must start aligned");
    }
    if (minBytes == 0)
    {
        throw std::invalid_argument("staging minBytes is 0; it must be positive");
    }
    if (minBytes > SIZE_MAX - granularity)
    {
        throw std::invalid_argument("staging minBytes " + std::to_string(minBytes) + " overflows when rounded up");
    }
    size_t const minR = (minBytes + granularity - 1) / granularity * granularity;
    size_t const maxR = maxBytes / granularity * granularity;
    if (maxR < minR)
    {
        throw std::invalid_argument("staging maxBytes " + std::to_string(maxBytes) + " rounds down to "
            + std::to_string(maxR) + ", below minBytes " + std::to_string(minBytes) + " rounded up to "
            + std::to_string(minR) + " (granularity " + std::to_string(granularity) + ")");
    }

    size_t offset = 0;
    size_t size = 0;
    bool found = false;
    // Scans maximal runs of retired ranges; `from` clips the first pass to the cursor, `before`
    // limits the second pass to runs that start before it.
    auto scan = [&](size_t from, size_t before) {
        size_t runStart = SIZE_MAX;
        for (auto it = ranges_.begin();; ++it)
        {
            bool const end = it == ranges_.end();
            if (!end && !it->live)
            {
                if (runStart == SIZE_MAX)
                {
                    runStart = it->offset;
                }
                continue;
            }
            if (runStart != SIZE_MAX)
            {
                size_t const runEnd = end ? capacity() : it->offset;
                if (runStart >= before)
                {
                    return;
                }
                size_t const start = runStart > from ? runStart : from;
                if (start < runEnd && tryRun(start, runEnd, minR, maxR, granularity, alignment, offset, size))
                {
                    found = true;
                    return;
                }
                runStart = SIZE_MAX;
            }
            if (end)
            {
                return;
            }
        }
    };
    scan(cursor_, SIZE_MAX);
    if (!found && cursor_ > 0)
    {
        scan(0, cursor_);
    }
    if (!found)
    {
        return std::nullopt;
    }

    // Carve only the payload; the padding before it and the rest of the run stay retired.
    Iter first = splitAt(offset);
    if (offset + size < capacity())
    {
        splitAt(offset + size);
    }
    std::vector<EventPtr> events;
    Iter it = first;
    while (it != ranges_.end() && it->offset < offset + size)
    {
        if (it->event && (events.empty() || events.back() != it->event))
        {
            events.push_back(it->event);
        }
        it = ranges_.erase(it);
    }
    Iter lease = ranges_.insert(it, Range{offset, size, true, nullptr});
    ++live_;
    cursor_ = offset + size;

    // Waits never invalidate the events: other fragments and streams may wait on them later.
    for (auto const& e : events)
    {
        if (owner)
        {
            e->waitOn(*owner);
        }
        else
        {
            e->synchronize();
        }
    }
    return StagingBuffer(this, lease, owner);
}

void StagingManager::release(Iter it, std::optional<Stream> owner)
{
    EventPtr event = owner ? runtime_.record(*owner) : nullptr;
    it->live = false;
    it->event = std::move(event);
    --live_;
    // Neighbours protected by the same event (or by none) merge; others stay split.
    if (it != ranges_.begin())
    {
        Iter prev = std::prev(it);
        if (!prev->live && prev->event == it->event)
        {
            prev->size += it->size;
            ranges_.erase(it);
            it = prev;
        }
    }
    Iter next = std::next(it);
    if (next != ranges_.end() && !next->live && next->event == it->event)
    {
        it->size += next->size;
        ranges_.erase(next);
    }
}

// ---------------------------------------------------------------------------------------------

StagingBuffer::StagingBuffer(StagingBuffer&& other) noexcept
    : manager_(other.manager_)
    , range_(other.range_)
    , owner_(other.owner_)
{
    other.manager_ = nullptr;
}

StagingBuffer& StagingBuffer::operator=(StagingBuffer&& other) noexcept
{
    if (this != &other)
    {
        reset();
        manager_ = other.manager_;
        range_ = other.range_;
        owner_ = other.owner_;
        other.manager_ = nullptr;
    }
    return *this;
}

StagingBuffer::~StagingBuffer()
{
    reset();
}

void StagingBuffer::reset() noexcept
{
    if (manager_ != nullptr)
    {
        try
        {
            manager_->release(range_, owner_);
        }
        catch (std::exception const& e)
        {
            // Recording the release event failed: fall back to a host synchronization so the
            // bytes are safe to reuse.
            log::write(log::Level::kWarning,
                std::string("recording a staging release event failed (synchronizing instead): ") + e.what());
            try
            {
                if (owner_)
                {
                    manager_->runtime_.synchronize(*owner_);
                }
            }
            catch (...)
            {
            }
            manager_->release(range_, std::nullopt);
        }
        manager_ = nullptr;
    }
}

std::byte* StagingBuffer::data() const noexcept
{
    return manager_ ? manager_->base() + range_->offset : nullptr;
}

size_t StagingBuffer::size() const noexcept
{
    return manager_ ? range_->size : 0;
}

size_t StagingBuffer::offset() const noexcept
{
    return manager_ ? range_->offset : 0;
}

void StagingBuffer::setStream(std::optional<Stream> owner)
{
    if (manager_ == nullptr)
    {
        throw std::logic_error("setStream() on a released staging lease");
    }
    if (owner_ == owner || !owner_)
    {
        owner_ = owner; // Same owner, or CPU access already complete before a stream takes over.
        return;
    }
    if (owner)
    {
        EventPtr e = manager_->runtime_.record(*owner_);
        if (e)
        {
            e->waitOn(*owner);
        }
    }
    else
    {
        manager_->runtime_.synchronize(*owner_);
    }
    owner_ = owner;
}

std::optional<StagingBuffer> stageBlobs(StagingManager& ring, uint64_t pageBytes, size_t count,
    std::optional<Stream> owner, char const* what, std::string& error)
{
    size_t const bytes = size_t(count * pageBytes);
    size_t const alignment = std::min<size_t>(size_t(pageBytes & (~pageBytes + 1)), 4096);
    std::optional<StagingBuffer> lease = ring.acquire(bytes, bytes, size_t(pageBytes), alignment, owner);
    if (!lease)
    {
        error = std::string(what) + " (" + std::to_string(ring.capacity()) + " bytes) has no free range of "
            + std::to_string(bytes) + " bytes";
    }
    return lease;
}

size_t maxStagedBlobs(StagingManager const& ring, uint64_t pageBytes) noexcept
{
    // With no lease live between transfers a slice this size always fits (a ring holds at least
    // three of the largest cold pages).
    return size_t(ring.capacity() / pageBytes / 2);
}

} // namespace kvcodec::kvcm

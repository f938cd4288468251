// SPDX-License-Identifier: Apache-2.0
//
// Staging rings: a backing buffer handed out as short-lived leases (StagingBuffer) whose bytes
// are reused once the previous user's work completed.
//
// The manager keeps a byte-accurate next-fit cursor and a spatially ordered partition of the
// backing buffer into ranges. A live range is the current lease; a retired range keeps the
// completion event of the previous temporal owner of its bytes (null: nothing outstanding).
// Allocation scans contiguous retired runs from the cursor to the physical end, skipping live
// ranges, then makes at most one more pass from the beginning. It never waits for a live lease
// (it could not retire on this thread): when no run fits, allocation fails. Alignment padding and
// end-of-ring slack stay retired with their inherited events, split at the boundaries of the
// ranges they came from, so every fragment keeps the event protecting its own bytes.
//
// Not internally thread-safe: each manager belongs to one KV-cache manager, whose public calls
// are serialized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <variant>
#include <vector>

#include "runtime/device_runtime.h"

namespace kvcodec::kvcm {

using runtime::EventPtr;
using runtime::Stream;

class StagingBuffer;

class StagingManager
{
public:
    /// The backing allocation; memory kind and base address derive from the active owner.
    using Backing = std::variant<runtime::HostMem, runtime::DeviceMem>;

    StagingManager(runtime::DeviceRuntime& runtime, Backing backing);

    /// Synchronizes every retired range's event, then frees the backing. Every lease must have
    /// been destroyed before (a lease is non-owning and must not outlive its manager).
    ~StagingManager();

    StagingManager(StagingManager const&) = delete;
    StagingManager& operator=(StagingManager const&) = delete;

    /// Leases between minBytes and maxBytes (rounded to a multiple of `granularity`: the minimum
    /// up, the maximum down) at an address aligned to `alignment` (a power of two dividing
    /// `granularity`). `owner` nullopt: the lease starts in synchronous CPU ownership and the
    /// previous owners' events are host-synchronized before returning; a stream: that stream
    /// waits on them. Returns nullopt when no retired run fits. Throws std::invalid_argument on
    /// bad parameters (naming them).
    std::optional<StagingBuffer> acquire(
        size_t minBytes, size_t maxBytes, size_t granularity, size_t alignment, std::optional<Stream> owner);

    [[nodiscard]] runtime::MemoryKind kind() const noexcept;
    [[nodiscard]] std::byte* base() const noexcept;
    [[nodiscard]] size_t capacity() const noexcept;
    [[nodiscard]] size_t cursor() const noexcept
    {
        return cursor_;
    }

    /// One range of the partition, for inspection and tests.
    struct RangeInfo
    {
        size_t offset;
        size_t size;
        bool live;
        runtime::Event* event; ///< The retired range's event (null: nothing outstanding).
    };

    [[nodiscard]] std::vector<RangeInfo> ranges() const;

    /// Number of live leases.
    [[nodiscard]] size_t liveLeases() const noexcept
    {
        return live_;
    }

private:
    friend class StagingBuffer;

    struct Range
    {
        size_t offset;
        size_t size;
        bool live;
        EventPtr event;
    };
    using Iter = std::list<Range>::iterator;

    // Splits the range containing `offset` so that a range starts there (fragments keep the event).
    Iter splitAt(size_t offset);
    bool tryRun(size_t runStart, size_t runEnd, size_t minBytes, size_t maxBytes, size_t granularity, size_t alignment,
        size_t& outOffset, size_t& outSize) const;
    void release(Iter it, std::optional<Stream> owner);

    runtime::DeviceRuntime& runtime_;
    Backing backing_;
    std::list<Range> ranges_;
    size_t cursor_ = 0;
    size_t live_ = 0;
};

/// A lease of staging bytes with one current owner: nullopt (synchronous CPU ownership, no
/// outstanding asynchronous access) or a stream. Move-only; releasing it (destruction) retires
/// its bytes: a stream-owned lease records its reusable event on that stream, a synchronously
/// owned one is reusable at once. Callers finish CPU access before moving ownership to a stream
/// and call setStream(stream) before submitting asynchronous work on a synchronously acquired
/// lease.
class StagingBuffer
{
public:
    StagingBuffer(StagingBuffer&& other) noexcept;
    StagingBuffer& operator=(StagingBuffer&& other) noexcept;
    StagingBuffer(StagingBuffer const&) = delete;
    StagingBuffer& operator=(StagingBuffer const&) = delete;
    ~StagingBuffer();

    [[nodiscard]] std::byte* data() const noexcept;
    [[nodiscard]] size_t size() const noexcept;
    [[nodiscard]] size_t offset() const noexcept;
    [[nodiscard]] std::optional<Stream> stream() const noexcept
    {
        return owner_;
    }

    /// Transfers ownership:
    ///   nullopt -> nullopt, nullopt -> stream, A -> A: nothing;
    ///   A -> B: record an event on A and make B wait on it;
    ///   stream -> nullopt: host-synchronize the old stream.
    void setStream(std::optional<Stream> owner);

    /// Releases the lease now (idempotent).
    void reset() noexcept;
    /// Releases the lease without recording an event: for a caller that waited for every access
    /// to its bytes already (its stream may be gone by then).
    void releaseFinished() noexcept
    {
        owner_.reset();
        reset();
    }

private:
    friend class StagingManager;
    StagingBuffer(StagingManager* manager, StagingManager::Iter range, std::optional<Stream> owner)
        : manager_(manager)
        , range_(range)
        , owner_(owner)
    {
    }

    StagingManager* manager_ = nullptr;
    StagingManager::Iter range_{};
    std::optional<Stream> owner_;
};

/// A slice of `ring` for `count` blobs of `pageBytes` each (blob i at data() + i * pageBytes),
/// aligned to the blob size's lowest set bit up to 4 KiB: what a staged cold level hands a
/// transfer. Null with `error` (naming `what`, the ring's owner) when no such range is free.
std::optional<StagingBuffer> stageBlobs(StagingManager& ring, uint64_t pageBytes, size_t count,
    std::optional<Stream> owner, char const* what, std::string& error);

/// Most blobs of `pageBytes` one slice of `ring` may carry so that it always fits with no other
/// slice live: half the ring.
[[nodiscard]] size_t maxStagedBlobs(StagingManager const& ring, uint64_t pageBytes) noexcept;

} // namespace kvcodec::kvcm

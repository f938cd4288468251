// SPDX-License-Identifier: Apache-2.0
//
// The device runtime interface the KV-cache manager is written against.
//
// Two backends implement it: CUDA (real streams and events, device memory, pinned mapped host
// memory whose host and device addresses are identical) and host (every kind of memory is host
// memory, work runs synchronously on the calling thread, events are always complete). The
// manager, its storage levels and its staging rings never ask which backend they run on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <cuda_runtime_api.h>

namespace kvcodec::runtime {

/// A stream handle as the codec contract passes it. The host backend ignores its value.
using Stream = cudaStream_t;

/// Completion marker of work enqueued on a stream. A null EventPtr means "already complete".
class Event
{
public:
    virtual ~Event() = default;

    /// Blocks the calling thread until the work before the event completed. After it returns,
    /// later synchronize()/waitOn() calls are free: the completion is remembered.
    virtual void synchronize() = 0;

    /// Makes `stream` wait for the event without blocking the host.
    virtual void waitOn(Stream stream) = 0;

    /// The stream the event was recorded on: waits from that same stream are implied by order.
    [[nodiscard]] virtual Stream stream() const noexcept = 0;

    /// True once the work before the event completed, without blocking where the backend can
    /// tell (the default waits for it). Throws on a device error.
    virtual bool query()
    {
        synchronize();
        return true;
    }
};

using EventPtr = std::shared_ptr<Event>;

/// Where an allocation lives.
enum class MemoryKind : int
{
    kDevice = 0,     ///< Device memory (host memory on the host backend).
    kMappedHost = 1, ///< Pinned host memory mapped into the device at the same address.
};

class DeviceRuntime
{
public:
    virtual ~DeviceRuntime() = default;

    /// "cpu" or "cuda:N".
    [[nodiscard]] virtual std::string name() const = 0;

    /// The device a codec for this runtime must be created on (KVCODEC_DEVICE_CPU or an ordinal).
    [[nodiscard]] virtual int32_t codecDevice() const noexcept = 0;

    /// Allocates `bytes` (> 0) of `kind`, zero-filled. Throws std::runtime_error naming the
    /// size and reason on failure.
    virtual void* allocate(MemoryKind kind, size_t bytes) = 0;
    virtual void deallocate(MemoryKind kind, void* ptr) noexcept = 0;

    /// Makes `bytes` of host memory at `ptr` (allocated elsewhere, e.g. a shared mapping) pinned
    /// and device-mapped at the same address, like kMappedHost memory, until unregisterHost().
    /// Throws naming the failed call. The host backend has nothing to do.
    virtual void registerHost(void* ptr, size_t bytes)
    {
        (void)ptr;
        (void)bytes;
    }
    virtual void unregisterHost(void* ptr) noexcept
    {
        (void)ptr;
    }

    /// A stream owned by the caller (destroyStream). On CUDA it is a blocking stream, so it is
    /// ordered after work on the legacy default stream.
    virtual Stream createStream() = 0;
    virtual void destroyStream(Stream stream) noexcept = 0;

    /// Records an event after the work enqueued so far on `stream` (null on the host backend).
    virtual EventPtr record(Stream stream) = 0;

    /// True when recordTimed() gives events elapsedSeconds() can time (the CUDA backend).
    [[nodiscard]] virtual bool timesEvents() const noexcept
    {
        return false;
    }

    /// Records an event that carries a device timestamp, or null where the backend keeps none.
    virtual EventPtr recordTimed(Stream stream)
    {
        (void)stream;
        return nullptr;
    }

    /// Device seconds between two events of recordTimed() once both completed, without
    /// blocking; std::nullopt while either is still pending. Throws std::runtime_error naming
    /// the call when the device reports an error.
    virtual std::optional<double> elapsedSeconds(Event& start, Event& end)
    {
        (void)start;
        (void)end;
        return std::nullopt;
    }

    /// Blocks until everything enqueued on `stream` completed.
    virtual void synchronize(Stream stream) = 0;

    /// Blocks until the work enqueued on `stream` so far completed, sleeping instead of
    /// spinning (the wait costs no CPU time). Defaults to synchronize().
    virtual void waitBlocking(Stream stream)
    {
        synchronize(stream);
    }

    /// Enqueues `count` copies on `stream` (stream-ordered source access). Returns false with a
    /// reason on a synchronous submission failure.
    virtual bool copyBatch(void* const* dsts, void const* const* srcs, size_t const* sizes, size_t count, Stream stream,
        std::string& error) noexcept = 0;

    /// Copies `bytes` of pageable host memory to device memory `dst`, ordered on `stream`. The
    /// host source is consumed before the call returns (the caller may reuse it at once); the
    /// transfer itself may still be in flight.
    virtual bool uploadFromPageable(
        void* dst, void const* hostSrc, size_t bytes, Stream stream, std::string& error) noexcept = 0;

    /// Enqueues on `stream` the CRC-32C of `count` blobs: crcs[i] gets that of the lengths[i]
    /// bytes at base + i * stride. Every pointer must be device-accessible (device or mapped host
    /// memory); crcs is read once the stream passed this point. The host backend computes them
    /// before returning. Returns false with a reason when the work cannot be submitted.
    virtual bool checksums(void const* base, uint64_t stride, uint32_t const* lengths, size_t count, uint32_t* crcs,
        Stream stream, std::string& error) noexcept = 0;
};

/// Creates the host backend.
std::unique_ptr<DeviceRuntime> createHostRuntime();

/// Creates the CUDA backend for device `ordinal`. Throws std::runtime_error when no driver or
/// no such device is present.
std::unique_ptr<DeviceRuntime> createCudaRuntime(int32_t ordinal);

/// An owned allocation of one memory kind.
class Allocation
{
public:
    Allocation() = default;
    Allocation(DeviceRuntime& runtime, MemoryKind kind, size_t bytes)
        : runtime_(&runtime)
        , kind_(kind)
        , ptr_(runtime.allocate(kind, bytes))
        , bytes_(bytes)
    {
    }
    ~Allocation()
    {
        reset();
    }
    Allocation(Allocation&& other) noexcept
    {
        *this = std::move(other);
    }
    Allocation& operator=(Allocation&& other) noexcept
    {
        if (this != &other)
        {
            reset();
            runtime_ = other.runtime_;
            kind_ = other.kind_;
            ptr_ = other.ptr_;
            bytes_ = other.bytes_;
            other.ptr_ = nullptr;
            other.bytes_ = 0;
        }
        return *this;
    }
    Allocation(Allocation const&) = delete;
    Allocation& operator=(Allocation const&) = delete;

    [[nodiscard]] std::byte* data() const noexcept
    {
        return static_cast<std::byte*>(ptr_);
    }
    [[nodiscard]] size_t size() const noexcept
    {
        return bytes_;
    }
    [[nodiscard]] MemoryKind kind() const noexcept
    {
        return kind_;
    }

    void reset() noexcept
    {
        if (ptr_ != nullptr)
        {
            runtime_->deallocate(kind_, ptr_);
            ptr_ = nullptr;
            bytes_ = 0;
        }
    }

private:
    DeviceRuntime* runtime_ = nullptr;
    MemoryKind kind_ = MemoryKind::kDevice;
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

/// Pinned, device-mapped host memory (host address == device address).
struct HostMem : Allocation
{
    HostMem(DeviceRuntime& runtime, size_t bytes)
        : Allocation(runtime, MemoryKind::kMappedHost, bytes)
    {
    }
};

/// Device memory.
struct DeviceMem : Allocation
{
    DeviceMem(DeviceRuntime& runtime, size_t bytes)
        : Allocation(runtime, MemoryKind::kDevice, bytes)
    {
    }
};

} // namespace kvcodec::runtime

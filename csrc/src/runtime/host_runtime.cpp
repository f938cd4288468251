// SPDX-License-Identifier: Apache-2.0
#include "runtime/host_runtime.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "kvcodec/crc32c.h"
#include "kvcodec/plugin.h"

namespace kvcodec::runtime {
namespace {
// Page alignment, like the pinned and device allocations of the CUDA backend.
constexpr size_t kAlignment = 4096;
} // namespace

std::string HostRuntime::name() const
{
    return "cpu";
}

int32_t HostRuntime::codecDevice() const noexcept
{
    return KVCODEC_DEVICE_CPU;
}

void* HostRuntime::allocate(MemoryKind, size_t bytes)
{
    size_t const rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = rounded >= bytes ? std::aligned_alloc(kAlignment, rounded) : nullptr;
    if (p == nullptr)
    {
        throw std::runtime_error("cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    }
    std::memset(p, 0, rounded);
    return p;
}

void HostRuntime::deallocate(MemoryKind, void* ptr) noexcept
{
    std::free(ptr);
}

Stream HostRuntime::createStream()
{
    return nullptr;
}

void HostRuntime::destroyStream(Stream) noexcept {}

EventPtr HostRuntime::record(Stream)
{
    return nullptr; // Work already ran on the calling thread.
}

void HostRuntime::synchronize(Stream) {}

bool HostRuntime::copyBatch(
    void* const* dsts, void const* const* srcs, size_t const* sizes, size_t count, Stream, std::string&) noexcept
{
    for (size_t i = 0; i < count; ++i)
    {
        std::memcpy(dsts[i], srcs[i], sizes[i]);
    }
    return true;
}

bool HostRuntime::uploadFromPageable(void* dst, void const* hostSrc, size_t bytes, Stream, std::string&) noexcept
{
    std::memcpy(dst, hostSrc, bytes);
    return true;
}

bool HostRuntime::checksums(void const* base, uint64_t stride, uint32_t const* lengths, size_t count, uint32_t* crcs,
    Stream, std::string&) noexcept
{
    for (size_t i = 0; i < count; ++i)
    {
        crcs[i] = crc32cFast(static_cast<std::byte const*>(base) + i * stride, lengths[i]);
    }
    return true;
}

std::unique_ptr<DeviceRuntime> createHostRuntime()
{
    return std::make_unique<HostRuntime>();
}

} // namespace kvcodec::runtime

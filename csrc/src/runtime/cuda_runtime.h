// SPDX-License-Identifier: Apache-2.0
//
// The CUDA backend: device memory from cudaMalloc, pinned mapped host memory with identical host
// and device addresses, blocking streams, events without timing (timed ones on request), and copies submitted through
// driver entry points fetched at run time (cuMemcpyBatchAsync where the driver has it).
#pragma once

#include "runtime/device_runtime.h"

namespace kvcodec::runtime {

class CudaRuntime final : public DeviceRuntime
{
public:
    explicit CudaRuntime(int32_t ordinal);

    [[nodiscard]] std::string name() const override;
    [[nodiscard]] int32_t codecDevice() const noexcept override;
    void* allocate(MemoryKind kind, size_t bytes) override;
    void deallocate(MemoryKind kind, void* ptr) noexcept override;
    void registerHost(void* ptr, size_t bytes) override;
    void unregisterHost(void* ptr) noexcept override;
    Stream createStream() override;
    void destroyStream(Stream stream) noexcept override;
    EventPtr record(Stream stream) override;
    [[nodiscard]] bool timesEvents() const noexcept override;
    EventPtr recordTimed(Stream stream) override;
    std::optional<double> elapsedSeconds(Event& start, Event& end) override;
    void synchronize(Stream stream) override;
    void waitBlocking(Stream stream) override;
    bool copyBatch(void* const* dsts, void const* const* srcs, size_t const* sizes, size_t count, Stream stream,
        std::string& error) noexcept override;
    bool uploadFromPageable(
        void* dst, void const* hostSrc, size_t bytes, Stream stream, std::string& error) noexcept override;
    bool checksums(void const* base, uint64_t stride, uint32_t const* lengths, size_t count, uint32_t* crcs,
        Stream stream, std::string& error) noexcept override;

private:
    int32_t ordinal_;
};

} // namespace kvcodec::runtime

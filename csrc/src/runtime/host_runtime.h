// SPDX-License-Identifier: Apache-2.0
//
// The host backend: hot pools, cold pools and staging rings in host memory, copies as memcpy on
// the calling thread, and events that are always complete (record() returns null). CPU reference
// codecs run against it, which lets every manager path run on a machine without a GPU.
#pragma once

#include "runtime/device_runtime.h"

namespace kvcodec::runtime {

class HostRuntime : public DeviceRuntime
{
public:
    [[nodiscard]] std::string name() const override;
    [[nodiscard]] int32_t codecDevice() const noexcept override;
    // Host memory of every kind; work runs on the calling thread, so there are no streams (null)
    // and nothing to wait for (record() returns null).
    void* allocate(MemoryKind kind, size_t bytes) override;
    void deallocate(MemoryKind kind, void* ptr) noexcept override;
    EventPtr record(Stream stream) override;
    Stream createStream() override;
    void synchronize(Stream stream) override;
    void destroyStream(Stream stream) noexcept override;
    bool copyBatch(void* const* dsts, void const* const* srcs, size_t const* sizes, size_t count, Stream stream,
        std::string& error) noexcept override;
    bool uploadFromPageable(
        void* dst, void const* hostSrc, size_t bytes, Stream stream, std::string& error) noexcept override;
    bool checksums(void const* base, uint64_t stride, uint32_t const* lengths, size_t count, uint32_t* crcs,
        Stream stream, std::string& error) noexcept override;
};

} // namespace kvcodec::runtime

// SPDX-License-Identifier: Apache-2.0
//
// A scoped CUDA device switch for codecs and hosts: codec calls arrive on the caller's thread with
// whatever device is current, so work for another device switches for the call and restores the
// caller's device afterwards; and where a buffer's memory lives. Header-only, for use inside
// codecs (built-in or plugin).
#pragma once

#include <cuda_runtime_api.h>

namespace kvcodec {

/// Makes `device` current for the scope, its primary context current on this thread (for driver
/// API calls too), and restores the caller's device on exit. The device is set even when it is
/// already the current one: a thread that has made no runtime call yet (an engine's worker, a
/// manager's I/O thread) reports device 0 but has no current context until cudaSetDevice. Never
/// throws; `ok()` is false when the switch failed (the caller's device is then unchanged).
class DeviceScope
{
public:
    explicit DeviceScope(int device) noexcept
    {
        bool const known = cudaGetDevice(&previous_) == cudaSuccess;
        ok_ = cudaSetDevice(device) == cudaSuccess;
        restore_ = ok_ && known && previous_ != device;
        if (!ok_)
        {
            cudaGetLastError();
        }
    }

    ~DeviceScope()
    {
        if (restore_)
        {
            cudaSetDevice(previous_);
        }
    }

    DeviceScope(DeviceScope const&) = delete;
    DeviceScope& operator=(DeviceScope const&) = delete;

    [[nodiscard]] bool ok() const noexcept
    {
        return ok_;
    }

private:
    int previous_ = -1;
    bool ok_ = true;
    bool restore_ = false;
};

/// Whether `p` is device memory (a host query, no synchronization): codecs pick their work split
/// by where the blobs are, since blobs in host memory cross PCIe. Memory CUDA does not know, or a
/// failed query, counts as host memory.
inline bool isDeviceMemory(void const* p) noexcept
{
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess)
    {
        cudaGetLastError();
        return false;
    }
    return attributes.type == cudaMemoryTypeDevice;
}

} // namespace kvcodec

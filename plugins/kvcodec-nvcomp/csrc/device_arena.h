// SPDX-License-Identifier: Apache-2.0
//
// Host-side helpers of the CUDA code: workspaces allocated together and freed together (the
// SDK's DeviceArray<T> holds arrays uploaded from the host; these are uninitialized device
// scratch of many types), and status checks that throw.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <nvcomp.h>

#include "kvcodec/cuda_error.h"

namespace kvcodec::nvcomp_plugin {

/// Throws std::runtime_error "<what> failed: <CUDA error text>" unless `st` is cudaSuccess.
inline void check(cudaError_t st, char const* what)
{
    if (st != cudaSuccess)
    {
        cudaGetLastError();
        throw std::runtime_error(std::string(what) + " failed: " + cudaErrorText(st));
    }
}

/// Throws std::runtime_error "<what> failed: nvcompStatus_t <n>" unless `st` is nvcompSuccess.
inline void check(nvcompStatus_t st, char const* what)
{
    if (st != nvcompSuccess)
    {
        throw std::runtime_error(std::string(what) + " failed: nvcompStatus_t " + std::to_string(int(st)));
    }
}

// Device allocations freed together (on the device current at destruction).
class DeviceArena
{
public:
    DeviceArena() = default;
    DeviceArena(DeviceArena const&) = delete;
    DeviceArena& operator=(DeviceArena const&) = delete;

    ~DeviceArena()
    {
        for (void* p : blocks_)
            cudaFree(p);
    }

    template <class T>
    T* alloc(uint64_t count, char const* what)
    {
        if (count == 0)
            return nullptr;
        void* p = nullptr;
        cudaError_t st = cudaMalloc(&p, count * sizeof(T));
        if (st != cudaSuccess)
        {
            cudaGetLastError();
            throw std::runtime_error(std::string("allocating ") + std::to_string(count * sizeof(T)) + " bytes for "
                + what + " failed: " + cudaErrorText(st));
        }
        blocks_.push_back(p);
        return static_cast<T*>(p);
    }

private:
    std::vector<void*> blocks_;
};

} // namespace kvcodec::nvcomp_plugin

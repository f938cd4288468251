// SPDX-License-Identifier: Apache-2.0
#include "driver_api.h"

namespace kvcodec::runtime {
namespace {

template <typename Fn>
Fn lookup(char const* symbol, unsigned version) noexcept
{
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &status) != cudaSuccess
        || status != cudaDriverEntryPointSuccess)
    {
        cudaGetLastError(); // A missing symbol is not a sticky error; clear it for the caller.
        return nullptr;
    }
    return reinterpret_cast<Fn>(fn);
}

DriverApi load() noexcept
{
    DriverApi api;
    if (cudaDriverGetVersion(&api.driverVersion) != cudaSuccess)
    {
        cudaGetLastError();
        api.driverVersion = 0;
        return api;
    }
    if (api.driverVersion == 0)
    {
        return api;
    }
    // The 13.0 ABI of cuMemcpyBatchAsync dropped failIdx; a 12.8-12.9 driver only has the old one.
    if (api.driverVersion >= 13000)
    {
        api.memcpyBatchAsyncV13 = lookup<PFN_cuMemcpyBatchAsync_v13000>("cuMemcpyBatchAsync", 13000);
    }
    if (api.memcpyBatchAsyncV13 == nullptr && api.driverVersion >= 12080)
    {
        api.memcpyBatchAsyncV12 = lookup<PFN_cuMemcpyBatchAsync_v12080>("cuMemcpyBatchAsync", 12080);
    }
    api.memcpyAsync = lookup<PFN_cuMemcpyAsync_v4000>("cuMemcpyAsync", 4000);
    api.pointerGetAttribute = lookup<PFN_cuPointerGetAttribute_v4000>("cuPointerGetAttribute", 4000);
    api.getErrorString = lookup<PFN_cuGetErrorString_v6000>("cuGetErrorString", 6000);
    api.streamWaitValue32 = lookup<PFN_cuStreamWaitValue32_v11070>("cuStreamWaitValue32", 11070);
    return api;
}

} // namespace

DriverApi const& driverApi() noexcept
{
    static DriverApi const api = load();
    return api;
}

std::string driverErrorText(CUresult result)
{
    char const* text = nullptr;
    if (driverApi().getErrorString != nullptr)
    {
        driverApi().getErrorString(result, &text);
    }
    return "CUresult " + std::to_string(int(result)) + (text ? std::string(": ") + text : std::string());
}

} // namespace kvcodec::runtime

// SPDX-License-Identifier: Apache-2.0
#include "stream_blocker.h"

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "driver_api.h"

namespace kvcodec::runtime {
namespace {

void check(cudaError_t st, char const* call)
{
    if (st != cudaSuccess)
    {
        cudaGetLastError();
        throw std::runtime_error(std::string("StreamBlocker: ") + call + " failed: " + runtimeErrorText(st));
    }
}

// The device polls the flag through PCIe/NVLink: a sequentially consistent store makes the write
// visible without caching it in a register.
void storeFlag(uint32_t* flag, uint32_t value) noexcept
{
    __atomic_store_n(flag, value, __ATOMIC_SEQ_CST);
}

} // namespace

StreamBlocker::StreamBlocker(cudaStream_t stream)
    : stream_(stream)
{
    auto const& api = driverApi();
    if (api.streamWaitValue32 == nullptr)
    {
        throw std::runtime_error("StreamBlocker: the CUDA driver (version " + std::to_string(api.driverVersion)
            + ") provides no cuStreamWaitValue32");
    }
    check(cudaHostAlloc(reinterpret_cast<void**>(&flag_), sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable),
        "cudaHostAlloc(flag, mapped)");
    storeFlag(flag_, 0);
    try
    {
        void* device = nullptr;
        check(cudaHostGetDevicePointer(&device, flag_, 0), "cudaHostGetDevicePointer(flag)");
        CUresult r = api.streamWaitValue32(
            reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(device), 1, CU_STREAM_WAIT_VALUE_EQ);
        if (r != CUDA_SUCCESS)
        {
            throw std::runtime_error("StreamBlocker: cuStreamWaitValue32 failed: " + driverErrorText(r));
        }
        check(cudaEventCreateWithFlags(&passed_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        if (cudaError_t st = cudaEventRecord(passed_, stream); st != cudaSuccess)
        {
            // The wait is enqueued: open it before failing so the stream is not left blocked.
            storeFlag(flag_, 1);
            cudaEventDestroy(passed_);
            passed_ = nullptr;
            cudaStreamSynchronize(stream);
            check(st, "cudaEventRecord");
        }
    }
    catch (...)
    {
        cudaFreeHost(flag_);
        throw;
    }
}

StreamBlocker::~StreamBlocker()
{
    release();
    if (passed_ != nullptr)
    {
        cudaEventSynchronize(passed_); // the device no longer reads the flag after this
        cudaEventDestroy(passed_);
    }
    if (flag_ != nullptr)
    {
        cudaFreeHost(flag_);
    }
}

void StreamBlocker::release() noexcept
{
    if (!released_)
    {
        storeFlag(flag_, 1);
        released_ = true;
    }
}

bool StreamBlocker::waitPassed(int timeoutMs) const
{
    auto const deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
    while (true)
    {
        cudaError_t st = cudaEventQuery(passed_);
        if (st == cudaSuccess)
        {
            return true;
        }
        if (st != cudaErrorNotReady)
        {
            check(st, "cudaEventQuery");
        }
        if (std::chrono::steady_clock::now() >= deadline)
        {
            return false;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
}

} // namespace kvcodec::runtime

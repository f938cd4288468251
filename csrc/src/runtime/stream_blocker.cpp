// SPDX-License-Identifier: Apache-2.0
#include "stream_blocker.h"
#include "kvcodec/cuda_error.h"

#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "driver_api.h"

namespace kvcodec::runtime {
namespace {

void check(cudaError_t st, char const* call)
{
    if (st != cudaSuccess)
    {
        cudaGetLastError();
        throw std::runtime_error(std::string("StreamBlocker: ") + call + " failed: " + cudaErrorText(st));
    }
}

// The device polls the flag through PCIe/NVLink: a sequentially consistent store makes the write
// visible without caching it in a register.
void storeFlag(uint32_t* flag, uint32_t value) noexcept
{
    __atomic_store_n(flag, value, __ATOMIC_SEQ_CST);
}

// Flags come from blocks of mapped pinned memory that live as long as the process. Freeing pinned
// memory synchronizes the device (it would wait for any stream still held by another blocker) and
// allocating it may order against queued work, so blocks are only ever added, one per 64 blockers
// alive at the same time (in practice: one, allocated by the first blocker, before any stream is
// held).
class FlagPool
{
public:
    uint32_t* acquire()
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (free_.empty())
        {
            void* block = nullptr;
            check(cudaHostAlloc(&block, kFlagsPerBlock * sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable),
                "cudaHostAlloc(flags, mapped)");
            auto* flags = static_cast<uint32_t*>(block);
            for (size_t i = kFlagsPerBlock; i-- > 0;)
            {
                free_.push_back(flags + i);
            }
        }
        uint32_t* flag = free_.back();
        free_.pop_back();
        return flag;
    }

    void give_back(uint32_t* flag)
    {
        std::lock_guard<std::mutex> lock(mutex_);
        free_.push_back(flag);
    }

private:
    static constexpr size_t kFlagsPerBlock = 64;
    std::mutex mutex_;
    std::vector<uint32_t*> free_;
};

FlagPool& flagPool()
{
    static auto* pool = new FlagPool(); // never destroyed: blocks outlive every blocker
    return *pool;
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
    flag_ = flagPool().acquire();
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
        // The wait may be enqueued: leave the flag open (and out of the pool, 4 bytes) so the stream
        // is never held by a blocker that does not exist.
        storeFlag(flag_, 1);
        throw;
    }
}

StreamBlocker::~StreamBlocker()
{
    if (releaser_.joinable())
    {
        releaser_.join();
    }
    release();
    if (passed_ != nullptr)
    {
        // The device no longer reads the flag once the stream passed the wait: the flag can serve
        // the next blocker.
        bool const passed = cudaEventSynchronize(passed_) == cudaSuccess;
        cudaEventDestroy(passed_);
        if (passed)
        {
            flagPool().give_back(flag_);
        }
    }
}

void StreamBlocker::release() noexcept
{
    if (!released_.exchange(true, std::memory_order_acq_rel))
    {
        storeFlag(flag_, 1);
    }
}

void StreamBlocker::releaseAfter(int delayMs)
{
    if (delayMs < 0)
    {
        throw std::invalid_argument("StreamBlocker: delay is " + std::to_string(delayMs) + " ms; it must be >= 0");
    }
    if (releaser_.joinable())
    {
        throw std::logic_error("StreamBlocker: releaseAfter() was already called on this blocker");
    }
    releaser_ = std::thread([this, delayMs] {
        std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
        release();
    });
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

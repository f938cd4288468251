// SPDX-License-Identifier: Apache-2.0
#include "runtime/cuda_runtime.h"
#include "kvcodec/cuda_error.h"

#include <cstring>
#include <stdexcept>
#include <vector>

#include "kvcodec/device_scope.h"
#include "runtime/checksums.h"
#include "runtime/driver_api.h"
#include "runtime/index_upload.h"

namespace kvcodec::runtime {
namespace {

// Makes the runtime's device current for the scope (restoring the caller's device afterwards),
// throwing when the switch fails.
class DeviceGuard
{
public:
    explicit DeviceGuard(int device)
        : scope_(device)
    {
        if (!scope_.ok())
        {
            check(cudaSetDevice(device), "cudaSetDevice");
        }
    }
    static void check(cudaError_t st, char const* what)
    {
        if (st != cudaSuccess)
        {
            cudaGetLastError();
            throw std::runtime_error(std::string(what) + " failed: " + cudaErrorText(st));
        }
    }

private:
    DeviceScope scope_;
};

class CudaEvent final : public Event
{
public:
    CudaEvent(int device, cudaStream_t stream, bool timed = false)
        : device_(device)
        , stream_(stream)
    {
        DeviceGuard::check(cudaEventCreateWithFlags(&event_, timed ? cudaEventDefault : cudaEventDisableTiming),
            "cudaEventCreateWithFlags");
        cudaError_t const st = cudaEventRecord(event_, stream);
        if (st != cudaSuccess)
        {
            cudaEventDestroy(event_);
            DeviceGuard::check(st, "cudaEventRecord");
        }
    }

    ~CudaEvent() override
    {
        cudaEventDestroy(event_);
    }

    void synchronize() override
    {
        if (!complete_)
        {
            DeviceGuard::check(cudaEventSynchronize(event_), "cudaEventSynchronize");
            complete_ = true; // Later consumers need no wait: the shared state is closed.
        }
    }

    void waitOn(Stream stream) override
    {
        if (!complete_ && stream != stream_)
        {
            DeviceGuard::check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
        }
    }

    [[nodiscard]] Stream stream() const noexcept override
    {
        return stream_;
    }

    // Completed without blocking (the completion is remembered); throws on a device error.
    bool query() override
    {
        if (!complete_)
        {
            cudaError_t const st = cudaEventQuery(event_);
            if (st == cudaErrorNotReady)
            {
                return false;
            }
            DeviceGuard::check(st, "cudaEventQuery");
            complete_ = true;
        }
        return true;
    }

    [[nodiscard]] cudaEvent_t handle() const noexcept
    {
        return event_;
    }

private:
    int device_;
    cudaStream_t stream_;
    cudaEvent_t event_ = nullptr;
    bool complete_ = false;
};

// True when cuMemcpyBatchAsync serves copies on `stream` (it needs a non-legacy stream).
bool batchable(DriverApi const& api, Stream stream) noexcept
{
    return api.hasMemcpyBatch() && stream != nullptr && stream != cudaStreamLegacy;
}

// cuMemcpyBatchAsync of `count` copies (one attribute set for all of them) on `stream`.
CUresult memcpyBatch(DriverApi const& api, CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
    CUmemcpySrcAccessOrder order, Stream stream) noexcept
{
    CUmemcpyAttributes attr{};
    attr.srcAccessOrder = order;
    attr.flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
    size_t attrIndex = 0;
    size_t failIdx = SIZE_MAX;
    auto const cuStream = reinterpret_cast<CUstream>(stream);
    return api.memcpyBatchAsyncV13 != nullptr
        ? api.memcpyBatchAsyncV13(dsts, srcs, sizes, count, &attr, &attrIndex, 1, cuStream)
        : api.memcpyBatchAsyncV12(dsts, srcs, sizes, count, &attr, &attrIndex, 1, &failIdx, cuStream);
}

} // namespace

CudaRuntime::CudaRuntime(int32_t ordinal)
    : ordinal_(ordinal)
{
    int count = 0;
    cudaError_t const st = cudaGetDeviceCount(&count);
    if (st != cudaSuccess || ordinal < 0 || ordinal >= count)
    {
        cudaGetLastError();
        throw std::runtime_error("CUDA device " + std::to_string(ordinal) + " is not available ("
            + (st == cudaSuccess ? std::to_string(count) + " devices" : cudaErrorText(st)) + ")");
    }
    DeviceGuard guard(ordinal_);
    DeviceGuard::check(cudaFree(nullptr), "creating the primary context");
}

std::string CudaRuntime::name() const
{
    return "cuda:" + std::to_string(ordinal_);
}

int32_t CudaRuntime::codecDevice() const noexcept
{
    return ordinal_;
}

void* CudaRuntime::allocate(MemoryKind kind, size_t bytes)
{
    DeviceGuard guard(ordinal_);
    void* p = nullptr;
    if (kind == MemoryKind::kDevice)
    {
        cudaError_t st = cudaMalloc(&p, bytes);
        if (st == cudaSuccess)
        {
            st = cudaMemset(p, 0, bytes);
        }
        if (st == cudaSuccess)
        {
            // cudaMemset runs on the legacy stream, which the non-blocking streams codec calls run
            // on do not wait for: the zeros must land before the memory is handed out.
            st = cudaStreamSynchronize(cudaStreamLegacy);
        }
        if (st != cudaSuccess)
        {
            cudaGetLastError();
            if (p != nullptr)
            {
                cudaFree(p);
            }
            throw std::runtime_error("cannot allocate " + std::to_string(bytes) + " bytes of device memory on " + name()
                + ": " + cudaErrorText(st));
        }
        return p;
    }
    cudaError_t st = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (st != cudaSuccess)
    {
        cudaGetLastError();
        throw std::runtime_error(
            "cannot allocate " + std::to_string(bytes) + " bytes of pinned mapped host memory: " + cudaErrorText(st));
    }
    void* devicePtr = nullptr;
    st = cudaHostGetDevicePointer(&devicePtr, p, 0);
    if (st != cudaSuccess || devicePtr != p)
    {
        cudaGetLastError();
        cudaFreeHost(p);
        throw std::runtime_error(
            "pinned host memory is not mapped at its host address (unified addressing is required)");
    }
    std::memset(p, 0, bytes);
    return p;
}

void CudaRuntime::registerHost(void* ptr, size_t bytes)
{
    DeviceScope scope(ordinal_);
    cudaError_t st = cudaHostRegister(ptr, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (st != cudaSuccess)
    {
        cudaGetLastError();
        throw std::runtime_error("cannot register " + std::to_string(bytes) + " bytes of shared host memory with CUDA ("
            + "cudaHostRegister): " + cudaErrorText(st));
    }
    void* devicePtr = nullptr;
    st = cudaHostGetDevicePointer(&devicePtr, ptr, 0);
    if (st != cudaSuccess || devicePtr != ptr)
    {
        cudaGetLastError();
        cudaHostUnregister(ptr);
        throw std::runtime_error("registered host memory is not mapped at its host address (unified addressing is "
                                 "required)");
    }
}

void CudaRuntime::unregisterHost(void* ptr) noexcept
{
    DeviceScope scope(ordinal_);
    if (cudaHostUnregister(ptr) != cudaSuccess)
    {
        cudaGetLastError();
    }
}

void CudaRuntime::deallocate(MemoryKind kind, void* ptr) noexcept
{
    DeviceScope scope(ordinal_);
    if (kind == MemoryKind::kDevice)
    {
        cudaFree(ptr);
    }
    else
    {
        cudaFreeHost(ptr);
    }
}

Stream CudaRuntime::createStream()
{
    DeviceGuard guard(ordinal_);
    cudaStream_t s = nullptr;
    // Blocking (not cudaStreamNonBlocking): ordered after work on the legacy default stream.
    DeviceGuard::check(cudaStreamCreate(&s), "cudaStreamCreate");
    return s;
}

void CudaRuntime::destroyStream(Stream stream) noexcept
{
    cudaStreamDestroy(stream);
}

EventPtr CudaRuntime::record(Stream stream)
{
    DeviceGuard guard(ordinal_);
    return std::make_shared<CudaEvent>(ordinal_, stream);
}

bool CudaRuntime::timesEvents() const noexcept
{
    return true;
}

EventPtr CudaRuntime::recordTimed(Stream stream)
{
    DeviceGuard guard(ordinal_);
    return std::make_shared<CudaEvent>(ordinal_, stream, true);
}

std::optional<double> CudaRuntime::elapsedSeconds(Event& start, Event& end)
{
    auto* a = dynamic_cast<CudaEvent*>(&start);
    auto* b = dynamic_cast<CudaEvent*>(&end);
    if (a == nullptr || b == nullptr)
    {
        throw std::invalid_argument("elapsedSeconds needs two events of recordTimed()");
    }
    DeviceGuard guard(ordinal_);
    if (!b->query() || !a->query())
    {
        return std::nullopt;
    }
    float ms = 0;
    DeviceGuard::check(cudaEventElapsedTime(&ms, a->handle(), b->handle()), "cudaEventElapsedTime");
    return double(ms) * 1e-3;
}

void CudaRuntime::synchronize(Stream stream)
{
    DeviceGuard::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

void CudaRuntime::waitBlocking(Stream stream)
{
    DeviceGuard guard(ordinal_);
    cudaEvent_t event = nullptr;
    DeviceGuard::check(
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync), "cudaEventCreateWithFlags");
    cudaError_t st = cudaEventRecord(event, stream);
    if (st == cudaSuccess)
    {
        st = cudaEventSynchronize(event);
    }
    cudaEventDestroy(event);
    DeviceGuard::check(st, "waiting for a stream (cudaEventRecord/cudaEventSynchronize)");
}

bool CudaRuntime::copyBatch(void* const* dsts, void const* const* srcs, size_t const* sizes, size_t count,
    Stream stream, std::string& error) noexcept
{
    if (count == 0)
    {
        return true;
    }
    auto const& api = driverApi();
    auto const cuStream = reinterpret_cast<CUstream>(stream);
    DeviceScope scope(ordinal_); // The driver calls need the context current on this thread.
    // The legacy stream falls back to per-copy calls.
    if (batchable(api, stream))
    {
        CUresult const r = memcpyBatch(api, reinterpret_cast<CUdeviceptr*>(const_cast<void**>(dsts)),
            reinterpret_cast<CUdeviceptr*>(const_cast<void**>(srcs)), const_cast<size_t*>(sizes), count,
            CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, stream);
        if (r != CUDA_SUCCESS)
        {
            error = "cuMemcpyBatchAsync of " + std::to_string(count) + " copies failed: " + driverErrorText(r);
            return false;
        }
        return true;
    }
    if (api.memcpyAsync == nullptr)
    {
        error = "the CUDA driver provides neither cuMemcpyBatchAsync nor cuMemcpyAsync";
        return false;
    }
    for (size_t i = 0; i < count; ++i)
    {
        CUresult const r = api.memcpyAsync(CUdeviceptr(dsts[i]), CUdeviceptr(srcs[i]), sizes[i], cuStream);
        if (r != CUDA_SUCCESS)
        {
            error = "cuMemcpyAsync of copy " + std::to_string(i) + " failed: " + driverErrorText(r);
            return false;
        }
    }
    return true;
}

bool CudaRuntime::uploadFromPageable(
    void* dst, void const* hostSrc, size_t bytes, Stream stream, std::string& error) noexcept
{
    if (bytes == 0)
    {
        return true;
    }
    auto const& api = driverApi();
    DeviceScope scope(ordinal_); // The driver call needs the context current on this thread.
    if (batchable(api, stream))
    {
        // One entry; the driver finishes reading the pageable source before returning, while the
        // H2D transfer stays asynchronous on the stream.
        CUdeviceptr d = CUdeviceptr(dst);
        CUdeviceptr s = CUdeviceptr(hostSrc);
        size_t n = bytes;
        CUresult const r = memcpyBatch(api, &d, &s, &n, 1, CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL, stream);
        if (r != CUDA_SUCCESS)
        {
            error = "index upload (cuMemcpyBatchAsync, " + std::to_string(bytes)
                + " bytes) failed: " + driverErrorText(r);
            return false;
        }
        return true;
    }
    cudaError_t const st = uploadThroughKernelParams(dst, hostSrc, bytes, stream);
    if (st != cudaSuccess)
    {
        error = "index upload (kernel parameters, " + std::to_string(bytes) + " bytes) failed: " + cudaErrorText(st);
        return false;
    }
    return true;
}

bool CudaRuntime::checksums(void const* base, uint64_t stride, uint32_t const* lengths, size_t count, uint32_t* crcs,
    Stream stream, std::string& error) noexcept
{
    if (count == 0)
    {
        return true;
    }
    DeviceScope scope(ordinal_);
    cudaError_t const st = launchStridedCrcs(base, stride, lengths, count, crcs, stream);
    if (st != cudaSuccess)
    {
        error = "the checksum kernel over " + std::to_string(count) + " blobs failed to launch: " + cudaErrorText(st);
        return false;
    }
    return true;
}

std::unique_ptr<DeviceRuntime> createCudaRuntime(int32_t ordinal)
{
    return std::make_unique<CudaRuntime>(ordinal);
}

} // namespace kvcodec::runtime

// SPDX-License-Identifier: Apache-2.0
#include "runtime/index_upload.h"

#include <cstdint>
#include <cstring>

namespace kvcodec::runtime {
namespace {

// 3968 bytes of payload keeps the whole parameter block under the classic 4 KiB limit, which
// every driver that lacks cuMemcpyBatchAsync accepts.
constexpr int kSegmentWords = 496;

struct Segment
{
    uint64_t words[kSegmentWords];
};

__global__ void writeSegment(uint64_t* dst, Segment const segment, int count)
{
    for (int i = threadIdx.x; i < count; i += blockDim.x)
    {
        dst[i] = segment.words[i];
    }
}

} // namespace

cudaError_t uploadThroughKernelParams(void* dst, void const* hostSrc, size_t bytes, cudaStream_t stream) noexcept
{
    auto* out = static_cast<uint64_t*>(dst);
    auto const* in = static_cast<unsigned char const*>(hostSrc);
    size_t const words = bytes / sizeof(uint64_t);
    Segment segment;
    for (size_t done = 0; done < words; done += kSegmentWords)
    {
        int const count = int(words - done < size_t(kSegmentWords) ? words - done : size_t(kSegmentWords));
        std::memcpy(segment.words, in + done * sizeof(uint64_t), size_t(count) * sizeof(uint64_t));
        writeSegment<<<1, 128, 0, stream>>>(out + done, segment, count);
        cudaError_t const st = cudaGetLastError();
        if (st != cudaSuccess)
        {
            return st;
        }
    }
    return cudaSuccess;
}

} // namespace kvcodec::runtime

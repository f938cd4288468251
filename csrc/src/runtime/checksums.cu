// SPDX-License-Identifier: Apache-2.0
#include "runtime/checksums.h"

#include "kvcodec/crc32c.h"

namespace kvcodec::runtime {
namespace {

// A power of two (crcLeadingZeroSegment). A 576 KiB blob leaves each thread 1 KiB, a chain of 64
// steps of 16 bytes: short enough that the kernel keeps up with the copies that feed it.
constexpr unsigned kThreads = 1024;
constexpr unsigned kMaxBlocks = 1u << 30;

struct Powers
{
    uint32_t xpow[64]; ///< x^(2^k) mod P
};

Powers const& powers() noexcept
{
    static Powers const p = [] {
        Powers q{};
        crcPowerTable(q.xpow);
        return q;
    }();
    return p;
}

// Block b checksums blob first + b: each thread one equal segment of the blob (preceded by
// zeros so that every segment has the same length), then a tree joins the segments' raw CRCs.
__global__ void __launch_bounds__(kThreads) stridedCrcs(unsigned char const* base, uint64_t stride,
    uint32_t const* lengths, uint32_t* crcs, size_t first, Powers const powers)
{
    __shared__ uint32_t table[4][256];
    __shared__ uint32_t part[kThreads];
    unsigned const t = threadIdx.x;
    for (unsigned i = t; i < 256; i += kThreads)
    {
        table[0][i] = crcByteTableEntry(i);
    }
    __syncthreads();
    for (int k = 1; k < 4; ++k)
    {
        for (unsigned i = t; i < 256; i += kThreads)
        {
            table[k][i] = crcAdvanceByte(table[k - 1][i], table[0]);
        }
        __syncthreads();
    }
    size_t const blob = first + blockIdx.x;
    uint64_t const bytes = lengths[blob];
    unsigned char const* p = base + blob * stride;
    uint64_t const seg = crcSegmentBytes(bytes, kThreads);
    uint64_t b0 = 0;
    uint64_t b1 = 0;
    crcLeadingZeroSegment(bytes, seg, kThreads, t, b0, b1);
    part[t] = crcUpdate(0, p + b0, b1 - b0, table);
    __syncthreads();
    // Joining two neighbours of `width` segments each shifts the left one by x^(8 * width * seg).
    int k = 3 + __ffsll(static_cast<long long>(seg)) - 1;
    for (unsigned width = 1; width < kThreads; width *= 2, ++k)
    {
        if (t % (2 * width) == 0)
        {
            uint32_t const left = part[t];
            part[t] = (left == 0 ? 0u : crcMulMod(powers.xpow[k], left)) ^ part[t + width];
        }
        __syncthreads();
    }
    if (t == 0)
    {
        crcs[blob] = crcFinish(part[0], bytes, powers.xpow);
    }
}

} // namespace

cudaError_t launchStridedCrcs(void const* base, uint64_t stride, uint32_t const* lengths, size_t count, uint32_t* crcs,
    cudaStream_t stream) noexcept
{
    for (size_t first = 0; first < count; first += kMaxBlocks)
    {
        auto const blocks = unsigned(count - first < kMaxBlocks ? count - first : kMaxBlocks);
        stridedCrcs<<<blocks, kThreads, 0, stream>>>(
            static_cast<unsigned char const*>(base), stride, lengths, crcs, first, powers());
        cudaError_t const st = cudaGetLastError();
        if (st != cudaSuccess)
        {
            return st;
        }
    }
    return cudaSuccess;
}

} // namespace kvcodec::runtime

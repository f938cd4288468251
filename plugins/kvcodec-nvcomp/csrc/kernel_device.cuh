// SPDX-License-Identifier: Apache-2.0
//
// Device helpers of the encode and decode kernels: block-wide copies, bit shuffle and the blob
// checksum from CRC-32C pieces (kvcodec/crc32c.h). Included by kernel_encode.cu and
// kernel_decode.cu only.
#pragma once

#include <cuda_runtime.h>

#include "format.h"
#include "kernels.h"
#include "kvcodec/crc32c.h"

namespace kvcodec::nvcomp_plugin {

__device__ inline void blockCopy(uint8_t* dst, uint8_t const* src, uint64_t bytes)
{
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0)
    {
        // Four independent 16-byte loads per thread in flight: reads from pinned host memory
        // cross PCIe, and one outstanding load per thread would leave the link idle. The first
        // few vectors bring dst to a 128-byte boundary, so each warp's stores cover whole lines
        // (whole PCIe writes when dst is host memory).
        uint64_t const all = bytes / 16;
        uint64_t const toLine = ((128 - (reinterpret_cast<uintptr_t>(dst) & 127)) & 127) / 16;
        uint64_t const lead = toLine < all ? toLine : all;
        if (threadIdx.x < lead)
        {
            reinterpret_cast<uint4*>(dst)[threadIdx.x] = reinterpret_cast<uint4 const*>(src)[threadIdx.x];
        }
        auto* d = reinterpret_cast<uint4*>(dst) + lead;
        auto const* s = reinterpret_cast<uint4 const*>(src) + lead;
        uint64_t const vecs = all - lead;
        uint64_t const step = blockDim.x;
        uint64_t v = threadIdx.x;
        for (; v + 3 * step < vecs; v += 4 * step)
        {
            uint4 const a = s[v];
            uint4 const b = s[v + step];
            uint4 const c = s[v + 2 * step];
            uint4 const e = s[v + 3 * step];
            d[v] = a;
            d[v + step] = b;
            d[v + 2 * step] = c;
            d[v + 3 * step] = e;
        }
        for (; v < vecs; v += step)
        {
            d[v] = s[v];
        }
        for (uint64_t b = all * 16 + threadIdx.x; b < bytes; b += blockDim.x)
        {
            dst[b] = src[b];
        }
        return;
    }
    for (uint64_t b = threadIdx.x; b < bytes; b += blockDim.x)
    {
        dst[b] = src[b];
    }
}

// Copies `bytes` bytes and writes zeros up to roundUp(bytes, 16), reading nothing past the
// source's last byte: 16-byte stores only when both are 16-byte aligned (a blob in host memory
// then gets no single-byte PCIe writes).
__device__ inline void blockCopyPadded(uint8_t* dst, uint8_t const* src, uint64_t bytes)
{
    uint64_t const full = bytes / 16 * 16;
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) != 0)
    {
        blockCopy(dst, src, bytes);
        for (uint64_t b = bytes + threadIdx.x; b < roundUp(bytes, 16); b += blockDim.x)
        {
            dst[b] = 0;
        }
        return;
    }
    blockCopy(dst, src, full);
    if (full < bytes && threadIdx.x == blockDim.x - 1)
    {
        alignas(16) uint8_t last[16];
        for (uint32_t b = 0; b < 16; ++b)
        {
            last[b] = full + b < bytes ? src[full + b] : 0;
        }
        *reinterpret_cast<uint4*>(dst + full) = *reinterpret_cast<uint4 const*>(last);
    }
}

// Zeroes bytes [begin, end) of dst; `end` and dst 16-byte aligned.
__device__ inline void blockZero(uint8_t* dst, uint64_t begin, uint64_t end)
{
    uint64_t const head = min(roundUp(begin, 16), end);
    for (uint64_t b = begin + threadIdx.x; b < head; b += blockDim.x)
    {
        dst[b] = 0;
    }
    auto* d = reinterpret_cast<uint4*>(dst);
    for (uint64_t v = head / 16 + threadIdx.x; v < end / 16; v += blockDim.x)
    {
        d[v] = make_uint4(0, 0, 0, 0);
    }
}

__device__ inline void blockShuffle(uint8_t* dst, uint8_t const* src, uint64_t bytes, uint32_t w, bool inverse)
{
    uint64_t const groups = shuffleGroups(bytes, w);
    for (uint64_t k = threadIdx.x; k < groups; k += blockDim.x)
    {
        if (inverse)
        {
            unshuffleGroup(src, dst, groups, k, w);
        }
        else
        {
            shuffleGroup(src, dst, groups, k, w);
        }
    }
    for (uint64_t b = groups * 8 * w + threadIdx.x; b < bytes; b += blockDim.x)
    {
        dst[b] = src[b];
    }
}

// CRC-32C pieces (kvcodec/crc32c.h): every kernel that checksums a blob computes the raw CRC of pieces
// in parallel (threads of a block, blocks of a batch) and combines them in blob order.
struct CrcTables
{
    uint32_t t[4][256];
};

__device__ inline void loadCrcTables(CrcTables& s)
{
    for (uint32_t i = threadIdx.x; i < 256; i += blockDim.x)
    {
        s.t[0][i] = crcByteTableEntry(i);
    }
    __syncthreads();
    for (int k = 1; k < 4; ++k)
    {
        for (uint32_t i = threadIdx.x; i < 256; i += blockDim.x)
        {
            s.t[k][i] = crcAdvanceByte(s.t[k - 1][i], s.t[0]);
        }
        __syncthreads();
    }
}

__device__ inline uint32_t log2Pow2(uint64_t v)
{
    return uint32_t(__ffsll(static_cast<long long>(v)) - 1);
}

// Raw CRC of the block's pieces in thread order when every piece has 2^log2Bytes bytes
// (crcLeadingZeroSegment); blockDim.x is a power of two. Valid in every thread.
__device__ inline uint32_t blockCrcEqual(uint32_t raw, uint32_t log2Bytes, uint32_t const* xpow)
{
    __shared__ uint32_t part[kThreads];
    uint32_t const t = threadIdx.x;
    part[t] = raw;
    __syncthreads();
    uint32_t k = 3 + log2Bytes;
    for (uint32_t stride = 1; stride < blockDim.x; stride *= 2, ++k)
    {
        if (t % (2 * stride) == 0)
        {
            uint32_t const left = part[t];
            part[t] = (left == 0 ? 0u : crcMulMod(xpow[k], left)) ^ part[t + stride];
        }
        __syncthreads();
    }
    uint32_t const result = part[0];
    __syncthreads(); // the array is reused by the next call
    return result;
}

// The piece made of every thread's piece in thread order. Valid in every thread.
__device__ inline CrcPiece blockCrcJoin(CrcPiece mine)
{
    __shared__ uint32_t raw[kThreads];
    __shared__ uint32_t op[kThreads];
    uint32_t const t = threadIdx.x;
    raw[t] = mine.raw;
    op[t] = mine.op;
    __syncthreads();
    for (uint32_t stride = 1; stride < blockDim.x; stride *= 2)
    {
        if (t % (2 * stride) == 0 && t + stride < blockDim.x)
        {
            CrcPiece const j = crcJoin(CrcPiece{raw[t], op[t]}, CrcPiece{raw[t + stride], op[t + stride]});
            raw[t] = j.raw;
            op[t] = j.op;
        }
        __syncthreads();
    }
    CrcPiece const result{raw[0], op[0]};
    __syncthreads();
    return result;
}

// Raw CRC of `bytes` at `p` by the whole block, bytes from `valid` on read as zeros (a chunk's
// padding); 16-byte loads when p is 16-byte aligned and bytes a multiple of 16.
__device__ inline uint32_t blockCrcRaw(
    uint8_t const* p, uint64_t bytes, uint64_t valid, CrcTables const& s, uint32_t const* xpow)
{
    uint64_t const seg = crcSegmentBytes(bytes, blockDim.x);
    uint64_t b0 = 0, b1 = 0;
    crcLeadingZeroSegment(bytes, seg, blockDim.x, threadIdx.x, b0, b1);
    uint64_t const end = min(b1, max(b0, valid));
    uint32_t c = crcUpdate(0, p + b0, end - b0, s.t);
    for (uint64_t b = end; b < b1; ++b)
    {
        c = crcAdvanceByte(c, s.t[0]);
    }
    return blockCrcEqual(c, log2Pow2(seg), xpow);
}

// A chunk's piece of the checksum, `padded` bytes at `p` with those from `valid` on read as
// zeros, stored into *out by thread 0.
__device__ inline void blockChunkPiece(
    CrcPiece* out, uint8_t const* p, uint64_t padded, uint64_t valid, CrcTables const& s, uint32_t const* xpow)
{
    // Thread 0's segment is the shortest (crcLeadingZeroSegment): it also computes the operator.
    uint32_t const op = threadIdx.x == 0 ? crcShiftOperator(padded, xpow) : 0;
    uint32_t const raw = blockCrcRaw(p, padded, valid, s, xpow);
    if (threadIdx.x == 0)
    {
        *out = CrcPiece{raw, op};
    }
}

// The contiguous run [first, last) of `n` items that thread threadIdx.x of the block takes.
__device__ inline void threadRun(uint32_t n, uint32_t& first, uint32_t& last)
{
    uint32_t const per = (n + blockDim.x - 1) / blockDim.x;
    first = min(n, threadIdx.x * per);
    last = min(n, first + per);
}

// The piece of `n` chunks in blob order from their pieces (runs per thread, then a block tree).
__device__ inline CrcPiece blockChunksJoin(CrcPiece const* pieces, uint32_t n)
{
    uint32_t first = 0, last = 0;
    threadRun(n, first, last);
    CrcPiece run{0, kCrcOne};
    for (uint32_t c = first; c < last; ++c)
    {
        run = crcJoin(run, pieces[c]);
    }
    return blockCrcJoin(run);
}

// Exclusive prefix sum of one value per thread over the block; *total gets the sum.
__device__ inline uint64_t blockExclusiveScan(uint64_t v, uint64_t* total)
{
    __shared__ uint64_t s[kThreads];
    uint32_t const t = threadIdx.x;
    s[t] = v;
    __syncthreads();
    for (uint32_t d = 1; d < blockDim.x; d *= 2)
    {
        uint64_t const add = t >= d ? s[t - d] : 0;
        __syncthreads();
        s[t] += add;
        __syncthreads();
    }
    uint64_t const inclusive = s[t];
    *total = s[blockDim.x - 1];
    __syncthreads();
    return inclusive - v;
}

__device__ inline uint32_t load32(uint8_t const* p)
{
    return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

__device__ inline void store32(uint8_t* p, uint32_t v)
{
    p[0] = uint8_t(v);
    p[1] = uint8_t(v >> 8);
    p[2] = uint8_t(v >> 16);
    p[3] = uint8_t(v >> 24);
}

// Decode flags of a page whose checks ended with `status` (kvcodec::PageStatus).
__device__ inline uint32_t decodeFlags(uint8_t status)
{
    return status == kvcodec::kPageOk ? uint32_t(kPageValid) : uint32_t(status) << kReasonShift;
}

// The PageStatus recorded in a page's decode flags.
__device__ inline uint8_t decodeReason(uint32_t flags)
{
    return (flags & kPageValid) ? uint8_t(kvcodec::kPageOk) : uint8_t((flags >> kReasonShift) & 0xffu);
}

__device__ inline uint8_t* coldSlot(uintptr_t base, int32_t slot, uint64_t coldBytes)
{
    return reinterpret_cast<uint8_t*>(base + uint64_t(slot) * coldBytes);
}

} // namespace kvcodec::nvcomp_plugin

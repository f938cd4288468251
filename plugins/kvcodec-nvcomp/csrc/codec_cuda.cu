// SPDX-License-Identifier: Apache-2.0
//
// CUDA implementation of the nvCOMP codecs (blob format in format.h). Every call is enqueued on
// the caller's stream with no host synchronization:
//
//   encode: prepare kernel (chunk pointer tables from the device page indices; bit shuffle or
//           copy into aligned staging when needed) -> nvCOMP batched compress -> layout kernel
//           (per page: raw or compressed per chunk from the device-side sizes, chunk table,
//           payload offsets, does the page fit) -> chunks kernel (per chunk: its payload straight
//           into the cold slot, and its piece of the CRC-32C) -> seal kernel (per page: codec
//           header and chunk table, the pieces combined into the checksum, the envelope; an
//           envelope alone with did-not-fit when the page exceeds the slot).
//   decode: header kernel (per page: check the envelope, stage and check the chunk table, lay
//           out the chunks) -> chunks kernel (per chunk: stage its payload, its piece of the
//           CRC-32C) -> verify kernel (per page: the checksum; nvCOMP's tables, where raw chunks
//           and the chunks of a bad page get a small dummy compressed chunk so the batch size
//           stays fixed) -> nvCOMP batched decompress -> scatter kernel (per chunk: raw chunks,
//           un-shuffle; only pages whose every chunk decoded).
//   decodeChecked: the same kernels, which also record why a page is refused (PageState flags)
//           and write one PageStatus byte per page where they decide it: the verify kernel for a
//           page that fails its checks, the scatter kernel's block of chunk 0 for a page that
//           went to nvCOMP (decoded, or kPageDecodeFailed). No extra kernel and no host copy.
//   The per-chunk kernels put every chunk of a batch in flight at once: one block per page
//   would leave most of the GPU idle and serialize a page's checksum and copies.
//
// Workspaces are allocated at configure time for the largest batch, two per direction ("lanes",
// each with its own internal stream); workspace.h sizes them from the layout's real chunks. A call is cut into batches that
// alternate between the lanes, so one batch's PCIe transfer overlaps the next one's
// (de)compression; the lanes wait for the caller's stream through an event and the caller's
// stream waits for both lanes, so the call is ordered on the caller's stream as if enqueued there.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec_base.h"
#include "codec_factories.h"
#include "kvcodec/device_scope.h"
#include "nvcomp_ops.h"
#include "workspace.h"

namespace kvcodec::nvcomp_plugin {
namespace {

constexpr uint32_t kThreads = 256;

std::string cudaText(cudaError_t e)
{
    return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

struct DevChunk
{
    uint64_t poolBase;
    uint64_t slotBytes;
    uint64_t offset;
    uint32_t bytes;
    uint32_t pool;
};

// ------------------------------------------------------------------------------------------
// Device helpers
// ------------------------------------------------------------------------------------------

__device__ void blockCopy(uint8_t* dst, uint8_t const* src, uint64_t bytes)
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
__device__ void blockCopyPadded(uint8_t* dst, uint8_t const* src, uint64_t bytes)
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
__device__ void blockZero(uint8_t* dst, uint64_t begin, uint64_t end)
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

__device__ void blockShuffle(uint8_t* dst, uint8_t const* src, uint64_t bytes, uint32_t w, bool inverse)
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

// CRC-32C pieces (format.h): every kernel that checksums a blob computes the raw CRC of pieces
// in parallel (threads of a block, blocks of a batch) and combines them in blob order.
struct CrcTables
{
    uint32_t t[4][256];
};

__device__ void loadCrcTables(CrcTables& s)
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

__device__ uint32_t log2Pow2(uint64_t v)
{
    return uint32_t(__ffsll(static_cast<long long>(v)) - 1);
}

// Raw CRC of the block's pieces in thread order when every piece has 2^log2Bytes bytes
// (crcLeadingZeroSegment); blockDim.x is a power of two. Valid in every thread.
__device__ uint32_t blockCrcEqual(uint32_t raw, uint32_t log2Bytes, uint32_t const* xpow)
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
__device__ CrcPiece blockCrcJoin(CrcPiece mine)
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
__device__ uint32_t blockCrcRaw(uint8_t const* p, uint64_t bytes, uint64_t valid, CrcTables const& s, uint32_t const* xpow)
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
__device__ void blockChunkPiece(CrcPiece* out, uint8_t const* p, uint64_t padded, uint64_t valid, CrcTables const& s,
    uint32_t const* xpow)
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
__device__ void threadRun(uint32_t n, uint32_t& first, uint32_t& last)
{
    uint32_t const per = (n + blockDim.x - 1) / blockDim.x;
    first = min(n, threadIdx.x * per);
    last = min(n, first + per);
}

// The piece of `n` chunks in blob order from their pieces (runs per thread, then a block tree).
__device__ CrcPiece blockChunksJoin(CrcPiece const* pieces, uint32_t n)
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
__device__ uint64_t blockExclusiveScan(uint64_t v, uint64_t* total)
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

__device__ uint32_t load32(uint8_t const* p)
{
    return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

__device__ void store32(uint8_t* p, uint32_t v)
{
    p[0] = uint8_t(v);
    p[1] = uint8_t(v >> 8);
    p[2] = uint8_t(v >> 16);
    p[3] = uint8_t(v >> 24);
}

// Per page of a batch, between the kernels of one call.
struct PageState
{
    uint64_t used;      // blob bytes: envelope, header and payload
    uint32_t checksum;  // decode: the envelope's checksum
    uint32_t headerRaw; // decode: raw CRC of [32, headerBytes)
    uint32_t flags;
};

static_assert(sizeof(PageState) == 24, "workspace.cpp sizes page states at 24 bytes");

enum : uint32_t
{
    kPageValid = 1,      // encode: the page fits and is written; decode: envelope and table are valid
    kPageCompressed = 2, // encode: some chunk is stored compressed
    kReasonShift = 8,    // decode: bits 8..15 hold the PageStatus of a page that is not valid
};

// Decode flags of a page whose checks ended with `status` (kvcodec::PageStatus).
__device__ uint32_t decodeFlags(uint8_t status)
{
    return status == kvcodec::kPageOk ? uint32_t(kPageValid) : uint32_t(status) << kReasonShift;
}

// The PageStatus recorded in a page's decode flags.
__device__ uint8_t decodeReason(uint32_t flags)
{
    return (flags & kPageValid) ? uint8_t(kvcodec::kPageOk) : uint8_t((flags >> kReasonShift) & 0xffu);
}

// Page threads per block of the per-page kernels (layout, seal, header, verify).
constexpr uint32_t kPageThreads = 128;

// ------------------------------------------------------------------------------------------
// Encode
// ------------------------------------------------------------------------------------------

struct EncodeArgs
{
    DevChunk const* chunks;
    uint32_t numChunks; // per page
    uint64_t numSlots;
    PageIndexPair const* pairs;
    uint32_t elementBytes;
    uint32_t bitshuffle;
    uint32_t direct; // compress straight from the hot slots
    uint8_t algorithm;
    uint64_t chunkBytes;
    uint64_t chunkStride;
    uint8_t* inStaging;
    uint8_t const* zeroChunk;
    void const** inPtrs;
    size_t* inBytes;
    void** outPtrs;
    uint8_t* compStaging;
    uint64_t compStride;
    uint32_t zeroCompressed; // clear each compressed chunk's slot before nvCOMP writes it
    size_t const* outBytes;
    nvcompStatus_t const* statuses;
    uint32_t* entries;
    uint64_t* offsets;
    CrcPiece* chunkCrc;
    PageState* pages;
    uint32_t headerOp; // x^(8 * (headerBytes - 32))
    uint64_t coldBytes;
    uint32_t headerBytes;
    uint64_t pageBytes;
    uintptr_t coldBase;
    uint32_t const* xpow;
};

__device__ uint8_t* coldSlot(uintptr_t base, int32_t slot, uint64_t coldBytes)
{
    return reinterpret_cast<uint8_t*>(base + uint64_t(slot) * coldBytes);
}

__global__ void encodePrepare(EncodeArgs a)
{
    uint64_t const k = blockIdx.x;
    uint64_t const i = k / a.numChunks;
    uint32_t const c = uint32_t(k % a.numChunks);
    PageIndexPair const pair = a.pairs[i];
    DevChunk const ch = a.chunks[c];
    bool const valid = pair.src >= 0 && uint64_t(pair.src) < a.numSlots && pair.dst >= 0;
    auto const* src = valid ? reinterpret_cast<uint8_t const*>(ch.poolBase + uint64_t(pair.src) * ch.slotBytes + ch.offset)
                            : a.zeroChunk;
    uint8_t const* in = src;
    if (!a.direct)
    {
        uint8_t* dst = a.inStaging + k * a.chunkStride;
        if (a.bitshuffle)
        {
            blockShuffle(dst, src, ch.bytes, a.elementBytes, false);
        }
        else
        {
            blockCopy(dst, src, ch.bytes);
        }
        // The compressor sees only the chunk's bytes, but the rest of the slot must not carry
        // another call's data: a blob depends on its page alone.
        blockZero(dst, ch.bytes, a.chunkStride);
        in = dst;
    }
    if (a.zeroCompressed)
    {
        blockZero(a.compStaging + k * a.compStride, 0, a.compStride);
    }
    if (threadIdx.x == 0)
    {
        a.inPtrs[k] = in;
        a.inBytes[k] = ch.bytes;
        a.outPtrs[k] = a.compStaging + k * a.compStride;
    }
}

// Per page, after nvCOMP: raw or compressed per chunk, the chunk table and the payload offsets.
__global__ void encodeLayout(EncodeArgs a)
{
    uint64_t const i = blockIdx.x;
    PageIndexPair const pair = a.pairs[i];
    uint64_t const base = i * a.numChunks;
    uint32_t first = 0, last = 0;
    threadRun(a.numChunks, first, last);
    uint64_t run = 0;
    bool any = false;
    for (uint32_t c = first; c < last; ++c)
    {
        uint32_t const raw = a.chunks[c].bytes;
        size_t const got = a.outBytes[base + c];
        bool const shrank = a.statuses[base + c] == nvcompSuccess && got > 0 && got < raw;
        uint32_t const stored = shrank ? uint32_t(got) : raw;
        a.entries[base + c] = stored | (shrank ? kChunkCompressedBit : 0u);
        run += roundUp(stored, kPayloadAlign);
        any = any || shrank;
    }
    uint64_t payload = 0;
    uint64_t pos = a.headerBytes + blockExclusiveScan(run, &payload);
    for (uint32_t c = first; c < last; ++c)
    {
        a.offsets[base + c] = pos;
        pos += roundUp(a.entries[base + c] & kChunkSizeMask, kPayloadAlign);
    }
    any = __syncthreads_or(any);
    if (threadIdx.x == 0)
    {
        uint64_t const total = a.headerBytes + payload;
        bool const fits = pair.dst >= 0 && pair.src >= 0 && uint64_t(pair.src) < a.numSlots && total <= a.coldBytes;
        a.pages[i] = PageState{fits ? total : sizeof(ColdPageEnvelope), 0, 0,
            (fits ? kPageValid : 0u) | (any ? kPageCompressed : 0u)};
    }
}

// Per chunk: stores its payload into the cold slot (zero padded) and its piece of the checksum.
// A block takes chunks blockIdx.x, + gridDim.x, ...: blobs in host memory get a small grid, so
// blocks waiting on PCIe writes leave the SMs to the next batch's compression.
__global__ void encodeChunks(EncodeArgs a, uint64_t total)
{
    __shared__ CrcTables tables;
    loadCrcTables(tables);
    for (uint64_t k = blockIdx.x; k < total; k += gridDim.x)
    {
        uint64_t const i = k / a.numChunks;
        if ((a.pages[i].flags & kPageValid) == 0)
        {
            continue; // Invalid indices or did not fit: the envelope alone is written.
        }
        uint32_t const entry = a.entries[k];
        uint32_t const stored = entry & kChunkSizeMask;
        uint64_t const padded = roundUp(stored, kPayloadAlign);
        auto const* src = static_cast<uint8_t const*>((entry & kChunkCompressedBit) ? a.outPtrs[k] : a.inPtrs[k]);
        uint8_t* dst = coldSlot(a.coldBase, a.pairs[i].dst, a.coldBytes) + a.offsets[k];
        blockCopyPadded(dst, src, stored);
        // From the device-side source, not the cold slot (which may be host memory); the padding
        // counts as zeros.
        blockChunkPiece(a.chunkCrc + k, src, padded, stored, tables, a.xpow);
    }
}

// Per page: codec header and chunk table, then the envelope with the blob's checksum.
__global__ void encodeSeal(EncodeArgs a)
{
    __shared__ CrcTables tables;
    __shared__ __align__(16) uint8_t env[sizeof(ColdPageEnvelope)];
    uint64_t const i = blockIdx.x;
    PageIndexPair const pair = a.pairs[i];
    if (pair.dst < 0)
    {
        return; // No cold slot to write to.
    }
    PageState const page = a.pages[i];
    uint64_t const base = i * a.numChunks;
    uint8_t* cold = coldSlot(a.coldBase, pair.dst, a.coldBytes);
    bool const fits = (page.flags & kPageValid) != 0;
    uint32_t checksum = 0;
    if (fits)
    {
        loadCrcTables(tables);
        // [32, headerBytes) as 32-bit words: the codec header, the chunk table, zeros; each
        // thread stores and checksums its segment.
        uint64_t const n = a.headerBytes - kCodecHeaderOffset;
        uint64_t const seg = crcSegmentBytes(n, blockDim.x);
        uint64_t b0 = 0, b1 = 0;
        crcLeadingZeroSegment(n, seg, blockDim.x, threadIdx.x, b0, b1);
        bool const aligned = (reinterpret_cast<uintptr_t>(cold) & 15) == 0;
        uint32_t raw = 0;
        for (uint64_t j = b0 / 4; j < b1 / 4; j += 4) // b0 and b1 are multiples of 16
        {
            uint32_t w[4];
            for (uint32_t q = 0; q < 4; ++q)
            {
                uint64_t const x = j + q;
                w[q] = 0;
                if (x == 0) w[q] = a.numChunks;
                else if (x == 1) w[q] = uint32_t(a.chunkBytes);
                else if (x == 2) w[q] = uint32_t(a.algorithm) | (a.elementBytes << 8) | (a.bitshuffle << 16);
                else if (x >= 4 && x - 4 < a.numChunks) w[q] = a.entries[base + x - 4];
                raw = crcWord(raw, w[q], tables.t);
                if (!aligned) store32(cold + kCodecHeaderOffset + 4 * x, w[q]);
            }
            if (aligned)
            {
                *reinterpret_cast<uint4*>(cold + kCodecHeaderOffset + 4 * j) = make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
        CrcPiece const header{blockCrcEqual(raw, log2Pow2(seg), a.xpow), a.headerOp};
        CrcPiece const all = crcJoin(header, blockChunksJoin(a.chunkCrc + base, a.numChunks));
        checksum = crcFinishOp(all.raw, all.op);
    }
    if (threadIdx.x == 0)
    {
        ColdPageEnvelope e{};
        e.magic = kColdPageEnvelopeMagic;
        e.formatVersion = kFormatVersion;
        e.rawBytes = a.pageBytes;
        if (fits)
        {
            e.flags = (page.flags & kPageCompressed) ? kEnvelopeCompressed : kEnvelopeStoredRaw;
            e.headerBytes = a.headerBytes;
            e.payloadBytes = uint32_t(page.used - a.headerBytes);
            e.checksum = checksum;
        }
        else
        {
            e.flags = kEnvelopeDidNotFit;
            e.headerBytes = sizeof(ColdPageEnvelope);
        }
        e.headerCrc = crc32cBitwise(reinterpret_cast<uint8_t const*>(&e), offsetof(ColdPageEnvelope, headerCrc));
        memcpy(env, &e, sizeof(e));
    }
    __syncthreads();
    if ((reinterpret_cast<uintptr_t>(cold) & 15) == 0)
    {
        if (threadIdx.x < sizeof(ColdPageEnvelope) / 16)
        {
            reinterpret_cast<uint4*>(cold)[threadIdx.x] = reinterpret_cast<uint4 const*>(env)[threadIdx.x];
        }
    }
    else if (threadIdx.x < sizeof(ColdPageEnvelope))
    {
        cold[threadIdx.x] = env[threadIdx.x];
    }
}

// ------------------------------------------------------------------------------------------
// Decode
// ------------------------------------------------------------------------------------------

enum : uint8_t
{
    kChunkRaw = 0,
    kChunkCompressed = 1,
    kChunkSkip = 2, // the page is not decoded
    kChunkKind = 3, // the bits above
    kChunkInPlace = 4, // flag: the payload is read from the blob itself, not from its staged copy
};

struct DecodeArgs
{
    DevChunk const* chunks;
    uint32_t numChunks;
    uint64_t numSlots;
    PageIndexPair const* pairs;
    uint32_t elementBytes;
    uint32_t bitshuffle;
    uint32_t direct; // decompress straight into the hot slots
    uint8_t algorithm;
    uint64_t chunkBytes;
    uint64_t chunkStride;
    uint8_t* outStaging;
    void const** inPtrs;
    size_t* inBytes;
    size_t* capacity;
    size_t const* actual;
    void** outPtrs;
    nvcompStatus_t const* statuses;
    uint8_t* kinds;
    uint64_t* offsets;
    CrcPiece* chunkCrc;
    PageState* pages;
    uint32_t headerOp; // x^(8 * (headerBytes - 32))
    uint8_t const* dummyIn;
    uint64_t dummyInBytes;
    uint8_t* dummyOut;
    uint8_t* blobStaging;
    uint64_t blobStride;
    uint64_t coldBytes;
    uint32_t headerBytes;
    uint64_t pageBytes;
    uintptr_t coldBase;
    uint32_t const* xpow;
    uint32_t blobOnDevice; // the cold blobs are in device memory: payloads need no staging
    uint8_t* pageStatus;   // decodeChecked: one PageStatus per page of the batch; null for decode
};

// Per page: checks the envelope, stages the codec header and chunk table, checks them and lays
// out the chunks; the header's piece of the checksum.
__global__ void decodeHeader(DecodeArgs a)
{
    __shared__ CrcTables tables;
    __shared__ ColdPageEnvelope env;
    __shared__ uint8_t status;
    uint64_t const i = blockIdx.x;
    PageIndexPair const pair = a.pairs[i];
    uint64_t const base = i * a.numChunks;
    bool const indicesOk = pair.src >= 0 && pair.dst >= 0 && uint64_t(pair.dst) < a.numSlots;
    auto const* blob = reinterpret_cast<uint8_t const*>(a.coldBase + (indicesOk ? uint64_t(pair.src) * a.coldBytes : 0));
    uint8_t* stage = a.blobStaging + i * a.blobStride;
    loadCrcTables(tables);
    if (indicesOk && threadIdx.x < sizeof(ColdPageEnvelope))
    {
        reinterpret_cast<uint8_t*>(&env)[threadIdx.x] = blob[threadIdx.x]; // one PCIe round trip
    }
    __syncthreads();
    if (threadIdx.x == 0)
    {
        // The order of checkColdPageEnvelope and of the CPU reference, so both report the same
        // status for a blob.
        auto const* raw = reinterpret_cast<uint8_t const*>(&env);
        uint8_t st = kvcodec::kPageOk;
        if (!indicesOk) st = kPageBadIndex;
        else if (env.magic != kColdPageEnvelopeMagic) st = kPageBadMagic;
        else if (crc32cBitwise(raw, offsetof(ColdPageEnvelope, headerCrc)) != env.headerCrc) st = kPageBadHeader;
        else if (env.formatVersion != kFormatVersion) st = kPageBadFormatVersion;
        else if (env.flags & kEnvelopeDidNotFit) st = kPageDidNotFit;
        else if (env.headerBytes != a.headerBytes || env.payloadBytes > a.coldBytes - a.headerBytes
            || env.rawBytes != a.pageBytes)
        {
            st = kPageBadHeader;
        }
        status = st;
    }
    __syncthreads();
    if (status != kvcodec::kPageOk)
    {
        if (threadIdx.x == 0) a.pages[i] = PageState{0, 0, 0, decodeFlags(status)};
        return;
    }
    uint64_t const used = uint64_t(env.headerBytes) + env.payloadBytes;
    blockCopy(stage + kCodecHeaderOffset, blob + kCodecHeaderOffset, a.headerBytes - kCodecHeaderOffset);
    __syncthreads();
    bool good = load32(stage + 32) == a.numChunks && load32(stage + 36) == uint32_t(a.chunkBytes)
        && stage[40] == a.algorithm && stage[41] == a.elementBytes && stage[42] == a.bitshuffle;
    uint32_t first = 0, last = 0;
    threadRun(a.numChunks, first, last);
    uint64_t run = 0;
    for (uint32_t c = first; c < last; ++c)
    {
        run += roundUp(load32(stage + kChunkTableOffset + 4 * c) & kChunkSizeMask, kPayloadAlign);
    }
    uint64_t payload = 0;
    uint64_t pos = a.headerBytes + blockExclusiveScan(run, &payload);
    for (uint32_t c = first; c < last; ++c)
    {
        uint32_t const entry = load32(stage + kChunkTableOffset + 4 * c);
        uint32_t const stored = entry & kChunkSizeMask;
        bool const compressed = (entry & kChunkCompressedBit) != 0;
        uint32_t const raw = a.chunks[c].bytes;
        good = good && pos + stored <= used && (compressed ? (stored > 0 && stored < raw) : stored == raw);
        a.kinds[base + c] = compressed ? kChunkCompressed : kChunkRaw;
        a.offsets[base + c] = pos;
        pos += roundUp(stored, kPayloadAlign);
    }
    good = __syncthreads_and(good) && a.headerBytes + payload == used;
    uint64_t const n = a.headerBytes - kCodecHeaderOffset;
    uint32_t const headerRaw = blockCrcRaw(stage + kCodecHeaderOffset, n, n, tables, a.xpow);
    if (threadIdx.x == 0)
    {
        a.pages[i] = PageState{used, env.checksum, headerRaw, decodeFlags(good ? kvcodec::kPageOk : kPageBadHeader)};
    }
}

// Per chunk of a page whose header is valid: its piece of the checksum, from a staged copy of
// its payload when the blob is in host memory (read once over PCIe), else from the blob itself,
// which nvCOMP and decodeScatter then read in place. A chunk whose payload ends within
// kStagingAlign bytes of the cold slot's end is staged all the same: decoders read whole words
// past a chunk's last byte, and the slot may end the caller's allocation. Blocks take chunks as
// in encodeChunks.
__global__ void decodeChunks(DecodeArgs a, uint64_t total)
{
    __shared__ CrcTables tables;
    loadCrcTables(tables);
    for (uint64_t k = blockIdx.x; k < total; k += gridDim.x)
    {
        uint64_t const i = k / a.numChunks;
        if ((a.pages[i].flags & kPageValid) == 0)
        {
            continue;
        }
        auto const* blob = reinterpret_cast<uint8_t const*>(a.coldBase + uint64_t(a.pairs[i].src) * a.coldBytes);
        uint8_t* stage = a.blobStaging + i * a.blobStride;
        uint32_t const c = uint32_t(k % a.numChunks);
        uint64_t const offset = a.offsets[k];
        uint64_t const padded = roundUp(load32(stage + kChunkTableOffset + 4 * c) & kChunkSizeMask, kPayloadAlign);
        bool const inPlace = a.blobOnDevice && offset + padded + kStagingAlign <= a.coldBytes;
        if (inPlace)
        {
            if (threadIdx.x == 0) a.kinds[k] |= kChunkInPlace;
        }
        else
        {
            blockCopy(stage + offset, blob + offset, padded);
            __syncthreads();
        }
        blockChunkPiece(a.chunkCrc + k, (inPlace ? blob : stage) + offset, padded, padded, tables, a.xpow);
    }
}

// Per page: the checksum, then nvCOMP's tables (a dummy chunk for raw chunks and bad pages).
__global__ void decodeVerify(DecodeArgs a)
{
    uint64_t const i = blockIdx.x;
    PageIndexPair const pair = a.pairs[i];
    PageState const page = a.pages[i];
    uint64_t const base = i * a.numChunks;
    uint8_t const* stage = a.blobStaging + i * a.blobStride;
    bool ok = (page.flags & kPageValid) != 0;
    if (ok)
    {
        CrcPiece const all = crcJoin(CrcPiece{page.headerRaw, a.headerOp}, blockChunksJoin(a.chunkCrc + base, a.numChunks));
        ok = crcFinishOp(all.raw, all.op) == page.checksum;
        if (!ok && a.pageStatus != nullptr && threadIdx.x == 0)
        {
            a.pageStatus[i] = kPageBadChecksum;
        }
    }
    else if (a.pageStatus != nullptr && threadIdx.x == 0)
    {
        a.pageStatus[i] = decodeReason(page.flags);
    }
    for (uint32_t c = threadIdx.x; c < a.numChunks; c += blockDim.x)
    {
        uint64_t const k = base + c;
        DevChunk const ch = a.chunks[c];
        uint8_t const kind = ok ? a.kinds[k] : kChunkSkip;
        a.kinds[k] = kind;
        if ((kind & kChunkKind) == kChunkCompressed)
        {
            uint8_t const* payload = (kind & kChunkInPlace)
                ? reinterpret_cast<uint8_t const*>(a.coldBase + uint64_t(pair.src) * a.coldBytes)
                : stage;
            a.inPtrs[k] = payload + a.offsets[k];
            a.inBytes[k] = load32(stage + kChunkTableOffset + 4 * c) & kChunkSizeMask;
            a.outPtrs[k] = a.direct ? reinterpret_cast<void*>(ch.poolBase + uint64_t(pair.dst) * ch.slotBytes + ch.offset)
                                    : a.outStaging + k * a.chunkStride;
            a.capacity[k] = ch.bytes;
        }
        else
        {
            a.inPtrs[k] = a.dummyIn;
            a.inBytes[k] = a.dummyInBytes;
            a.outPtrs[k] = a.dummyOut + k * kDummyRawBytes;
            a.capacity[k] = kDummyRawBytes;
        }
    }
}

// Per chunk, after nvCOMP: writes raw and staged chunks of pages whose every chunk decoded. For
// decodeChecked the block of each page's chunk 0 also writes the status of a page that went to
// nvCOMP (decodeVerify wrote the others'), even where nvCOMP wrote that chunk in place.
__global__ void decodeScatter(DecodeArgs a)
{
    uint64_t const k = blockIdx.x;
    uint64_t const i = k / a.numChunks;
    uint32_t const c = uint32_t(k % a.numChunks);
    uint64_t const base = i * a.numChunks;
    uint8_t const flags = a.kinds[k];
    uint8_t const kind = flags & kChunkKind;
    if (kind == kChunkSkip)
    {
        return; // Not decoded: the page failed its checks.
    }
    bool const copies = !(kind == kChunkCompressed && a.direct); // else nvCOMP wrote it in place
    bool const reports = a.pageStatus != nullptr && c == 0;
    if (!copies && !reports)
    {
        return;
    }
    int bad = 0;
    for (uint32_t j = threadIdx.x; j < a.numChunks; j += blockDim.x)
    {
        if ((a.kinds[base + j] & kChunkKind) == kChunkCompressed
            && (a.statuses[base + j] != nvcompSuccess || a.actual[base + j] != a.chunks[j].bytes))
        {
            bad = 1;
        }
    }
    bad = __syncthreads_or(bad);
    if (reports && threadIdx.x == 0)
    {
        a.pageStatus[i] = bad ? kPageDecodeFailed : kvcodec::kPageOk;
    }
    if (bad || !copies)
    {
        return; // A chunk failed to decompress (the page is not written), or nothing to copy.
    }
    PageIndexPair const pair = a.pairs[i];
    DevChunk const ch = a.chunks[c];
    uint8_t const* src = nullptr;
    if (kind == kChunkCompressed)
    {
        src = a.outStaging + k * a.chunkStride;
    }
    else
    {
        src = ((flags & kChunkInPlace) ? reinterpret_cast<uint8_t const*>(a.coldBase + uint64_t(pair.src) * a.coldBytes)
                                       : a.blobStaging + i * a.blobStride)
            + a.offsets[k];
    }
    auto* dst = reinterpret_cast<uint8_t*>(ch.poolBase + uint64_t(pair.dst) * ch.slotBytes + ch.offset);
    if (a.bitshuffle)
    {
        blockShuffle(dst, src, ch.bytes, a.elementBytes, true);
    }
    else
    {
        blockCopy(dst, src, ch.bytes);
    }
}

// ------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------

// Device allocations freed together.
class DeviceArena
{
public:
    ~DeviceArena()
    {
        for (void* p : blocks_) cudaFree(p);
    }

    template <class T>
    T* alloc(uint64_t count, char const* what)
    {
        if (count == 0) return nullptr;
        void* p = nullptr;
        cudaError_t st = cudaMalloc(&p, count * sizeof(T));
        if (st != cudaSuccess)
        {
            cudaGetLastError();
            throw std::runtime_error(std::string("allocating ") + std::to_string(count * sizeof(T)) + " bytes for "
                + what + " failed: " + cudaText(st));
        }
        blocks_.push_back(p);
        return static_cast<T*>(p);
    }

private:
    std::vector<void*> blocks_;
};

void check(cudaError_t st, char const* what)
{
    if (st != cudaSuccess)
    {
        cudaGetLastError();
        throw std::runtime_error(std::string(what) + " failed: " + cudaText(st));
    }
}

void check(nvcompStatus_t st, char const* what)
{
    if (st != nvcompSuccess)
    {
        throw std::runtime_error(std::string(what) + " failed: nvcompStatus_t " + std::to_string(int(st)));
    }
}

class NvcompCodecCuda final : public NvcompCodecBase
{
public:
    NvcompCodecCuda(CodecOptions options, int device) : NvcompCodecBase(options), device_(device) {}

    ~NvcompCodecCuda() override
    {
        DeviceScope scope(device_);
        if (encodeFork_) cudaEventDestroy(encodeFork_);
        if (decodeFork_) cudaEventDestroy(decodeFork_);
        for (int l = 0; l < kLanes; ++l)
        {
            for (Lane* lane : {&encLanes_[l], &decLanes_[l]})
            {
                if (lane->stream) cudaStreamSynchronize(lane->stream);
                if (lane->done) cudaEventDestroy(lane->done);
                if (lane->stream) cudaStreamDestroy(lane->stream);
            }
        }
        arena_.reset();
    }

private:
    struct EncodeWorkspace
    {
        void const** inPtrs = nullptr;
        size_t* inBytes = nullptr;
        void** outPtrs = nullptr;
        size_t* outBytes = nullptr;
        nvcompStatus_t* statuses = nullptr;
        uint32_t* entries = nullptr;
        uint64_t* offsets = nullptr;
        CrcPiece* chunkCrc = nullptr;
        PageState* pages = nullptr;
        uint8_t* compStaging = nullptr;
        uint8_t* inStaging = nullptr;
        uint8_t* temp = nullptr;
        size_t tempBytes = 0;
    };

    struct DecodeWorkspace
    {
        void const** inPtrs = nullptr;
        size_t* inBytes = nullptr;
        size_t* capacity = nullptr;
        size_t* actual = nullptr;
        void** outPtrs = nullptr;
        nvcompStatus_t* statuses = nullptr;
        uint8_t* kinds = nullptr;
        uint64_t* offsets = nullptr;
        CrcPiece* chunkCrc = nullptr;
        PageState* pages = nullptr;
        uint8_t* outStaging = nullptr;
        uint8_t* dummyOut = nullptr;
        uint8_t* blobStaging = nullptr;
        uint8_t* temp = nullptr;
        size_t tempBytes = 0;
    };

    struct Lane
    {
        EncodeWorkspace enc;
        DecodeWorkspace dec;
        cudaStream_t stream = nullptr;
        cudaEvent_t done = nullptr;
    };

    static constexpr int kLanes = 2;

    struct GroupState
    {
        DevChunk* chunks = nullptr;
        bool encodeDirect = false;
        bool decodeDirect = false;
    };

    bool configureBackend() override
    {
        try
        {
            DeviceScope scope(device_);
            if (!scope.ok()) return fail("cannot make CUDA device " + std::to_string(device_) + " current");
            // Load the codec's kernels now: with lazy module loading a first launch can wait for
            // work already queued on the device, and encode/decode must never wait.
            cudaFuncAttributes attributes{};
            for (void const* kernel : {reinterpret_cast<void const*>(&encodePrepare),
                     reinterpret_cast<void const*>(&encodeLayout), reinterpret_cast<void const*>(&encodeChunks),
                     reinterpret_cast<void const*>(&encodeSeal), reinterpret_cast<void const*>(&decodeHeader),
                     reinterpret_cast<void const*>(&decodeChunks), reinterpret_cast<void const*>(&decodeVerify),
                     reinterpret_cast<void const*>(&decodeScatter)})
            {
                check(cudaFuncGetAttributes(&attributes, kernel), "loading the codec's kernels");
            }
            check(cudaDeviceGetAttribute(&smCount_, cudaDevAttrMultiProcessorCount, device_), "querying the SM count");
            int pageable = 0;
            check(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device_),
                "querying pageable memory access");
            pageableAccess_ = pageable != 0;
            ops_ = makeNvcompOps(options_.algorithm, options_.elementBytes);
            arena_ = std::make_unique<DeviceArena>();
            nvcompAlignmentRequirements_t da{};
            check(ops_->decompressAlignment(&da), "nvCOMP decompress alignment query");
            if (da.input > kPayloadAlign)
            {
                return fail(std::string(algorithmInfo(options_.algorithm).name) + ": nvCOMP needs "
                    + std::to_string(da.input) + "-byte aligned compressed chunks; format version 1 aligns to 16");
            }
            // Sizes every buffer from the layout's real chunks and may lower maxPagesPerBatch.
            plan_ = planWorkspace(options_, layout_, plans_, *ops_);
            chunkStride_ = plan_.chunkStride;
            compStride_ = plan_.compStride;
            groups_.resize(plans_.size());
            for (size_t g = 0; g < plans_.size(); ++g)
            {
                auto const& group = layout_.groups()[g];
                std::vector<DevChunk> table;
                for (auto const& c : plans_[g].chunks)
                {
                    auto const& pool = group.pools[c.pool];
                    table.push_back({pool.base, pool.slotBytes, c.offset, c.bytes, c.pool});
                }
                groups_[g].encodeDirect = plan_.encodeDirect[g];
                groups_[g].decodeDirect = plan_.decodeDirect[g];
                groups_[g].chunks = arena_->alloc<DevChunk>(table.size(), "the chunk table");
                check(cudaMemcpy(groups_[g].chunks, table.data(), table.size() * sizeof(DevChunk), cudaMemcpyHostToDevice),
                    "copying the chunk table");
            }

            crcPowerTable(xpowHost_);
            xpow_ = arena_->alloc<uint32_t>(64, "the CRC power table");
            check(cudaMemcpy(xpow_, xpowHost_, sizeof(xpowHost_), cudaMemcpyHostToDevice), "copying the CRC table");
            zeroChunk_ = arena_->alloc<uint8_t>(chunkStride_, "the zero chunk");
            check(cudaMemset(zeroChunk_, 0, chunkStride_), "clearing the zero chunk");

            for (int l = 0; l < kLanes; ++l)
            {
                allocEncode(encLanes_[l].enc);
                allocDecode(decLanes_[l].dec);
                for (Lane* lane : {&encLanes_[l], &decLanes_[l]})
                {
                    check(cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking), "creating a codec stream");
                    check(cudaEventCreateWithFlags(&lane->done, cudaEventDisableTiming), "creating a codec event");
                }
            }
            makeDummyChunk();
            check(cudaEventCreateWithFlags(&encodeFork_, cudaEventDisableTiming), "creating the encode event");
            check(cudaEventCreateWithFlags(&decodeFork_, cudaEventDisableTiming), "creating the decode event");
            return true;
        }
        catch (std::exception const& e)
        {
            return fail(std::string("configure(): ") + e.what());
        }
    }

    // Every stride here is the one the kernels index with (chunkStride_, compStride_, the blob
    // stride roundUp(coldBytes, kStagingAlign), kDummyRawBytes), for plan_.maxChunks chunks.
    void allocEncode(EncodeWorkspace& w)
    {
        uint64_t const n = plan_.maxChunks;
        w.inPtrs = arena_->alloc<void const*>(n, "encode tables");
        w.inBytes = arena_->alloc<size_t>(n, "encode tables");
        w.outPtrs = arena_->alloc<void*>(n, "encode tables");
        w.outBytes = arena_->alloc<size_t>(n, "encode tables");
        w.statuses = arena_->alloc<nvcompStatus_t>(n, "encode tables");
        w.entries = arena_->alloc<uint32_t>(n, "encode tables");
        w.offsets = arena_->alloc<uint64_t>(n, "encode tables");
        w.chunkCrc = arena_->alloc<CrcPiece>(n, "encode tables");
        w.pages = arena_->alloc<PageState>(plan_.maxPages, "encode page states");
        w.compStaging = arena_->alloc<uint8_t>(n * compStride_, "compressed-chunk staging");
        w.inStaging = plan_.encodeStaging ? arena_->alloc<uint8_t>(n * chunkStride_, "shuffle staging") : nullptr;
        w.tempBytes = plan_.compressTempBytes;
        w.temp = arena_->alloc<uint8_t>(std::max<uint64_t>(w.tempBytes, 1), "nvCOMP compress workspace");
    }

    void allocDecode(DecodeWorkspace& w)
    {
        uint64_t const n = plan_.maxChunks;
        w.inPtrs = arena_->alloc<void const*>(n, "decode tables");
        w.inBytes = arena_->alloc<size_t>(n, "decode tables");
        w.capacity = arena_->alloc<size_t>(n, "decode tables");
        w.actual = arena_->alloc<size_t>(n, "decode tables");
        w.outPtrs = arena_->alloc<void*>(n, "decode tables");
        w.statuses = arena_->alloc<nvcompStatus_t>(n, "decode tables");
        w.kinds = arena_->alloc<uint8_t>(n, "decode tables");
        w.offsets = arena_->alloc<uint64_t>(n, "decode tables");
        w.chunkCrc = arena_->alloc<CrcPiece>(n, "decode tables");
        w.pages = arena_->alloc<PageState>(plan_.maxPages, "decode page states");
        w.outStaging = plan_.decodeStaging ? arena_->alloc<uint8_t>(n * chunkStride_, "decompression staging") : nullptr;
        w.dummyOut = arena_->alloc<uint8_t>(n * kDummyRawBytes, "dummy outputs");
        w.blobStaging = arena_->alloc<uint8_t>(plan_.blobBytes, "decode blob staging");
        w.tempBytes = plan_.decompressTempBytes;
        w.temp = arena_->alloc<uint8_t>(std::max<uint64_t>(w.tempBytes, 1), "nvCOMP decompress workspace");
    }

    // A small valid compressed chunk that decoding hands to nvCOMP in place of chunks it must
    // not decompress (raw chunks, bad pages): nvCOMP's batch size is fixed by the host.
    // With lazy module loading nvCOMP's kernels load at their first launch, which can wait for
    // work queued on the device; encode and decode must never wait. So every kernel they use runs
    // once here: compressing and decompressing the dummy chunk and a chunk of the layout's
    // largest size.
    void makeDummyChunk()
    {
        size_t cap = 0;
        check(ops_->maxCompressedChunk(kDummyRawBytes, &cap), "nvCOMP max chunk size query");
        dummyIn_ = arena_->alloc<uint8_t>(roundUp(cap, kStagingAlign), "the dummy chunk");
        DeviceArena scratch;
        auto* raw = scratch.alloc<uint8_t>(kDummyRawBytes, "the dummy chunk");
        check(cudaMemset(raw, 0, kDummyRawBytes), "clearing the dummy chunk");
        dummyInBytes_ = roundTripOnce(raw, kDummyRawBytes, dummyIn_, "the dummy chunk");
        roundTripOnce(zeroChunk_, plan_.maxChunkBytes, nullptr, "loading nvCOMP's kernels (a largest chunk)");
    }

    // Compresses `bytes` bytes at `raw` into `comp` (nvCOMP's bound for them, rounded up to
    // kStagingAlign; a scratch buffer when null) and decompresses them back, synchronously,
    // checking that the bytes came back; returns the compressed size. `comp` is cleared first:
    // decoders read whole words past a chunk's last byte (gdeflate: 4-byte words).
    size_t roundTripOnce(uint8_t const* raw, size_t bytes, uint8_t* comp, char const* what)
    {
        size_t cap = 0, ct = 0, dt = 0;
        check(ops_->maxCompressedChunk(bytes, &cap), what);
        check(ops_->compressTemp(1, bytes, bytes, &ct, nullptr), what);
        check(ops_->decompressTemp(1, bytes, bytes, &dt, nullptr), what);
        DeviceArena scratch;
        if (comp == nullptr)
        {
            comp = scratch.alloc<uint8_t>(roundUp(cap, kStagingAlign), what);
        }
        check(cudaMemset(comp, 0, roundUp(cap, kStagingAlign)), what);
        auto* back = scratch.alloc<uint8_t>(std::max<size_t>(bytes, 1), what);
        auto* ctemp = scratch.alloc<uint8_t>(std::max<size_t>(ct, 1), what);
        auto* dtemp = scratch.alloc<uint8_t>(std::max<size_t>(dt, 1), what);
        auto* tables = scratch.alloc<uint64_t>(8, what);
        auto* status = scratch.alloc<nvcompStatus_t>(2, what);
        // [0] raw, [1] raw bytes, [2] compressed, [3] compressed bytes, [4] back, [5] capacity, [6] actual.
        uint64_t host[8] = {reinterpret_cast<uint64_t>(raw), bytes, reinterpret_cast<uint64_t>(comp), 0,
            reinterpret_cast<uint64_t>(back), bytes, 0, 0};
        check(cudaMemcpy(tables, host, sizeof(host), cudaMemcpyHostToDevice), what);
        check(ops_->compress(reinterpret_cast<void const* const*>(tables), reinterpret_cast<size_t const*>(tables + 1),
                  bytes, 1, ctemp, ct, reinterpret_cast<void* const*>(tables + 2), reinterpret_cast<size_t*>(tables + 3),
                  status, nullptr),
            what);
        check(ops_->decompress(reinterpret_cast<void const* const*>(tables + 2),
                  reinterpret_cast<size_t const*>(tables + 3), reinterpret_cast<size_t const*>(tables + 5),
                  reinterpret_cast<size_t*>(tables + 6), 1, dtemp, dt, reinterpret_cast<void* const*>(tables + 4),
                  status + 1, nullptr),
            what);
        check(cudaDeviceSynchronize(), what);
        nvcompStatus_t st[2] = {nvcompErrorInternal, nvcompErrorInternal};
        check(cudaMemcpy(host, tables, sizeof(host), cudaMemcpyDeviceToHost), what);
        check(cudaMemcpy(st, status, sizeof(st), cudaMemcpyDeviceToHost), what);
        check(st[0], what);
        check(st[1], what);
        if (host[6] != bytes)
        {
            throw std::runtime_error(std::string(what) + ": " + std::to_string(bytes) + " bytes came back as "
                + std::to_string(host[6]));
        }
        return host[3];
    }

    // The operator of a blob's codec header and chunk table, [32, headerBytes).
    uint32_t headerOp(uint32_t headerBytes) const noexcept
    {
        return crcShiftOperator(headerBytes - kCodecHeaderOffset, xpowHost_);
    }

    PageIndexLocation location() const noexcept override
    {
        return PageIndexLocation::kDevice;
    }

    // On the GPU a page's gdeflate and ANS blobs changed with the other pages of its call (same
    // sizes, bytes inside compressed chunks differing; compute-sanitizer's initcheck saw ANS's
    // compress kernel read 16-byte words it had not written) while LZ4 blobs did not. nvCOMP
    // does not promise to write every byte of a compressed chunk up to its reported size
    // (gdeflate ends its 32 interleaved bit streams in partial words that the decoder ignores),
    // so stale bytes of another chunk in the same staging slot can reach the blob; ANS also
    // writes bytes past the size it reports, so the whole slot is cleared. Clearing the slot
    // first makes the blob depend on its page alone; test_nvcomp_gpu.py's stale-memory test
    // checks which buffer matters.
    bool zeroCompressed() const noexcept
    {
        return options_.algorithm == Algorithm::kGdeflate || options_.algorithm == Algorithm::kAns;
    }

    bool submit(PoolGroupIndex g, uintptr_t blob, PageIndexPair const* pairs, size_t n, cudaStream_t stream,
        bool encode, uint8_t* pageStatus) override
    {
        char const* op = encode ? "encode" : pageStatus ? "decodeChecked" : "decode";
        if (stream == nullptr || stream == cudaStreamLegacy)
        {
            return fail(std::string(op) + "(): non-empty calls need a non-legacy CUDA stream (got the legacy/null stream)");
        }
        DeviceScope scope(device_);
        if (!scope.ok()) return fail("cannot make CUDA device " + std::to_string(device_) + " current");
        if (pageStatus != nullptr)
        {
            std::string why = statusMemoryProblem(pageStatus);
            if (!why.empty()) return fail(std::string(op) + "(): " + why);
        }
        // Fork: the lanes wait for the caller's stream; batches alternate between the two lanes
        // so one batch's transfer overlaps the next one's (de)compression; join: the caller's
        // stream waits for both. A lane's own stream orders its workspace across calls.
        Lane* lanes = encode ? encLanes_ : decLanes_;
        cudaEvent_t fork = encode ? encodeFork_ : decodeFork_;
        cudaError_t st = cudaEventRecord(fork, stream);
        for (int l = 0; st == cudaSuccess && l < kLanes; ++l)
        {
            st = cudaStreamWaitEvent(lanes[l].stream, fork, 0);
        }
        if (st != cudaSuccess)
        {
            cudaGetLastError();
            return fail(std::string(op) + "(): forking onto the codec's streams failed: " + cudaText(st));
        }
        auto const& plan = plans_[g];
        auto const& group = layout_.groups()[g];
        // Blobs in host memory: at least four batches when the call is large enough, none under
        // ~8 MiB of raw data, so one batch's PCIe transfer overlaps the next one's compression.
        // Blobs in device memory have no transfer to hide: the largest batches keep the most
        // chunks in flight.
        uint64_t batch = plan.maxPagesPerBatch;
        bool const hostBlobs = !isDeviceMemory(reinterpret_cast<void const*>(blob));
        if (hostBlobs)
        {
            uint64_t const minPages = std::max<uint64_t>(1, (8ull << 20) / group.pageBytes);
            batch = std::min<uint64_t>(batch, std::max<uint64_t>(minPages, (n + 3) / 4));
        }
        std::string err;
        int b = 0;
        for (size_t first = 0; first < n && err.empty(); first += batch, ++b)
        {
            size_t const m = std::min<size_t>(batch, n - first);
            Lane& lane = lanes[b % kLanes];
            err = encode ? encodeBatch(g, blob, pairs + first, m, lane, hostBlobs)
                         : decodeBatch(g, blob, pairs + first, m, lane, hostBlobs,
                             pageStatus != nullptr ? pageStatus + first : nullptr);
        }
        for (int l = 0; l < kLanes; ++l)
        {
            cudaError_t e = cudaEventRecord(lanes[l].done, lanes[l].stream);
            if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, lanes[l].done, 0);
            if (e != cudaSuccess && err.empty())
            {
                cudaGetLastError();
                err = "joining the codec's streams failed: " + cudaText(e);
            }
        }
        return err.empty() ? true : fail(std::string(op) + "(): " + err);
    }

    // Why the codec's kernels cannot write decodeChecked()'s status array at `p`, or an empty
    // string: it must be memory of this device, managed memory, mapped pinned host memory whose
    // device address is its host address, or any host memory where the device reads pageable
    // memory. A host query without synchronization; a kernel's write to other memory would fault
    // and take the CUDA context with it.
    std::string statusMemoryProblem(void const* p) const
    {
        cudaPointerAttributes at{};
        cudaError_t const st = cudaPointerGetAttributes(&at, p);
        if (st != cudaSuccess)
        {
            cudaGetLastError();
            return "cannot query the page status array's memory: " + cudaText(st);
        }
        switch (at.type)
        {
        case cudaMemoryTypeDevice:
            if (at.device == device_) return {};
            return "the page status array is memory of CUDA device " + std::to_string(at.device) + ", not of device "
                + std::to_string(device_) + " that the codec runs on";
        case cudaMemoryTypeManaged: return {};
        case cudaMemoryTypeHost:
            if (at.devicePointer == p) return {};
            return "the page status array is pinned host memory that is not mapped at its host address; allocate it "
                   "with cudaHostAlloc (or torch's pin_memory())";
        default:
            if (pageableAccess_) return {};
            return "the page status array is pageable host memory, which this device cannot write; use device memory "
                   "or mapped pinned host memory";
        }
    }

    // Blocks of the chunk kernels: one per chunk, or for blobs in host memory two per SM (enough
    // bytes in flight for the link).
    unsigned chunkGrid(size_t chunks, bool hostBlobs) const noexcept
    {
        return unsigned(hostBlobs ? std::min<size_t>(chunks, 2 * size_t(smCount_)) : chunks);
    }

    std::string encodeBatch(PoolGroupIndex g, uintptr_t blob, PageIndexPair const* pairs, size_t m, Lane& lane, bool hostBlobs)
    {
        EncodeWorkspace& enc_ = lane.enc;
        cudaStream_t const stream = lane.stream;
        auto const& group = layout_.groups()[g];
        auto const& plan = plans_[g];
        uint32_t const numChunks = uint32_t(plan.chunks.size());
        size_t const total = m * numChunks;
        EncodeArgs a{groups_[g].chunks, numChunks, group.numSlots, pairs, options_.elementBytes,
            options_.bitshuffle ? 1u : 0u, groups_[g].encodeDirect ? 1u : 0u, uint8_t(options_.algorithm),
            options_.chunkBytes, chunkStride_, enc_.inStaging, zeroChunk_, enc_.inPtrs, enc_.inBytes, enc_.outPtrs,
            enc_.compStaging, compStride_, zeroCompressed() ? 1u : 0u, enc_.outBytes, enc_.statuses, enc_.entries,
            enc_.offsets, enc_.chunkCrc, enc_.pages, headerOp(plan.headerBytes), plan.coldBytes, plan.headerBytes, group.pageBytes, blob, xpow_};
        encodePrepare<<<unsigned(total), 128, 0, stream>>>(a);
        cudaError_t st = cudaGetLastError();
        if (st != cudaSuccess) return "prepare kernel launch failed: " + cudaText(st);
        nvcompStatus_t ns = ops_->compress(enc_.inPtrs, enc_.inBytes, plan_.maxChunkBytes, total, enc_.temp,
            enc_.tempBytes, enc_.outPtrs, enc_.outBytes, enc_.statuses, stream);
        if (ns != nvcompSuccess) return "nvCOMP batched compress of " + std::to_string(total) + " chunks failed: status " + std::to_string(int(ns));
        // Layout per page, payload and checksum pieces per chunk (every chunk of the batch in
        // flight at once), then header and envelope per page.
        encodeLayout<<<unsigned(m), kPageThreads, 0, stream>>>(a);
        encodeChunks<<<chunkGrid(total, hostBlobs), kThreads, 0, stream>>>(a, total);
        encodeSeal<<<unsigned(m), kPageThreads, 0, stream>>>(a);
        st = cudaGetLastError();
        return st == cudaSuccess ? std::string() : "finish kernels' launch failed: " + cudaText(st);
    }

    // `pageStatus`: the batch's first page's status byte (decodeChecked), or null.
    std::string decodeBatch(PoolGroupIndex g, uintptr_t blob, PageIndexPair const* pairs, size_t m, Lane& lane,
        bool hostBlobs, uint8_t* pageStatus)
    {
        DecodeWorkspace& dec_ = lane.dec;
        cudaStream_t const stream = lane.stream;
        auto const& group = layout_.groups()[g];
        auto const& plan = plans_[g];
        uint32_t const numChunks = uint32_t(plan.chunks.size());
        size_t const total = m * numChunks;
        DecodeArgs a{groups_[g].chunks, numChunks, group.numSlots, pairs, options_.elementBytes,
            options_.bitshuffle ? 1u : 0u, groups_[g].decodeDirect ? 1u : 0u, uint8_t(options_.algorithm),
            options_.chunkBytes, chunkStride_, dec_.outStaging, dec_.inPtrs, dec_.inBytes, dec_.capacity, dec_.actual,
            dec_.outPtrs, dec_.statuses, dec_.kinds, dec_.offsets, dec_.chunkCrc, dec_.pages, headerOp(plan.headerBytes), dummyIn_, dummyInBytes_, dec_.dummyOut,
            dec_.blobStaging, roundUp(plan.coldBytes, kStagingAlign), plan.coldBytes, plan.headerBytes, group.pageBytes,
            blob, xpow_, hostBlobs ? 0u : 1u, pageStatus};
        // Header per page, payload and checksum pieces per chunk, verdict and nvCOMP's tables per page.
        decodeHeader<<<unsigned(m), kPageThreads, 0, stream>>>(a);
        decodeChunks<<<chunkGrid(total, hostBlobs), kThreads, 0, stream>>>(a, total);
        decodeVerify<<<unsigned(m), kPageThreads, 0, stream>>>(a);
        cudaError_t st = cudaGetLastError();
        if (st != cudaSuccess) return "fetch kernels' launch failed: " + cudaText(st);
        nvcompStatus_t ns = ops_->decompress(dec_.inPtrs, dec_.inBytes, dec_.capacity, dec_.actual, total, dec_.temp,
            dec_.tempBytes, dec_.outPtrs, dec_.statuses, stream);
        if (ns != nvcompSuccess) return "nvCOMP batched decompress of " + std::to_string(total) + " chunks failed: status " + std::to_string(int(ns));
        decodeScatter<<<unsigned(total), kThreads, 0, stream>>>(a);
        st = cudaGetLastError();
        return st == cudaSuccess ? std::string() : "scatter kernel launch failed: " + cudaText(st);
    }


    int device_;
    std::unique_ptr<NvcompOps> ops_;
    std::unique_ptr<DeviceArena> arena_;
    std::vector<GroupState> groups_;
    Lane encLanes_[kLanes];
    Lane decLanes_[kLanes];
    WorkspacePlan plan_;
    uint64_t chunkStride_ = 0;
    uint64_t compStride_ = 0;
    uint32_t* xpow_ = nullptr;
    uint32_t xpowHost_[64] = {};
    int smCount_ = 1;
    bool pageableAccess_ = false; // kernels may write pageable host memory (HMM, ATS)
    uint8_t* zeroChunk_ = nullptr;
    uint8_t* dummyIn_ = nullptr;
    uint64_t dummyInBytes_ = 0;
    cudaEvent_t encodeFork_ = nullptr;
    cudaEvent_t decodeFork_ = nullptr;
};

__global__ void cutChunks(uint8_t* base, uint64_t bytes, uint64_t chunkBytes, uint64_t chunks, void** inPtrs,
    size_t* inBytes, void** outPtrs, uint8_t* comp, uint64_t compStride, void** backPtrs, uint8_t* back, size_t* cap)
{
    uint64_t const k = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (k >= chunks) return;
    uint64_t const off = k * chunkBytes;
    inPtrs[k] = base + off;
    inBytes[k] = min(chunkBytes, bytes - off);
    outPtrs[k] = comp + k * compStride;
    backPtrs[k] = back + off;
    cap[k] = inBytes[k];
}

} // namespace

IKvCacheColdPageCodec* createCudaCodec(CodecOptions const& options, int device, std::string& error)
{
    int count = 0;
    cudaError_t st = cudaGetDeviceCount(&count);
    if (st != cudaSuccess || device >= count)
    {
        cudaGetLastError();
        error = "CUDA device " + std::to_string(device) + " is not available ("
            + (st == cudaSuccess ? std::to_string(count) + " devices" : cudaText(st)) + ")";
        return nullptr;
    }
    return new NvcompCodecCuda(options, device);
}

namespace {

// Host mirrors of the kernels' CRC steps, with the same pieces in the same order.
struct HostCrc
{
    uint32_t xpow[64];
    uint32_t t[4][256];
    HostCrc()
    {
        crcPowerTable(xpow);
        crcSliceTables(t);
    }

    // blockCrcEqual.
    uint32_t equal(std::vector<uint32_t> part, uint32_t log2Bytes) const
    {
        uint32_t const threads = uint32_t(part.size());
        uint32_t k = 3 + log2Bytes;
        for (uint32_t stride = 1; stride < threads; stride *= 2, ++k)
        {
            for (uint32_t i = 0; i < threads; i += 2 * stride)
            {
                part[i] = (part[i] == 0 ? 0u : crcMulMod(xpow[k], part[i])) ^ part[i + stride];
            }
        }
        return part[0];
    }

    // blockCrcJoin.
    static CrcPiece join(std::vector<CrcPiece> part)
    {
        uint32_t const threads = uint32_t(part.size());
        for (uint32_t stride = 1; stride < threads; stride *= 2)
        {
            for (uint32_t i = 0; i + stride < threads; i += 2 * stride)
            {
                part[i] = crcJoin(part[i], part[i + stride]);
            }
        }
        return part[0];
    }

    static uint32_t log2(uint64_t pow2)
    {
        uint32_t k = 0;
        while ((uint64_t(1) << k) < pow2) ++k;
        return k;
    }

    // blockCrcRaw.
    uint32_t blockRaw(uint8_t const* p, uint64_t bytes, uint64_t valid, uint32_t threads) const
    {
        uint64_t const seg = crcSegmentBytes(bytes, threads);
        std::vector<uint32_t> part(threads);
        for (uint32_t th = 0; th < threads; ++th)
        {
            uint64_t b0 = 0, b1 = 0;
            crcLeadingZeroSegment(bytes, seg, threads, th, b0, b1);
            uint64_t const end = std::min(b1, std::max(b0, valid));
            uint32_t c = crcUpdate(0, p + b0, end - b0, t);
            for (uint64_t b = end; b < b1; ++b) c = crcAdvanceByte(c, t[0]);
            part[th] = c;
        }
        return equal(part, log2(seg));
    }

    // threadRun.
    static void run(uint32_t n, uint32_t threads, uint32_t th, uint32_t& first, uint32_t& last)
    {
        uint32_t const per = (n + threads - 1) / threads;
        first = std::min(n, th * per);
        last = std::min(n, first + per);
    }
};

void requirePowerOfTwo(uint32_t threads)
{
    if (threads == 0 || (threads & (threads - 1)) != 0)
    {
        throw std::invalid_argument("threads is " + std::to_string(threads) + "; a block's thread count is a power of two");
    }
}

} // namespace

uint32_t segmentedCrc32c(uint8_t const* data, uint64_t bytes, uint32_t threads)
{
    requirePowerOfTwo(threads);
    HostCrc const h;
    return crcFinish(h.blockRaw(data, bytes, bytes, threads), bytes, h.xpow);
}

uint32_t pieceCrc32c(uint8_t const* region, uint64_t headerBytes, std::vector<uint32_t> const& stored,
    uint32_t chunkThreads, uint32_t pageThreads)
{
    requirePowerOfTwo(chunkThreads);
    requirePowerOfTwo(pageThreads);
    HostCrc const h;
    // Header: encodeSeal checksums 32-bit words per leading-zero segment, decodeHeader the
    // staged bytes; both must agree.
    uint64_t const seg = crcSegmentBytes(headerBytes, pageThreads);
    std::vector<uint32_t> part(pageThreads);
    for (uint32_t th = 0; th < pageThreads; ++th)
    {
        uint64_t b0 = 0, b1 = 0;
        crcLeadingZeroSegment(headerBytes, seg, pageThreads, th, b0, b1);
        uint32_t raw = 0;
        for (uint64_t j = b0 / 4; j < b1 / 4; ++j)
        {
            uint8_t const* w = region + 4 * j;
            raw = crcWord(raw, uint32_t(w[0]) | (uint32_t(w[1]) << 8) | (uint32_t(w[2]) << 16) | (uint32_t(w[3]) << 24), h.t);
        }
        part[th] = raw;
    }
    uint32_t const headerRaw = h.equal(part, HostCrc::log2(seg));
    if (headerRaw != h.blockRaw(region, headerBytes, headerBytes, pageThreads))
    {
        throw std::logic_error("the header's word segments and byte segments disagree");
    }
    // Chunks as encodeChunks (the source's stored bytes, the padding as zeros) and decodeChunks
    // (the padded bytes) checksum them, joined in runs per page thread (encodeSeal, decodeVerify).
    uint32_t const n = uint32_t(stored.size());
    std::vector<CrcPiece> chunk(n);
    uint64_t pos = headerBytes;
    for (uint32_t c = 0; c < n; ++c)
    {
        uint64_t const padded = roundUp(stored[c], kPayloadAlign);
        uint32_t const raw = h.blockRaw(region + pos, padded, stored[c], chunkThreads);
        if (raw != h.blockRaw(region + pos, padded, padded, chunkThreads))
        {
            throw std::logic_error("a chunk's padding is not zero");
        }
        chunk[c] = CrcPiece{raw, crcShiftOperator(padded, h.xpow)};
        pos += padded;
    }
    std::vector<CrcPiece> runs(pageThreads);
    for (uint32_t th = 0; th < pageThreads; ++th)
    {
        uint32_t first = 0, last = 0;
        HostCrc::run(n, pageThreads, th, first, last);
        CrcPiece r{0, kCrcOne};
        for (uint32_t c = first; c < last; ++c) r = crcJoin(r, chunk[c]);
        runs[th] = r;
    }
    CrcPiece const all = crcJoin(CrcPiece{headerRaw, crcShiftOperator(headerBytes, h.xpow)}, HostCrc::join(runs));
    return crcFinishOp(all.raw, all.op);
}

DirectResult directBenchmark(Algorithm algorithm, uint32_t elementBytes, uintptr_t data, uint64_t bytes,
    uint64_t chunkBytes, int iterations, cudaStream_t stream)
{
    auto ops = makeNvcompOps(algorithm, elementBytes);
    uint64_t const chunks = (bytes + chunkBytes - 1) / chunkBytes;
    size_t maxOut = 0;
    check(ops->maxCompressedChunk(chunkBytes, &maxOut), "nvCOMP max chunk size query");
    uint64_t const compStride = roundUp(maxOut, kStagingAlign);
    size_t ct = 0, dt = 0;
    check(ops->compressTemp(chunks, chunkBytes, bytes, &ct, stream), "nvCOMP compress temp-size query");
    check(ops->decompressTemp(chunks, chunkBytes, bytes, &dt, stream), "nvCOMP decompress temp-size query");
    DeviceArena arena;
    auto* inPtrs = arena.alloc<void*>(chunks, "tables");
    auto* inBytes = arena.alloc<size_t>(chunks, "tables");
    auto* outPtrs = arena.alloc<void*>(chunks, "tables");
    auto* outBytes = arena.alloc<size_t>(chunks, "tables");
    auto* backPtrs = arena.alloc<void*>(chunks, "tables");
    auto* cap = arena.alloc<size_t>(chunks, "tables");
    auto* actual = arena.alloc<size_t>(chunks, "tables");
    auto* statuses = arena.alloc<nvcompStatus_t>(chunks, "tables");
    auto* comp = arena.alloc<uint8_t>(chunks * compStride, "compressed chunks");
    auto* back = arena.alloc<uint8_t>(bytes, "decompressed copy");
    auto* ctemp = arena.alloc<uint8_t>(std::max<size_t>(ct, 1), "compress workspace");
    auto* dtemp = arena.alloc<uint8_t>(std::max<size_t>(dt, 1), "decompress workspace");
    cutChunks<<<unsigned((chunks + 255) / 256), 256, 0, stream>>>(reinterpret_cast<uint8_t*>(data), bytes, chunkBytes,
        chunks, inPtrs, inBytes, outPtrs, comp, compStride, backPtrs, back, cap);
    check(cudaGetLastError(), "chunk table kernel");
    cudaEvent_t e0, e1, e2;
    check(cudaEventCreate(&e0), "event");
    check(cudaEventCreate(&e1), "event");
    check(cudaEventCreate(&e2), "event");
    DirectResult r;
    r.rawBytes = bytes;
    float cms = 0, dms = 0;
    for (int it = -1; it < iterations; ++it) // iteration -1 warms up
    {
        cudaEventRecord(e0, stream);
        check(ops->compress(inPtrs, inBytes, chunkBytes, chunks, ctemp, ct, outPtrs, outBytes, statuses, stream), "nvCOMP compress");
        cudaEventRecord(e1, stream);
        check(ops->decompress(outPtrs, outBytes, cap, actual, chunks, dtemp, dt, backPtrs, statuses, stream), "nvCOMP decompress");
        cudaEventRecord(e2, stream);
        check(cudaEventSynchronize(e2), "benchmark iteration");
        float a = 0, b = 0;
        cudaEventElapsedTime(&a, e0, e1);
        cudaEventElapsedTime(&b, e1, e2);
        if (it >= 0)
        {
            cms += a;
            dms += b;
        }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaEventDestroy(e2);
    std::vector<size_t> sizes(chunks);
    check(cudaMemcpy(sizes.data(), outBytes, chunks * sizeof(size_t), cudaMemcpyDeviceToHost), "reading sizes");
    for (size_t s : sizes) r.compressedBytes += s;
    std::vector<uint8_t> a(bytes), b(bytes);
    check(cudaMemcpy(a.data(), reinterpret_cast<void*>(data), bytes, cudaMemcpyDeviceToHost), "reading input");
    check(cudaMemcpy(b.data(), back, bytes, cudaMemcpyDeviceToHost), "reading output");
    r.roundTripOk = a == b;
    r.compressMs = cms / std::max(iterations, 1);
    r.decompressMs = dms / std::max(iterations, 1);
    return r;
}

std::vector<std::string> compressChunksForTest(Algorithm algorithm, uint32_t elementBytes, uintptr_t data,
    std::vector<uint64_t> const& sizes, uint8_t inFill, uint8_t outFill, uint8_t tempFill)
{
    auto ops = makeNvcompOps(algorithm, elementBytes);
    uint64_t const n = sizes.size();
    if (n == 0) return {};
    uint64_t const maxChunk = *std::max_element(sizes.begin(), sizes.end());
    uint64_t total = 0;
    for (uint64_t b : sizes) total += b;
    size_t maxOut = 0, temp = 0;
    check(ops->maxCompressedChunk(maxChunk, &maxOut), "nvCOMP max chunk size query");
    check(ops->compressTemp(n, maxChunk, total, &temp, nullptr), "nvCOMP compress temp-size query");
    uint64_t const inStride = roundUp(maxChunk, kStagingAlign);
    uint64_t const outStride = roundUp(maxOut, kStagingAlign);
    DeviceArena arena;
    auto* in = arena.alloc<uint8_t>(n * inStride, "input chunks");
    auto* out = arena.alloc<uint8_t>(n * outStride, "output chunks");
    auto* tempPtr = arena.alloc<uint8_t>(std::max<size_t>(temp, 1), "compress workspace");
    auto* tables = arena.alloc<uint64_t>(4 * n, "tables");
    auto* statuses = arena.alloc<nvcompStatus_t>(n, "statuses");
    check(cudaMemset(in, inFill, n * inStride), "filling the input chunks");
    check(cudaMemset(out, outFill, n * outStride), "filling the output chunks");
    check(cudaMemset(tempPtr, tempFill, std::max<size_t>(temp, 1)), "filling the workspace");
    std::vector<uint64_t> host(4 * n);
    uint64_t off = 0;
    for (uint64_t k = 0; k < n; ++k)
    {
        check(cudaMemcpy(in + k * inStride, reinterpret_cast<uint8_t const*>(data) + off, sizes[k], cudaMemcpyDeviceToDevice),
            "staging a chunk");
        off += sizes[k];
        host[k] = reinterpret_cast<uint64_t>(in + k * inStride);
        host[n + k] = sizes[k];
        host[2 * n + k] = reinterpret_cast<uint64_t>(out + k * outStride);
    }
    check(cudaMemcpy(tables, host.data(), host.size() * sizeof(uint64_t), cudaMemcpyHostToDevice), "copying the tables");
    check(ops->compress(reinterpret_cast<void const* const*>(tables), reinterpret_cast<size_t const*>(tables + n),
              maxChunk, n, tempPtr, temp, reinterpret_cast<void* const*>(tables + 2 * n),
              reinterpret_cast<size_t*>(tables + 3 * n), statuses, nullptr),
        "nvCOMP compress");
    check(cudaDeviceSynchronize(), "nvCOMP compress");
    std::vector<nvcompStatus_t> st(n);
    check(cudaMemcpy(host.data(), tables, host.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost), "reading the sizes");
    check(cudaMemcpy(st.data(), statuses, n * sizeof(nvcompStatus_t), cudaMemcpyDeviceToHost), "reading the statuses");
    std::vector<std::string> result(n);
    for (uint64_t k = 0; k < n; ++k)
    {
        check(st[k], "nvCOMP compress of a chunk");
        result[k].resize(host[3 * n + k]);
        check(cudaMemcpy(result[k].data(), out + k * outStride, result[k].size(), cudaMemcpyDeviceToHost),
            "reading a compressed chunk");
    }
    return result;
}

} // namespace kvcodec::nvcomp_plugin

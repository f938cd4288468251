// SPDX-License-Identifier: Apache-2.0
//
// Encode kernels (codec_cuda.h describes the pipeline): prepare -> nvCOMP batched compress ->
// layout -> chunks -> seal.
#include <cuda_runtime.h>

#include "kernel_device.cuh"
#include "kernels.h"
#include "kvcodec/kernels.cuh"

namespace kvcodec::nvcomp_plugin {
namespace {

__global__ void encodePrepare(EncodeArgs a)
{
    uint64_t const k = blockIdx.x;
    uint64_t const i = k / a.numChunks;
    uint32_t const c = uint32_t(k % a.numChunks);
    PageIndexPair const pair = a.pairs[i];
    DevChunk const ch = a.chunks[c];
    bool const valid = pair.src >= 0 && uint64_t(pair.src) < a.numSlots && pair.dst >= 0;
    auto const* src = valid
        ? reinterpret_cast<uint8_t const*>(ch.poolBase + uint64_t(pair.src) * ch.slotBytes + ch.offset)
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
        a.pages[i] = PageState{
            fits ? total : sizeof(ColdPageEnvelope), 0, 0, (fits ? kPageValid : 0u) | (any ? kPageCompressed : 0u)};
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
                if (x == 0)
                    w[q] = a.numChunks;
                else if (x == 1)
                    w[q] = uint32_t(a.chunkBytes);
                else if (x == 2)
                    w[q] = uint32_t(a.algorithm) | (a.elementBytes << 8) | (a.bitshuffle << 16);
                else if (x >= 4 && x - 4 < a.numChunks)
                    w[q] = a.entries[base + x - 4];
                raw = crcWord(raw, w[q], tables.t);
                if (!aligned)
                    store32(cold + kCodecHeaderOffset + 4 * x, w[q]);
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
        e.headerCrc = crc32c(&e, offsetof(ColdPageEnvelope, headerCrc));
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

} // namespace

cudaError_t preloadEncodeKernels() noexcept
{
    return preloadKernels(encodePrepare, encodeLayout, encodeChunks, encodeSeal);
}

cudaError_t launchEncodePrepare(EncodeArgs const& a, size_t total, cudaStream_t stream) noexcept
{
    encodePrepare<<<unsigned(total), 128, 0, stream>>>(a);
    return cudaGetLastError();
}

cudaError_t launchEncodeFinish(
    EncodeArgs const& a, size_t pages, unsigned chunkGrid, size_t total, cudaStream_t stream) noexcept
{
    // Layout per page, payload and checksum pieces per chunk (every chunk of the batch in
    // flight at once), then header and envelope per page.
    encodeLayout<<<unsigned(pages), kPageThreads, 0, stream>>>(a);
    encodeChunks<<<chunkGrid, kThreads, 0, stream>>>(a, total);
    encodeSeal<<<unsigned(pages), kPageThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

} // namespace kvcodec::nvcomp_plugin

// SPDX-License-Identifier: Apache-2.0
//
// Decode kernels (codec_cuda.h describes the pipeline): header -> chunks -> verify -> nvCOMP
// batched decompress -> scatter.
#include <cuda_runtime.h>

#include "kernel_device.cuh"
#include "kernels.h"
#include "kvcodec/kernels.cuh"

namespace kvcodec::nvcomp_plugin {
namespace {

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
    auto const* blob
        = reinterpret_cast<uint8_t const*>(a.coldBase + (indicesOk ? uint64_t(pair.src) * a.coldBytes : 0));
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
        if (!indicesOk)
            st = kPageBadIndex;
        else if (env.magic != kColdPageEnvelopeMagic)
            st = kPageBadMagic;
        else if (crc32c(raw, offsetof(ColdPageEnvelope, headerCrc)) != env.headerCrc)
            st = kPageBadHeader;
        else if (env.formatVersion != kFormatVersion)
            st = kPageBadFormatVersion;
        else if (env.flags & kEnvelopeDidNotFit)
            st = kPageDidNotFit;
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
        if (threadIdx.x == 0)
            a.pages[i] = PageState{0, 0, 0, decodeFlags(status)};
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
            if (threadIdx.x == 0)
                a.kinds[k] |= kChunkInPlace;
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
        CrcPiece const all
            = crcJoin(CrcPiece{page.headerRaw, a.headerOp}, blockChunksJoin(a.chunkCrc + base, a.numChunks));
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
            a.outPtrs[k] = a.direct
                ? reinterpret_cast<void*>(ch.poolBase + uint64_t(pair.dst) * ch.slotBytes + ch.offset)
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

} // namespace

cudaError_t preloadDecodeKernels() noexcept
{
    return preloadKernels(decodeHeader, decodeChunks, decodeVerify, decodeScatter);
}

cudaError_t launchDecodeFetch(
    DecodeArgs const& a, size_t pages, unsigned chunkGrid, size_t total, cudaStream_t stream) noexcept
{
    // Header per page, payload and checksum pieces per chunk, verdict and nvCOMP's tables per page.
    decodeHeader<<<unsigned(pages), kPageThreads, 0, stream>>>(a);
    decodeChunks<<<chunkGrid, kThreads, 0, stream>>>(a, total);
    decodeVerify<<<unsigned(pages), kPageThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

cudaError_t launchDecodeScatter(DecodeArgs const& a, size_t total, cudaStream_t stream) noexcept
{
    decodeScatter<<<unsigned(total), kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

} // namespace kvcodec::nvcomp_plugin

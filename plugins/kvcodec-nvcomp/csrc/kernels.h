// SPDX-License-Identifier: Apache-2.0
//
// What the CUDA codec (codec_cuda.cpp) and its kernels (kernel_encode.cu, kernel_decode.cu)
// share: the kernels' argument blocks and the launch functions. The pipeline of one call is
// described in codec_cuda.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>
#include <nvcomp.h>

#include "format.h"
#include "kvcodec/codec.h"

namespace kvcodec::nvcomp_plugin {

/// Threads per block of the per-chunk kernels.
inline constexpr uint32_t kThreads = 256;
/// Page threads per block of the per-page kernels (layout, seal, header, verify).
inline constexpr uint32_t kPageThreads = 128;

/// Raw size of the small compressed chunk decoding hands nvCOMP in place of chunks it must not
/// decompress (raw chunks, bad pages); also the stride of its outputs.
inline constexpr uint64_t kDummyRawBytes = 256;
/// Alignment of every staged chunk and blob (above every nvCOMP alignment requirement).
inline constexpr uint64_t kStagingAlign = 256;

/// One chunk of a page as the kernels see it.
struct DevChunk
{
    uint64_t poolBase;
    uint64_t slotBytes;
    uint64_t offset;
    uint32_t bytes;
    uint32_t pool;
};

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

// Decode: what happens to each chunk.
enum : uint8_t
{
    kChunkRaw = 0,
    kChunkCompressed = 1,
    kChunkSkip = 2,    // the page is not decoded
    kChunkKind = 3,    // the bits above
    kChunkInPlace = 4, // flag: the payload is read from the blob itself, not from its staged copy
};

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

/// Loads the encode / decode kernels now (at configure): with lazy module loading a first launch
/// can wait for work already queued on the device, and encode/decode must never wait.
cudaError_t preloadEncodeKernels() noexcept;
cudaError_t preloadDecodeKernels() noexcept;

/// encodePrepare over the batch's `total` chunks; the launch status.
cudaError_t launchEncodePrepare(EncodeArgs const& a, size_t total, cudaStream_t stream) noexcept;
/// After nvCOMP's compress: encodeLayout (per page, `pages`), encodeChunks (`chunkGrid` blocks
/// over `total` chunks) and encodeSeal (per page); the launch status.
cudaError_t launchEncodeFinish(
    EncodeArgs const& a, size_t pages, unsigned chunkGrid, size_t total, cudaStream_t stream) noexcept;
/// Before nvCOMP's decompress: decodeHeader (per page), decodeChunks (`chunkGrid` blocks over
/// `total` chunks) and decodeVerify (per page); the launch status.
cudaError_t launchDecodeFetch(
    DecodeArgs const& a, size_t pages, unsigned chunkGrid, size_t total, cudaStream_t stream) noexcept;
/// After nvCOMP's decompress: decodeScatter over the batch's `total` chunks; the launch status.
cudaError_t launchDecodeScatter(DecodeArgs const& a, size_t total, cudaStream_t stream) noexcept;

} // namespace kvcodec::nvcomp_plugin

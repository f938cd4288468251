// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codec_base.h"
#include "kvcodec/plugin.h"

namespace kvcodec::nvcomp_plugin {

/// The CPU reference, or null with `error` set when the algorithm has none.
IKvCacheColdPageCodec* createCpuCodec(CodecOptions const& options, std::string& error);

/// The CUDA implementation on `device`, or null with `error` set.
IKvCacheColdPageCodec* createCudaCodec(CodecOptions const& options, int device, std::string& error);

/// The factory of one algorithm (a static object).
KvcodecCodecFactory const* codecFactory(Algorithm algorithm) noexcept;

/// Host emulation of the GPU's segmented CRC-32C (for tests of the combination step).
uint32_t segmentedCrc32c(uint8_t const* data, uint64_t bytes, uint32_t threads);

/// Host emulation of the blob checksum as the GPU kernels compute it from pieces: `region` is a
/// blob from byte 32 on, `headerBytes` of codec header and chunk table (a multiple of 4) and
/// then each chunk's `stored` bytes zero padded to 16; chunks checksummed by `chunkThreads`
/// threads, pages combined by `pageThreads`. For tests of the combination steps.
uint32_t pieceCrc32c(uint8_t const* region, uint64_t headerBytes, std::vector<uint32_t> const& stored,
    uint32_t chunkThreads, uint32_t pageThreads);

/// Result of compressing and decompressing chunks with nvCOMP's batched API directly.
struct DirectResult
{
    uint64_t rawBytes = 0;
    uint64_t compressedBytes = 0;
    double compressMs = 0;   ///< Mean over iterations.
    double decompressMs = 0; ///< Mean over iterations.
    bool roundTripOk = false;
};

/// Cuts `bytes` at device address `data` into `chunkBytes` chunks and runs nvCOMP's batched
/// compress and decompress on them `iterations` times on `stream`, timed with CUDA events (the
/// benchmark's baseline). Throws std::runtime_error on failure.
DirectResult directBenchmark(Algorithm algorithm, uint32_t elementBytes, uintptr_t data, uint64_t bytes,
    uint64_t chunkBytes, int iterations, cudaStream_t stream);

/// Compresses `sizes[k]`-byte chunks, read back to back from device address `data`, in one
/// nvCOMP batch whose input padding, output buffers and temp memory are first filled with
/// `inFill`, `outFill` and `tempFill`; returns each compressed chunk (its reported size). For
/// tests of what nvCOMP's output depends on. Throws std::runtime_error on failure.
std::vector<std::string> compressChunksForTest(Algorithm algorithm, uint32_t elementBytes, uintptr_t data,
    std::vector<uint64_t> const& sizes, uint8_t inFill, uint8_t outFill, uint8_t tempFill);

} // namespace kvcodec::nvcomp_plugin

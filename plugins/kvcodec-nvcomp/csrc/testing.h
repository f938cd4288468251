// SPDX-License-Identifier: Apache-2.0
//
// Test and benchmark hooks of kvcodec_nvcomp._ext, kept out of the codec's sources: host
// emulations of the kernels' CRC steps and the workspace plan (testing.cpp), and nvCOMP run
// directly on device memory (bench_hooks.cu).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "format.h"
#include "workspace.h"

namespace pybind11 {
class module_;
}

namespace kvcodec::nvcomp_plugin {

/// Host emulation of the GPU's segmented CRC-32C (for tests of the combination step).
uint32_t segmentedCrc32c(uint8_t const* data, uint64_t bytes, uint32_t threads);

/// Host emulation of the blob checksum as the GPU kernels compute it from pieces: `region` is a
/// blob from byte 32 on, `headerBytes` of codec header and chunk table (a multiple of 4) and
/// then each chunk's `stored` bytes zero padded to 16; chunks checksummed by `chunkThreads`
/// threads, pages combined by `pageThreads`. For tests of the combination steps.
uint32_t pieceCrc32c(uint8_t const* region, uint64_t headerBytes, std::vector<uint32_t> const& stored,
    uint32_t chunkThreads, uint32_t pageThreads);

/// The plan the CUDA implementation would make for pools of `slotBytes[g][p]` bytes with
/// `numSlots[g]` slots per group (pool bases taken as 4 KiB aligned). Needs no device. Returns
/// false with `error` set when the parameters or the layout are rejected.
bool probeWorkspace(Algorithm algorithm, char const* paramsJson, std::vector<std::vector<uint64_t>> const& slotBytes,
    std::vector<uint64_t> const& numSlots, WorkspacePlan& out, std::string& error);

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

/// Adds the hooks above (and the CPU reference's LZ4 block coder) to the extension module.
void addTestHooks(pybind11::module_& m);

} // namespace kvcodec::nvcomp_plugin

// SPDX-License-Identifier: Apache-2.0
//
// What the CUDA kernel sees of a lifecycle: one plain entry per buffer, and the launch.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "fp8_format.h"
#include "kvcodec/codec.h"

namespace kvcodec::fp8 {

/// Bytes of a lossless buffer one warp copies per work unit.
inline constexpr uint64_t kCopyUnitBytes = 2048;

/// Compiled kernel variants (the `kernel` parameter). Every variant writes the same blob bytes;
/// they differ only in occupancy and in how many hot bytes a lane keeps in flight.
struct KernelVariant
{
    char const* name;
    int blocksPerSm;  ///< __launch_bounds__ minimum resident blocks (256 threads each).
    int laneBytes;    ///< Hot bytes of vector accesses a lane loads before it reduces them.
    bool tunable;     ///< Blocks larger than the register cache are streamed in batches of
                      ///< laneBytes per lane (v1: one access per lane at a time), and the
                      ///< small_blocks / finite_check parameters apply (v1: fixed).
};

inline constexpr KernelVariant kKernelVariants[] = {
    {"v1", 2, 128, false}, // the original kernel (default)
    {"b2", 2, 128, true},
    {"b4", 4, 64, true},
};
inline constexpr int kNumKernelVariants = int(sizeof(kKernelVariants) / sizeof(kKernelVariants[0]));

/// Accesses a lane caches between the amax and the quantize pass: laneBytes of 16-element
/// vectors (at least one), or 4 single elements on the scalar path.
constexpr uint32_t cachedAccesses(int laneBytes, uint32_t dtypeBytes, bool vector)
{
    return vector ? (uint32_t(laneBytes) / (16u * dtypeBytes) > 0 ? uint32_t(laneBytes) / (16u * dtypeBytes) : 1u) : 4u;
}

/// One buffer of a lifecycle, as planned at configure time (see fp8_plan.h for the rules).
struct BufferPlan
{
    uint32_t quantized; ///< 1: fp8 codes + scales; 0: lossless copy.
    uint32_t dtype;     ///< kvcodec::DataType of the hot buffer.
    uint32_t vector;    ///< 1: 16-element vectors are aligned and stay inside one block row.
    uint32_t groupLanes;   ///< Lanes of a warp working on one scale block (power of two <= 32).
    uint32_t rounds;       ///< Rounds of 32/groupLanes blocks per work unit (> 1 only when
                           ///< every lane has at most one access per block: one access per round).
    uint32_t hotAligned;   ///< 1: every hot element is aligned to its size in every slot, so the
                           ///< element path moves it with one 2- or 4-byte access; 0 (an odd slot
                           ///< size or offset, e.g. a packed slot with odd padding): byte accesses.
    uint64_t poolBase;     ///< Hot pool base address.
    uint64_t slotBytes;    ///< Hot pool slot size.
    uint64_t hotOffset;    ///< Byte offset of the buffer inside the slot.
    uint64_t bytes;        ///< Hot bytes of the buffer.
    uint64_t elems;        ///< Elements (quantized buffers).
    uint64_t numBlocks;    ///< Scale blocks per page.
    uint64_t blockElems;   ///< Elements per scale block.
    uint64_t rowElems;     ///< Contiguous elements per row of a block.
    uint64_t rowStride;    ///< Elements between rows of a block.
    uint64_t blockStride;  ///< Elements between the first elements of consecutive blocks.
    uint64_t dataOffset;   ///< Blob offset of the codes (or of the lossless bytes).
    uint64_t scaleOffset;  ///< Blob offset of the scales (quantized buffers).
    uint64_t dataEnd;      ///< End of the codes / lossless bytes (padding starts here).
    uint64_t scaleEnd;     ///< End of the scales (quantized buffers; padding starts here).
    uint64_t regionEnd;    ///< End of the buffer's regions, padding included.
    uint64_t firstUnit;    ///< Index of the buffer's first warp work unit inside a page.
    uint64_t units;        ///< Warp work units of the buffer per page.
};

struct KernelArgs
{
    BufferPlan const* buffers; ///< Device array.
    uint32_t numBuffers;
    uint32_t encode;           ///< 1: hot -> blob, 0: blob -> hot.
    uint32_t format;           ///< Format.
    uint32_t scalarOnly;       ///< 1: the cold base is not 16-byte aligned; no vector access.
    uint32_t variant;          ///< Index into kKernelVariants.
    uint32_t blockFinite;      ///< 1: check for NaN/Inf once per block (finite_check=block).
    uint64_t unitsPerPage;
    uint64_t coldPageBytes;
    uint64_t numHotSlots;      ///< Pairs with a hot index outside [0, numHotSlots) are skipped.
    PageIndexPair const* pairs; ///< Device array.
    uint64_t numPairs;
    uint64_t blob;             ///< Cold base (GPU-accessible).
};

/// Loads every kernel instance now: with lazy module loading the first launch can wait for work
/// already queued on the device, and an encode/decode call must never wait.
cudaError_t preloadFp8() noexcept;

/// Enqueues the one kernel of an encode or decode call on `stream`; returns the launch status.
cudaError_t launchFp8(KernelArgs const& args, int numSms, cudaStream_t stream) noexcept;

} // namespace kvcodec::fp8

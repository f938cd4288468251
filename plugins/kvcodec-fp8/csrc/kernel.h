// SPDX-License-Identifier: Apache-2.0
//
// What the CUDA kernel sees of a lifecycle: one plain entry per buffer, and the launch.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "format.h"
#include "kvcodec/codec.h"

namespace kvcodec::fp8 {

/// Bytes of a lossless buffer one warp copies per work unit.
inline constexpr uint64_t kCopyUnitBytes = 2048;

/// Compiled kernel variants (the `kernel` parameter). Every variant writes the same blob bytes;
/// they differ only in occupancy and in how many hot bytes a lane keeps in flight.
struct KernelVariant
{
    char const* name;
    int blocksPerSm; ///< __launch_bounds__ minimum resident blocks (256 threads each).
    int laneBytes;   ///< Hot bytes of vector accesses a lane loads before it reduces them.
    bool tunable;    ///< Blocks larger than the register cache are streamed in batches of
                     ///< laneBytes per lane (v1: one access per lane at a time), and the
                     ///< small_blocks / finite_check parameters apply (v1: fixed).
    bool tiled;      ///< CTA tiles: one thread block per tile of whole scale blocks staged in
                     ///< shared memory (see plan.h, planTiles); other buffers take the
                     ///< warp units of this variant's laneBytes, eight per thread block.
};

inline constexpr KernelVariant kKernelVariants[] = {
    {"v1", 2, 128, false, false}, // the original kernel (default)
    {"b2", 2, 128, true, false},
    {"b4", 4, 64, true, false},
    {"tile", 3, 64, true, true},
};
inline constexpr int kNumKernelVariants = int(sizeof(kKernelVariants) / sizeof(kKernelVariants[0]));

/// kernel=auto (the default) runs b4 for encodes into device memory, where it is fastest, and
/// the tile variant for decodes and for encodes into host memory, where tile's long contiguous
/// runs win, whenever the tile variant tiles every quantized buffer (docs/fp8.md, Performance).
inline constexpr uint32_t kAutoBaseVariant = 2;
/// The tile variant (the tile kernel's launch bounds and auto's per-call choice).
inline constexpr uint32_t kTileVariant = 3;
static_assert(
    !kKernelVariants[kAutoBaseVariant].tiled && kKernelVariants[kAutoBaseVariant].tunable, "auto's base is b4");
static_assert(kKernelVariants[kTileVariant].tiled, "kTileVariant names the tile variant");

/// Threads of one thread block (all variants).
inline constexpr uint32_t kBlockThreads = 256;

/// Warp units of a non-tiled buffer one thread block takes under the tile variant (its warps).
inline constexpr uint64_t kWarpsPerCta = kBlockThreads / 32;

/// Shared memory per scale block of a tile besides its hot bytes: the amax (later the
/// reciprocal of the scale) and the non-finite flag, 4 bytes each.
inline constexpr uint64_t kTileMetaBytes = 8;

/// Largest tile budget: 96 KiB of hot bytes and metadata per thread block (docs/fp8.md).
inline constexpr uint64_t kMaxTileBudget = 96 * 1024;

/// Shared memory of one tile (encode): its hot bytes, then the per-block metadata.
constexpr uint64_t tileEncodeSmem(uint64_t blocks, uint64_t blockBytes)
{
    return blocks * (blockBytes + kTileMetaBytes);
}

/// Shared memory of one tile (decode): its fp32 scales.
constexpr uint64_t tileDecodeSmem(uint64_t blocks)
{
    return 4 * blocks;
}

/// The tile budget of a device: the largest tile that still lets two thread blocks share an SM
/// (one loads while the other quantizes), at most kMaxTileBudget and at most what one block may
/// opt in to, rounded down to 1 KiB. 0 when not even that fits (no tiles).
constexpr uint64_t tileBudget(uint64_t smemPerSm, uint64_t smemOptinPerBlock, uint64_t reservedPerBlock)
{
    uint64_t const half = smemPerSm / 2 > reservedPerBlock ? smemPerSm / 2 - reservedPerBlock : 0;
    uint64_t b = half < kMaxTileBudget ? half : kMaxTileBudget;
    b = b < smemOptinPerBlock ? b : smemOptinPerBlock;
    return b / 1024 * 1024;
}

/// H200 / H100 (sm_90: 228 KiB per SM, 227 KiB per block, 1 KiB reserved per block): the
/// budget the CPU-side plan uses when no device is given.
inline constexpr uint64_t kDefaultTileBudget = tileBudget(228 * 1024, 227 * 1024, 1024);
static_assert(kDefaultTileBudget == kMaxTileBudget, "sm_90 takes the full tile budget");

/// Accesses a lane caches between the amax and the quantize pass: laneBytes of 16-element
/// vectors (at least one), or 4 single elements on the scalar path.
constexpr uint32_t cachedAccesses(int laneBytes, uint32_t dtypeBytes, bool vector)
{
    return vector ? (uint32_t(laneBytes) / (16u * dtypeBytes) > 0 ? uint32_t(laneBytes) / (16u * dtypeBytes) : 1u) : 4u;
}

/// One buffer of a lifecycle, as planned at configure time (see plan.h for the rules).
struct BufferPlan
{
    uint32_t quantized;   ///< 1: fp8 codes + scales; 0: lossless copy.
    uint32_t dtype;       ///< kvcodec::DataType of the hot buffer.
    uint32_t vector;      ///< 1: 16-element vectors are aligned and stay inside one block row.
    uint32_t groupLanes;  ///< Lanes of a warp working on one scale block (power of two <= 32).
    uint32_t rounds;      ///< Rounds of 32/groupLanes blocks per work unit (> 1 only when
                          ///< every lane has at most one access per block: one access per round).
    uint32_t hotAligned;  ///< 1: every hot element is aligned to its size in every slot, so the
                          ///< element path moves it with one 2- or 4-byte access; 0 (an odd slot
                          ///< size or offset, e.g. a packed slot with odd padding): byte accesses.
    uint64_t poolBase;    ///< Hot pool base address.
    uint64_t slotBytes;   ///< Hot pool slot size.
    uint64_t hotOffset;   ///< Byte offset of the buffer inside the slot.
    uint64_t bytes;       ///< Hot bytes of the buffer.
    uint64_t elems;       ///< Elements (quantized buffers).
    uint64_t numBlocks;   ///< Scale blocks per page.
    uint64_t blockElems;  ///< Elements per scale block.
    uint64_t rowElems;    ///< Contiguous elements per row of a block.
    uint64_t rowStride;   ///< Elements between rows of a block.
    uint64_t blockStride; ///< Elements between the first elements of consecutive blocks.
    uint64_t dataOffset;  ///< Blob offset of the codes (or of the lossless bytes).
    uint64_t scaleOffset; ///< Blob offset of the scales (quantized buffers).
    uint64_t dataEnd;     ///< End of the codes / lossless bytes (padding starts here).
    uint64_t scaleEnd;    ///< End of the scales (quantized buffers; padding starts here).
    uint64_t regionEnd;   ///< End of the buffer's regions, padding included.
    uint64_t firstUnit;   ///< Index of the buffer's first work unit inside a page.
    uint64_t units;       ///< Work units of the buffer per page: warp units, except under the
                          ///< tile variant, whose units are thread blocks: one per tile of a
                          ///< tiled buffer, kWarpsPerCta warp units of any other buffer.
    uint64_t warpUnits;   ///< Warp units of the buffer per page (its split without tiles).
    uint64_t tileBlocks;  ///< Scale blocks per tile (the last tile may have fewer); 0: the
                          ///< buffer is not tiled.
};

struct KernelArgs
{
    BufferPlan const* buffers; ///< Device array.
    uint32_t numBuffers;
    uint32_t encode;      ///< 1: hot -> blob, 0: blob -> hot.
    uint32_t format;      ///< Format.
    uint32_t scalarOnly;  ///< 1: the cold base is not 16-byte aligned; no vector access.
    uint32_t variant;     ///< Index into kKernelVariants.
    uint32_t blockFinite; ///< 1: check for NaN/Inf once per block (finite_check=block).
    uint64_t unitsPerPage;
    uint64_t coldPageBytes;
    uint64_t numHotSlots;       ///< Pairs with a hot index outside [0, numHotSlots) are skipped.
    PageIndexPair const* pairs; ///< Device array.
    uint64_t numPairs;
    uint64_t blob;         ///< Cold base (GPU-accessible).
    uint32_t tileSmem;     ///< Tile variant: dynamic shared memory per thread block.
    uint32_t tileResident; ///< Tile variant: resident thread blocks per SM with tileSmem.
};

/// Tile variant: sets the kernels' dynamic shared memory limit to `budget` on the current
/// device and returns how many thread blocks with `smem` bytes fit on one SM.
cudaError_t prepareTileKernel(bool encode, uint64_t budget, uint32_t smem, int* residentPerSm) noexcept;

/// Loads every kernel instance now: with lazy module loading the first launch can wait for work
/// already queued on the device, and an encode/decode call must never wait.
cudaError_t preloadFp8() noexcept;

/// Enqueues the one kernel of an encode or decode call on `stream`; returns the launch status.
cudaError_t launchFp8(KernelArgs const& args, int numSms, cudaStream_t stream) noexcept;

// The tile variant's kernels (kernel_tile.cu), for launchFp8 and preloadFp8 (kernel.cu).

/// Enqueues the tile kernel of a call of `total` work units (thread blocks) on `stream`.
void launchTileKernel(KernelArgs const& args, uint64_t total, int numSms, cudaStream_t stream) noexcept;

/// Loads both directions of the tile kernel now (see preloadFp8).
cudaError_t preloadTileKernel() noexcept;

} // namespace kvcodec::fp8

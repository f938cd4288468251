// SPDX-License-Identifier: Apache-2.0
//
// nvfp4: a kvcodec cold-page codec storing bf16/fp16 K and V buffers as NVFP4 (4-bit e2m1 values,
// an e4m3 scale per 16 consecutive elements along head_dim, an fp32 scale per (page, head) or per
// page); every other buffer is copied losslessly into the same fixed-size blob.
//
// Blob format, version 1 (one format for the CUDA kernel and the CPU reference; offsets from the
// blob start, little-endian). For each buffer of the lifecycle, in LifeCycleDesc order:
//
//   quantized buffer (role K, V or K-and-V, dtype bf16/fp16, tokens T, heads H, head dim D all set, neither
//   its role in lossless_roles nor its layer in lossless_layers); rows r = t*H + h in hot order,
//   B = ceil(D / 16) blocks per row, block j of a row = elements [16j, min(16j + 16, D)):
//     codes         : T*H rows of ceil(D / 2) bytes; element i of a row in byte i / 2, the low
//                     nibble for even i (a row's odd last nibble is 0); then zeros to a multiple of 16
//     block scales  : T*H*B e4m3fn codes, index r*B + j; then zeros to a multiple of 16
//     global scales : G little-endian fp32 scales S (granularity page_head: G = H, index h, the
//                     group of head h is every row of that head; page: G = 1, every row); then
//                     zeros to a multiple of 16
//   lossless buffer (everything else): its hot bytes verbatim; then zeros to a multiple of 16
//
// A lifecycle that declares no buffers is stored as one lossless buffer per pool (the whole slot).
// The cold page size is the end of the last region. The arithmetic of a block is in format.h.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include <kvcodec/codec_base.h>
#include <kvcodec/quantization.h>

#include "format.h"

namespace nvfp4_codec {

inline constexpr uint32_t kFormatVersion = 1;

/// Alignment of every region of a blob.
inline constexpr uint64_t kRegionAlign = 16;

/// Bytes of a lossless buffer copied by one work item.
inline constexpr uint64_t kCopyChunkBytes = 8192;

/// The most fp32 scales per page a quantized buffer may have for the kernel's whole-buffer path.
inline constexpr uint32_t kMaxWholeBufferGroups = 256;

/// The largest whole buffer the kernel's staged path takes (its hot bytes, staged twice in
/// shared memory): larger whole buffers take the register path (kernel.cu).
inline constexpr uint64_t kMaxStagedBytes = 64 * 1024;

/// The largest group (the hot bytes under one fp32 scale) the warp-staged encoder takes: each warp
/// stages its group and the next in shared memory (kernel_warp_staged.cuh). Lifecycles with larger groups
/// keep the warp encoder that holds a group in registers.
inline constexpr uint32_t kMaxWarpStagedGroupBytes = 4096;

/// Division of a 31-bit numerator by a fixed divisor d, as one multiply-high and a shift: mul =
/// ceil(2^(32 + shift) / d) with shift = floor(log2 d), or mul 0 and a plain shift when d is a
/// power of two. Exact for numerators below 2^31 (the kernel's block indices; plan.cpp).
struct FastDiv
{
    uint32_t mul = 0;
    uint32_t shift = 0;
};

FastDiv fastDiv(uint32_t d);

enum class Granularity : uint32_t
{
    kPageHead = 0, ///< One fp32 scale per head of the page.
    kPage = 1,     ///< One fp32 scale per buffer and page.
};

struct Params : kvcodec::LosslessPolicy
{
    Granularity granularity = Granularity::kPageHead;

    void read(kvcodec::ParamReader& r); ///< Reads the values plugin.py's schema validated.
};

/// Where one buffer of a lifecycle lies in the hot slots and in the blob. Trivially copyable: the
/// CUDA kernel gets a device copy of a lifecycle's table.
struct BufferPlan
{
    uint32_t quantized; ///< 1: NVFP4; 0: lossless copy.
    uint32_t bf16;      ///< Quantized buffers: 1 bf16, 0 fp16.
    uint32_t tokens;
    uint32_t heads;
    uint32_t headDim;
    uint32_t blocksPerRow; ///< ceil(headDim / 16).
    uint32_t rowCodeBytes; ///< ceil(headDim / 2).
    uint32_t groups;       ///< fp32 scales per page: heads (page_head) or 1 (page).
    uint32_t wholeBuffer;  ///< Quantized: 1 when one work item takes the whole buffer (see plan.cpp).
    uint32_t staged;       ///< Whole buffers of at most kMaxStagedBytes: the staged path's.
    FastDiv rowDiv;        ///< Division by blocksPerRow.
    FastDiv headDiv;       ///< Division by heads.
    uintptr_t poolBase;
    uint64_t slotBytes;
    uint64_t hotOffset;  ///< Byte offset of the buffer in a slot.
    uint64_t bytes;      ///< Hot bytes of the buffer.
    uint64_t dataOffset; ///< Blob offset of the codes (quantized) or of the copied bytes.
    uint64_t dataEnd;    ///< End of the codes or of the copied bytes (padding follows).
    uint64_t blockScaleOffset;
    uint64_t globalScaleOffset;
    uint64_t regionEnd;      ///< End of the buffer's last region (a multiple of 16).
    uint64_t firstItem;      ///< Index of the buffer's first work item within a page.
    uint64_t items;          ///< Quantized: 1 (wholeBuffer) or `groups`; lossless: 8 KiB chunks.
    uint64_t blocksPerGroup; ///< Quantized: blocks under one fp32 scale.
};

/// Dynamic shared memory of the staged encoder for one lifecycle (zero sizes: the register
/// path): two stages of hot bytes and the blob regions being built.
struct StagedShape
{
    uint32_t hotBytes = 0;    ///< The largest staged buffer's hot bytes.
    uint32_t regionBytes = 0; ///< The largest staged buffer's blob regions.
    uint32_t stages = 2;      ///< Hot buffers held at once (kernel.cu's kStages).

    uint32_t sharedBytes() const
    {
        return stages * hotBytes + regionBytes;
    }
};

/// The plan of one lifecycle: its buffers and the blob size.
struct LifeCyclePlan
{
    std::vector<BufferPlan> buffers;
    uint64_t coldPageBytes = 0;
    uint64_t itemsPerPage = 0;
    StagedShape staged;        ///< Set when every whole buffer is staged (else all zero).
    int stagedBlocksPerSm = 0; ///< Resident thread blocks of the staged encoder (0: not used).
    /// The warp kernels' table (kernel_warp.cuh): `buffers` with one work item per group, set when
    /// every buffer is a quantized whole buffer with a scale per head (else empty).
    std::vector<BufferPlan> warpBuffers;
    uint64_t warpItemsPerPage = 0;
    uint64_t warpGroupBytes = 0; ///< The largest group's hot bytes among `warpBuffers`.
};

/// True when the codec quantizes `b` under `p` (see the blob format above).
bool quantizes(kvcodec::BufferDesc const& b, Params const& p);

/// Plans the blob of `lc`; returns an error message or an empty string.
std::string planLifeCycle(kvcodec::HotLayout const& layout, kvcodec::HotLayout::LifeCycle const& lc,
    Params const& params, LifeCyclePlan& out);

/// Row r and block j of block k of group g of a quantized buffer (both granularities).
NVFP4_HD void blockPosition(BufferPlan const& b, uint64_t g, uint64_t k, uint64_t& row, uint32_t& j)
{
    uint64_t const rowInGroup = k / b.blocksPerRow;
    j = uint32_t(k - rowInGroup * b.blocksPerRow);
    row = b.groups == 1 ? rowInGroup : rowInGroup * b.heads + g;
}

/// Encodes or decodes the buffers of one page on the host (the CPU reference).
void encodePageCpu(LifeCyclePlan const& plan, uint64_t hotSlot, uint8_t* blob);
void decodePageCpu(LifeCyclePlan const& plan, uint64_t hotSlot, uint8_t const* blob);

struct KernelArgs
{
    BufferPlan const* buffers; ///< Device array: the lifecycle's plan.
    uint32_t numBuffers;
    uint32_t encode;
    uint64_t itemsPerPage;
    FastDiv itemsDiv; ///< Division by itemsPerPage (launchKernel sets it).
    uint64_t coldPageBytes;
    uint64_t numHotSlots;
    uint64_t numPairs;
    uintptr_t blob;
    kvcodec::PageIndexPair const* pairs; ///< Device page indices.
    StagedShape staged;                  ///< Encoding: the staged encoder's shared memory.
    int stagedBlocksPerSm;               ///< Encoding with the staged encoder: its thread blocks per multiprocessor.
    uint32_t warpPath;                   ///< 1: the warp kernels (`buffers` is the warp table: items are groups).
    uint32_t warpStaged;                 ///< Encoding on the warp path: every group fits kMaxWarpStagedGroupBytes.
};

/// Loads the kernel now (at configure): with lazy module loading a first launch can wait for
/// work already queued on the device, and encode/decode must never wait.
cudaError_t preloadKernel() noexcept;

/// The staged encoder's stages (kernel.cu).
uint32_t stagedStages() noexcept;

/// Readies the staged encoder for `sharedBytes` of dynamic shared memory and returns how many of
/// its thread blocks a multiprocessor holds (0: it does not fit).
cudaError_t stagedOccupancy(uint32_t sharedBytes, int& blocksPerSm) noexcept;

/// Enqueues one launch on `stream` covering every (page, work item) of `args`.
cudaError_t launchKernel(KernelArgs const& args, int numSms, cudaStream_t stream) noexcept;

/// The codec's factory (its PyCapsule is what the Python plugin registers).
KvcodecCodecFactory const* codecFactory() noexcept;

} // namespace nvfp4_codec

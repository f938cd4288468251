// SPDX-License-Identifier: Apache-2.0
//
// Host-side planning shared by both implementations: per lifecycle, which buffers are quantized
// and where each region lies in the blob.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "codec.h"
#include "format.h"
#include "kernel.h"
#include "kvcodec/layout.h"
#include "kvcodec/quantization.h"

namespace kvcodec::fp8 {

/// The blob plan of one lifecycle.
struct LifeCyclePlan
{
    std::vector<BufferPlan> buffers;
    uint64_t coldPageBytes = 0;
    uint64_t unitsPerPage = 0;
    uint64_t tileEncodeSmem = 0; ///< Tile variant: largest encode tile's shared memory (0: no tile).
    uint64_t tileDecodeSmem = 0; ///< Tile variant: largest decode tile's shared memory.
};

/// True when the policy quantizes a buffer (K, V or K-and-V role, float dtype, shaped, not excluded).
inline bool quantizes(BufferDesc const& b, Fp8Params const& p)
{
    bool const floatType
        = b.dtype == DataType::kBFloat16 || b.dtype == DataType::kFloat16 || b.dtype == DataType::kFloat32;
    return floatType && quantizableKv(b, p);
}

inline uint32_t nextPow2(uint64_t v)
{
    uint32_t p = 1;
    while (p < v && p < 32)
    {
        p <<= 1;
    }
    return p;
}

/// Scale blocks per tile of a quantized buffer under the tile variant, 0 when the buffer takes
/// the warp units instead. A tile is a run of whole scale blocks of one (page, buffer); it needs
/// the vector path (16-byte aligned rows of a multiple of 16 elements in every slot, so the
/// tile's hot bytes and codes move as aligned 16-byte pieces) and at least one block that fits
/// `budget` with its metadata. The blocks are split into as few tiles as the budget allows, of
/// equal size but the last (ceil(numBlocks / tiles) each): one tile per page when the buffer
/// fits, so page_head writes every head's codes of a token row together.
inline uint64_t planTileBlocks(BufferPlan const& b, uint64_t budget)
{
    if (!b.quantized || !b.vector)
    {
        return 0;
    }
    uint64_t const blockBytes = b.blockElems * dataTypeBytes(DataType(b.dtype));
    uint64_t const fit = budget / (blockBytes + kTileMetaBytes);
    if (fit == 0)
    {
        return 0;
    }
    uint64_t const tiles = (b.numBlocks + fit - 1) / fit;
    return (b.numBlocks + tiles - 1) / tiles;
}

/// Plans the blob of `lc` (buffers in descriptor order; one lossless buffer per pool when the
/// lifecycle declares none) and its work units. `tileBudget`: shared memory bytes a tile may
/// use (the device's tileBudget(); only the tile variant reads it). Returns an error message or
/// an empty string.
inline std::string planLifeCycle(HotLayout const& layout, HotLayout::LifeCycle const& lc, Fp8Params const& params,
    LifeCyclePlan& out, uint64_t tileBudget = kDefaultTileBudget)
{
    auto const& group = layout.groups()[lc.group];
    std::vector<BufferDesc> buffers;
    std::string error
        = quantizationBuffers(layout, lc, [&](BufferDesc const& b) { return quantizes(b, params); }, buffers);
    if (!error.empty())
    {
        return error;
    }
    out = {};
    uint64_t off = 0;
    uint64_t unit = 0;
    for (BufferDesc const& b : buffers)
    {
        auto const& pool = group.pools[b.poolIndex];
        BufferPlan plan{};
        plan.quantized = quantizes(b, params) ? 1 : 0;
        plan.dtype = uint32_t(b.dtype);
        plan.poolBase = pool.base;
        plan.slotBytes = pool.slotBytes;
        plan.hotOffset = b.byteOffset;
        plan.bytes = b.bytes;
        plan.dataOffset = off;
        if (plan.quantized)
        {
            uint64_t const T = uint64_t(b.tokensPerPage), H = uint64_t(b.numHeads), D = uint64_t(b.headDim);
            plan.elems = T * H * D;
            switch (params.granularity)
            {
            case Granularity::kPageHead:
                plan.numBlocks = H, plan.blockElems = T * D, plan.rowElems = D, plan.rowStride = H * D,
                plan.blockStride = D;
                break;
            case Granularity::kTokenHead:
                plan.numBlocks = T * H, plan.blockElems = D, plan.rowElems = D, plan.rowStride = D,
                plan.blockStride = D;
                break;
            case Granularity::kPage:
                plan.numBlocks = 1, plan.blockElems = plan.elems, plan.rowElems = plan.elems,
                plan.rowStride = plan.elems, plan.blockStride = 0;
                break;
            }
            plan.dataEnd = off + plan.elems;
            plan.scaleOffset = alignUp(plan.dataEnd, kRegionAlign);
            plan.scaleEnd = plan.scaleOffset + 4 * plan.numBlocks;
            plan.regionEnd = alignUp(plan.scaleEnd, kRegionAlign);
            // Slot s of the buffer starts at base + byteOffset + s * slotBytes: both terms decide
            // the alignment of every slot, not only of slot 0.
            uint64_t const esize = dataTypeBytes(b.dtype);
            plan.hotAligned = ((pool.base + b.byteOffset) % esize == 0 && pool.slotBytes % esize == 0) ? 1 : 0;
            plan.vector
                = (plan.rowElems % 16 == 0 && (pool.base + b.byteOffset) % 16 == 0 && pool.slotBytes % 16 == 0) ? 1 : 0;
            uint64_t const vectorsPerBlock = plan.blockElems / (plan.vector ? 16 : 1);
            plan.groupLanes = nextPow2(vectorsPerBlock);
            // small_blocks=deep: when every lane holds at most one access of its block, a unit
            // takes as many rounds of blocks as the lane cache has accesses.
            plan.rounds = 1;
            if (params.deepSmallBlocks && vectorsPerBlock <= plan.groupLanes)
            {
                plan.rounds = cachedAccesses(
                    kKernelVariants[params.kernel].laneBytes, uint32_t(dataTypeBytes(b.dtype)), plan.vector != 0);
            }
            uint64_t const tilesPerUnit = 32 / plan.groupLanes * plan.rounds;
            plan.units = (plan.numBlocks + tilesPerUnit - 1) / tilesPerUnit;
        }
        else
        {
            plan.dataEnd = off + b.bytes;
            plan.regionEnd = alignUp(plan.dataEnd, kRegionAlign);
            plan.scaleOffset = plan.scaleEnd = plan.regionEnd;
            plan.groupLanes = 32;
            plan.units = (b.bytes + kCopyUnitBytes - 1) / kCopyUnitBytes;
        }
        plan.warpUnits = plan.units;
        plan.tileBlocks = 0;
        if (kKernelVariants[params.kernel].tiled)
        {
            plan.tileBlocks = planTileBlocks(plan, tileBudget);
            if (plan.tileBlocks > 0)
            {
                plan.units = (plan.numBlocks + plan.tileBlocks - 1) / plan.tileBlocks;
                uint64_t const blockBytes = plan.blockElems * dataTypeBytes(b.dtype);
                out.tileEncodeSmem = std::max(out.tileEncodeSmem, tileEncodeSmem(plan.tileBlocks, blockBytes));
                out.tileDecodeSmem = std::max(out.tileDecodeSmem, tileDecodeSmem(plan.tileBlocks));
            }
            else
            {
                plan.units = (plan.warpUnits + kWarpsPerCta - 1) / kWarpsPerCta;
            }
        }
        plan.firstUnit = unit;
        unit += plan.units;
        off = plan.regionEnd;
        out.buffers.push_back(plan);
    }
    out.coldPageBytes = off;
    out.unitsPerPage = unit;
    return {};
}

} // namespace kvcodec::fp8

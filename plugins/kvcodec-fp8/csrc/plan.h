// SPDX-License-Identifier: Apache-2.0
//
// Host-side planning shared by both implementations: the codec parameters and, per lifecycle,
// which buffers are quantized and where each region lies in the blob.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "format.h"
#include "kernel.h"
#include "kvcodec/layout.h"
#include "kvcodec/params.h"

namespace kvcodec::fp8 {

struct Fp8Params
{
    Format format = Format::kE4M3;
    Granularity granularity = Granularity::kPageHead;
    bool losslessKey = false;
    bool losslessValue = false;
    std::set<int64_t> losslessLayers;
    // Tuning knobs of the CUDA kernel: they never change a blob byte.
    bool autoKernel = true;     ///< kernel=auto: per call, `kernel` or the tile variant (docs/fp8.md).
    uint32_t kernel = kAutoBaseVariant; ///< Index into kKernelVariants (auto: its non-tile kernel).
    bool deepSmallBlocks = true; ///< small_blocks=deep: several rounds of small blocks per warp unit.
    bool blockFinite = true;    ///< finite_check=block.
};

namespace detail {

inline std::vector<std::string> splitList(std::string const& text)
{
    std::vector<std::string> out;
    std::string cur;
    for (char c : text + ",")
    {
        if (c == ',')
        {
            size_t b = cur.find_first_not_of(" \t");
            size_t e = cur.find_last_not_of(" \t");
            if (b != std::string::npos)
            {
                out.push_back(cur.substr(b, e - b + 1));
            }
            cur.clear();
        }
        else
        {
            cur.push_back(c);
        }
    }
    return out;
}

} // namespace detail

/// Reads and checks the parameter JSON (the Python spec validated it already; a native caller
/// gets the same errors).
inline bool parseFp8Params(char const* json, Fp8Params& out, std::string& error)
{
    CodecParams params;
    if (!params.parse(json, error))
    {
        return false;
    }
    for (auto const& [key, value] : params.values())
    {
        auto str = params.getString(key);
        if (key == "format")
        {
            if (str == std::string("e4m3")) out.format = Format::kE4M3;
            else if (str == std::string("e5m2")) out.format = Format::kE5M2;
            else
            {
                error = "fp8 parameter 'format' is " + value.text + "; valid values are 'e4m3', 'e5m2'";
                return false;
            }
        }
        else if (key == "granularity")
        {
            if (str == std::string("page_head")) out.granularity = Granularity::kPageHead;
            else if (str == std::string("token_head")) out.granularity = Granularity::kTokenHead;
            else if (str == std::string("page")) out.granularity = Granularity::kPage;
            else
            {
                error = "fp8 parameter 'granularity' is " + value.text
                    + "; valid values are 'page_head', 'token_head', 'page'";
                return false;
            }
        }
        else if (key == "lossless_roles")
        {
            if (!str)
            {
                error = "fp8 parameter 'lossless_roles' is " + value.text + "; it must be a string";
                return false;
            }
            for (auto const& role : detail::splitList(*str))
            {
                if (role == "key") out.losslessKey = true;
                else if (role == "value") out.losslessValue = true;
                else if (role != "other")
                {
                    error = "fp8 parameter 'lossless_roles' names '" + role
                        + "'; valid roles are 'key', 'value', 'other' (comma-separated)";
                    return false;
                }
            }
        }
        else if (key == "lossless_layers")
        {
            if (!str)
            {
                error = "fp8 parameter 'lossless_layers' is " + value.text + "; it must be a string";
                return false;
            }
            for (auto const& item : detail::splitList(*str))
            {
                bool digits = !item.empty() && item.size() <= 9
                    && std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; });
                if (!digits)
                {
                    error = "fp8 parameter 'lossless_layers' has the item '" + item
                        + "'; it must be comma-separated non-negative layer ids, e.g. '0,31'";
                    return false;
                }
                out.losslessLayers.insert(std::stoll(item));
            }
        }
        else if (key == "kernel")
        {
            bool found = str && *str == "auto";
            out.autoKernel = found;
            if (found) out.kernel = kAutoBaseVariant;
            std::string valid = "'auto'";
            for (int v = 0; v < kNumKernelVariants; ++v)
            {
                valid += std::string(", '") + kKernelVariants[v].name + "'";
                if (str && *str == kKernelVariants[v].name)
                {
                    out.kernel = uint32_t(v);
                    found = true;
                }
            }
            if (!found)
            {
                error = "fp8 parameter 'kernel' is " + value.text + "; valid values are " + valid;
                return false;
            }
        }
        else if (key == "small_blocks")
        {
            if (str == std::string("wide")) out.deepSmallBlocks = false;
            else if (str == std::string("deep")) out.deepSmallBlocks = true;
            else
            {
                error = "fp8 parameter 'small_blocks' is " + value.text + "; valid values are 'wide', 'deep'";
                return false;
            }
        }
        else if (key == "finite_check")
        {
            if (str == std::string("element")) out.blockFinite = false;
            else if (str == std::string("block")) out.blockFinite = true;
            else
            {
                error = "fp8 parameter 'finite_check' is " + value.text + "; valid values are 'element', 'block'";
                return false;
            }
        }
        else
        {
            error = "unknown fp8 parameter '" + key
                + "'; valid parameters are 'format', 'granularity', 'lossless_roles', 'lossless_layers', 'kernel', "
                  "'small_blocks', 'finite_check'";
            return false;
        }
    }
    if (!kKernelVariants[out.kernel].tunable && (out.deepSmallBlocks || out.blockFinite))
    {
        error = std::string("fp8 parameters small_blocks='") + (out.deepSmallBlocks ? "deep" : "wide")
            + "' and finite_check='" + (out.blockFinite ? "block" : "element") + "' need a tunable kernel; 'kernel' is '"
            + kKernelVariants[out.kernel].name
            + "' (use 'auto', 'b2', 'b4' or 'tile', or small_blocks='wide' and finite_check='element')";
        return false;
    }
    return true;
}

/// The blob plan of one lifecycle.
struct LifeCyclePlan
{
    std::vector<BufferPlan> buffers;
    uint64_t coldPageBytes = 0;
    uint64_t unitsPerPage = 0;
    uint64_t tileEncodeSmem = 0; ///< Tile variant: largest encode tile's shared memory (0: no tile).
    uint64_t tileDecodeSmem = 0; ///< Tile variant: largest decode tile's shared memory.
};

/// True when the policy quantizes a buffer (K or V role, float dtype, shaped, not excluded).
inline bool quantizes(BufferDesc const& b, Fp8Params const& p)
{
    bool const floatType = b.dtype == DataType::kBFloat16 || b.dtype == DataType::kFloat16 || b.dtype == DataType::kFloat32;
    bool const shaped = b.tokensPerPage > 0 && b.numHeads > 0 && b.headDim > 0;
    bool const role = (b.role == BufferRole::kKey && !p.losslessKey) || (b.role == BufferRole::kValue && !p.losslessValue);
    return floatType && shaped && role && p.losslessLayers.count(b.layerId) == 0;
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
    std::vector<BufferDesc> buffers = lc.buffers;
    if (buffers.empty())
    {
        for (size_t p = 0; p < group.pools.size(); ++p)
        {
            buffers.push_back({lc.id, BufferRole::kOther, int32_t(p), DataType::kUInt8, 0, group.pools[p].slotBytes, 0, 0, 0, 0});
        }
    }
    // A quantized buffer must not share hot bytes with another buffer: decode would write both.
    for (size_t i = 0; i < buffers.size(); ++i)
    {
        for (size_t j = i + 1; j < buffers.size(); ++j)
        {
            BufferDesc const& a = buffers[i];
            BufferDesc const& b = buffers[j];
            bool const overlap = a.poolIndex == b.poolIndex && a.byteOffset < b.byteOffset + b.bytes
                && b.byteOffset < a.byteOffset + a.bytes;
            if (overlap && (quantizes(a, params) || quantizes(b, params)))
            {
                return "lifecycle " + std::to_string(lc.id) + ": buffers[" + std::to_string(i) + "] and buffers["
                    + std::to_string(j) + "] overlap in pool " + std::to_string(a.poolIndex)
                    + " and one of them is quantized; a quantized buffer must not share hot bytes with another buffer";
            }
        }
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
                plan.numBlocks = H, plan.blockElems = T * D, plan.rowElems = D, plan.rowStride = H * D, plan.blockStride = D;
                break;
            case Granularity::kTokenHead:
                plan.numBlocks = T * H, plan.blockElems = D, plan.rowElems = D, plan.rowStride = D, plan.blockStride = D;
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
            plan.vector = (plan.rowElems % 16 == 0 && (pool.base + b.byteOffset) % 16 == 0 && pool.slotBytes % 16 == 0) ? 1 : 0;
            uint64_t const vectorsPerBlock = plan.blockElems / (plan.vector ? 16 : 1);
            plan.groupLanes = nextPow2(vectorsPerBlock);
            // small_blocks=deep: when every lane holds at most one access of its block, a unit
            // takes as many rounds of blocks as the lane cache has accesses.
            plan.rounds = 1;
            if (params.deepSmallBlocks && vectorsPerBlock <= plan.groupLanes)
            {
                plan.rounds = cachedAccesses(kKernelVariants[params.kernel].laneBytes,
                    uint32_t(dataTypeBytes(b.dtype)), plan.vector != 0);
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

/// True when two lifecycles' buffer lists are field-for-field identical (same encoding).
inline bool sameBuffers(std::vector<BufferDesc> const& a, std::vector<BufferDesc> const& b)
{
    if (a.size() != b.size())
    {
        return false;
    }
    for (size_t i = 0; i < a.size(); ++i)
    {
        BufferDesc const& x = a[i];
        BufferDesc const& y = b[i];
        if (x.layerId != y.layerId || x.role != y.role || x.poolIndex != y.poolIndex || x.dtype != y.dtype
            || x.byteOffset != y.byteOffset || x.bytes != y.bytes || x.tokensPerPage != y.tokensPerPage
            || x.numHeads != y.numHeads || x.headDim != y.headDim)
        {
            return false;
        }
    }
    return true;
}

} // namespace kvcodec::fp8

// SPDX-License-Identifier: Apache-2.0
//
// nvfp4: the blob plan of a lifecycle (shared by both implementations) and the CPU reference's
// page encode and decode. The arithmetic of a block is format.h's, the same functions the CUDA
// kernel calls.
#include <algorithm>
#include <cstring>

#include "codec.h"
#include "format.h"

namespace nvfp4_codec {
namespace {

uint64_t alignUp(uint64_t v)
{
    return (v + kRegionAlign - 1) / kRegionAlign * kRegionAlign;
}

uint16_t load16(uint8_t const* p)
{
    return uint16_t(p[0] | (p[1] << 8));
}

void store16(uint8_t* p, uint16_t v)
{
    p[0] = uint8_t(v);
    p[1] = uint8_t(v >> 8);
}

// Elements [first, first + n) of the buffer at `hot`, as fp32 bits.
void loadElements(uint8_t const* hot, uint64_t first, uint32_t n, bool bf16, uint32_t* u)
{
    for (uint32_t i = 0; i < n; ++i)
    {
        u[i] = floatBits(halfToFloat(load16(hot + 2 * (first + i)), bf16));
    }
}

// The largest finite magnitude of elements [first, first + n), read from the hot bits: finite
// halves order like their magnitude bits, so this is finiteAmax() of the converted elements
// without converting them.
float rawAmax(uint8_t const* hot, uint64_t first, uint64_t n, bool bf16)
{
    // A magnitude is finite when it is below the exponent mask (the smallest one with every
    // exponent bit set); non-finite ones count as 0, masked rather than selected so that the
    // loop vectorizes.
    uint16_t const expMask = bf16 ? 0x7F80u : 0x7C00u;
    uint16_t m = 0;
    for (uint64_t i = 0; i < n; ++i)
    {
        uint16_t const h = uint16_t(load16(hot + 2 * (first + i)) & 0x7FFFu);
        uint16_t const finite = uint16_t(h & -uint16_t(h < expMask));
        m = finite > m ? finite : m;
    }
    return halfToFloat(m, bf16);
}

// encodeBlock() for the CPU: the same block scale and thresholds, and each element's code as the
// number of thresholds its magnitude exceeds. The thresholds are sorted, so that count is what
// encodeElement()'s binary search finds; counted without branches, the loop vectorizes (the
// search's data-dependent branches mispredict on KV data). The comparisons are on the bits as
// signed integers, which order non-negative floats as their values do: a threshold is a
// non-negative float or, when the block scale is 0, NaN (0x7FC00000, above every magnitude that
// is not NaN, as `f > NaN` is false). NaN elements take code 0.
uint8_t encodeBlockCpu(uint32_t const* u, uint32_t n, float s, uint8_t* codes)
{
    uint8_t const sb = blockScaleCode(finiteAmax(u, n), s);
    float t[7];
    e2m1Thresholds(blockScale(sb, s), t);
    int32_t ti[7];
    for (int k = 0; k < 7; ++k)
    {
        ti[k] = int32_t(floatBits(t[k]) & 0x7FFFFFFFu);
    }
    uint8_t code[kBlockElems];
    for (uint32_t i = 0; i < kBlockElems; ++i)
    {
        int32_t const a = int32_t(u[i] & 0x7FFFFFFFu);
        int32_t const m
            = (a > ti[0]) + (a > ti[1]) + (a > ti[2]) + (a > ti[3]) + (a > ti[4]) + (a > ti[5]) + (a > ti[6]);
        int32_t const c = int32_t((u[i] >> 28) & 8u) | m;
        code[i] = uint8_t(a > 0x7F800000 ? 0 : c);
    }
    for (uint32_t i = 0; i < n; i += 2)
    {
        codes[i / 2] = uint8_t(code[i] | (i + 1 < n ? code[i + 1] << 4 : 0));
    }
    return sb;
}

} // namespace

FastDiv fastDiv(uint32_t d)
{
    FastDiv f;
    while ((uint64_t(2) << f.shift) <= d)
    {
        ++f.shift; // floor(log2 d)
    }
    if ((d & (d - 1)) != 0)
    {
        f.mul = uint32_t(((uint64_t(1) << (32 + f.shift)) + d - 1) / d);
    }
    return f;
}

bool quantizes(kvcodec::BufferDesc const& b, Params const& p)
{
    bool const half = b.dtype == kvcodec::DataType::kBFloat16 || b.dtype == kvcodec::DataType::kFloat16;
    return half && kvcodec::quantizableKv(b, p);
}

std::string planLifeCycle(
    kvcodec::HotLayout const& layout, kvcodec::HotLayout::LifeCycle const& lc, Params const& params, LifeCyclePlan& out)
{
    auto const& group = layout.groups()[lc.group];
    std::vector<kvcodec::BufferDesc> buffers;
    std::string error = kvcodec::quantizationBuffers(
        layout, lc, [&](kvcodec::BufferDesc const& b) { return quantizes(b, params); }, buffers);
    if (!error.empty())
    {
        return error;
    }
    out = {};
    uint64_t off = 0;
    for (auto const& b : buffers)
    {
        auto const& pool = group.pools[b.poolIndex];
        BufferPlan plan{};
        plan.quantized = quantizes(b, params) ? 1 : 0;
        plan.poolBase = pool.base;
        plan.slotBytes = pool.slotBytes;
        plan.hotOffset = b.byteOffset;
        plan.bytes = b.bytes;
        plan.dataOffset = off;
        plan.firstItem = out.itemsPerPage;
        if (plan.quantized)
        {
            plan.bf16 = b.dtype == kvcodec::DataType::kBFloat16 ? 1 : 0;
            plan.tokens = uint32_t(b.tokensPerPage);
            plan.heads = uint32_t(b.numHeads);
            plan.headDim = uint32_t(b.headDim);
            plan.blocksPerRow = (plan.headDim + kBlockElems - 1) / kBlockElems;
            plan.rowCodeBytes = (plan.headDim + 1) / 2;
            plan.groups = params.granularity == Granularity::kPageHead ? plan.heads : 1;
            uint64_t const rows = uint64_t(plan.tokens) * plan.heads;
            plan.blocksPerGroup = rows / plan.groups * plan.blocksPerRow;
            plan.dataEnd = off + rows * plan.rowCodeBytes;
            plan.blockScaleOffset = alignUp(plan.dataEnd);
            plan.globalScaleOffset = alignUp(plan.blockScaleOffset + rows * plan.blocksPerRow);
            plan.regionEnd = alignUp(plan.globalScaleOffset + 4 * uint64_t(plan.groups));
            // The kernel's fast path takes a whole buffer per work item (rows of whole 16-element
            // blocks, 16-byte aligned hot bytes, at most kMaxWholeBufferGroups scales): it reads
            // the buffer once and writes its regions as contiguous 16-byte stores. Other shapes
            // take one work item per fp32 scale.
            bool const aligned = (plan.poolBase + plan.hotOffset) % 16 == 0 && plan.slotBytes % 16 == 0;
            bool const small = rows * plan.blocksPerRow < (uint64_t(1) << 31); // 32-bit block indices
            plan.wholeBuffer
                = plan.headDim % kBlockElems == 0 && aligned && small && plan.groups <= kMaxWholeBufferGroups ? 1 : 0;
            plan.items = plan.wholeBuffer ? 1 : plan.groups;
            plan.staged = plan.wholeBuffer && plan.bytes <= kMaxStagedBytes ? 1 : 0;
            plan.rowDiv = fastDiv(plan.blocksPerRow);
            plan.headDiv = fastDiv(plan.heads);
        }
        else
        {
            plan.dataEnd = off + b.bytes;
            plan.blockScaleOffset = plan.globalScaleOffset = plan.regionEnd = alignUp(plan.dataEnd);
            plan.items = std::max<uint64_t>(1, (b.bytes + kCopyChunkBytes - 1) / kCopyChunkBytes);
        }
        off = plan.regionEnd;
        out.itemsPerPage += plan.items;
        out.buffers.push_back(plan);
    }
    out.coldPageBytes = off;
    // The warp kernels take a lifecycle of quantized whole buffers with a scale per head: a work
    // item per group.
    bool const warp = std::all_of(out.buffers.begin(), out.buffers.end(),
        [](BufferPlan const& b) { return b.quantized && b.wholeBuffer && b.groups > 1; });
    for (size_t i = 0; warp && i < out.buffers.size(); ++i)
    {
        BufferPlan b = out.buffers[i];
        b.firstItem = out.warpItemsPerPage;
        b.items = b.groups;
        out.warpItemsPerPage += b.items;
        out.warpGroupBytes = std::max<uint64_t>(out.warpGroupBytes, 32 * b.blocksPerGroup);
        out.warpBuffers.push_back(b);
    }
    // The staged kernels take the lifecycle when every whole buffer fits their stages.
    bool staged = true;
    StagedShape shape;
    for (auto const& b : out.buffers)
    {
        if (b.wholeBuffer)
        {
            staged = staged && b.staged;
            shape.hotBytes = std::max(shape.hotBytes, uint32_t(b.bytes));
            shape.regionBytes = std::max(shape.regionBytes, uint32_t(b.regionEnd - b.dataOffset));
        }
    }
    if (staged)
    {
        out.staged = shape;
    }
    return {};
}

void encodePageCpu(LifeCyclePlan const& plan, uint64_t hotSlot, uint8_t* blob)
{
    std::memset(blob, 0, plan.coldPageBytes); // padding and a row's odd last nibble are zero
    for (auto const& b : plan.buffers)
    {
        auto const* hot = reinterpret_cast<uint8_t const*>(b.poolBase + hotSlot * b.slotBytes + b.hotOffset);
        if (!b.quantized)
        {
            std::memcpy(blob + b.dataOffset, hot, b.bytes);
            continue;
        }
        bool const bf16 = b.bf16 != 0;
        uint32_t u[kBlockElems] = {}; // a short block's tail keeps earlier (ignored) elements
        for (uint64_t g = 0; g < b.groups; ++g)
        {
            float amax = 0.0f;
            if (b.groups == 1)
            {
                amax = rawAmax(hot, 0, uint64_t(b.tokens) * b.heads * b.headDim, bf16);
            }
            for (uint64_t t = 0; b.groups > 1 && t < b.tokens; ++t) // page_head: the rows of head g
            {
                amax = std::max(amax, rawAmax(hot, (t * b.heads + g) * b.headDim, b.headDim, bf16));
            }
            float const s = globalScale(amax);
            std::memcpy(blob + b.globalScaleOffset + 4 * g, &s, 4);
            // Block k of the group is block j of row blockPosition() names; walked row by row.
            for (uint64_t r = 0; r < b.blocksPerGroup / b.blocksPerRow; ++r)
            {
                uint64_t const row = b.groups == 1 ? r : r * b.heads + g;
                for (uint32_t j = 0; j < b.blocksPerRow; ++j)
                {
                    uint32_t const n = std::min(kBlockElems, b.headDim - kBlockElems * j);
                    loadElements(hot, row * b.headDim + kBlockElems * j, n, bf16, u);
                    uint8_t* codes = blob + b.dataOffset + row * b.rowCodeBytes + kBlockElems / 2 * j;
                    blob[b.blockScaleOffset + row * b.blocksPerRow + j] = encodeBlockCpu(u, n, s, codes);
                }
            }
        }
    }
}

void decodePageCpu(LifeCyclePlan const& plan, uint64_t hotSlot, uint8_t const* blob)
{
    for (auto const& b : plan.buffers)
    {
        auto* hot = reinterpret_cast<uint8_t*>(b.poolBase + hotSlot * b.slotBytes + b.hotOffset);
        if (!b.quantized)
        {
            std::memcpy(hot, blob + b.dataOffset, b.bytes);
            continue;
        }
        bool const bf16 = b.bf16 != 0;
        for (uint64_t g = 0; g < b.groups; ++g)
        {
            float s;
            std::memcpy(&s, blob + b.globalScaleOffset + 4 * g, 4);
            for (uint64_t r = 0; r < b.blocksPerGroup / b.blocksPerRow; ++r) // as in encodePageCpu
            {
                uint64_t const row = b.groups == 1 ? r : r * b.heads + g;
                for (uint32_t j = 0; j < b.blocksPerRow; ++j)
                {
                    uint32_t const n = std::min(kBlockElems, b.headDim - kBlockElems * j);
                    uint8_t const* codes = blob + b.dataOffset + row * b.rowCodeBytes + kBlockElems / 2 * j;
                    uint16_t out[kBlockElems];
                    decodeBlock(codes, n, blob[b.blockScaleOffset + row * b.blocksPerRow + j], s, bf16, out);
                    uint8_t* dst = hot + 2 * (row * b.headDim + kBlockElems * j);
                    for (uint32_t i = 0; i < n; ++i)
                    {
                        store16(dst + 2 * i, out[i]);
                    }
                }
            }
        }
    }
}

} // namespace nvfp4_codec

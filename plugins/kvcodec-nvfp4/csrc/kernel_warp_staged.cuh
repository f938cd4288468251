// SPDX-License-Identifier: Apache-2.0
//
// nvfp4: the warp-staged encoder (included by kernel.cu). It takes the warp kernels' lifecycles
// (kernel_warp.cuh) when encoding and every group fits kMaxWarpStagedGroupBytes (plan.cpp). One
// warp takes a group at a time and has two stages of shared memory: while it encodes one group,
// asynchronous copies bring in the next one's hot bytes, so a warp's loads never wait behind its
// own arithmetic, and the copies, which bypass L1, leave it to the plan.
//
// The encoder reads the staged group twice (its largest magnitude, then the codes). In the common
// case (every block of a lane finite, at a scale of at least 2^-100) a lane's blocks take
// straight-line code: hardware conversions for the e4m3 block scales, the thresholds of the
// upper half derived from the lower (bf16), and the element codes assembled with one select per
// bit (the ALU pipe is what bounds it). Other blocks take the general per-block code. The bytes
// are those of format.h's reference.
#pragma once

#include "kernel_warp.cuh"
#include "kvcodec/kernels.cuh"

namespace nvfp4_codec {
namespace {

/// e4m3Code() of a non-negative finite value: one conversion where the GPU has it (round to
/// nearest even, saturating at 448, as e4m3Code()).
__device__ __forceinline__ uint32_t e4m3CodeFast(float q)
{
#if __CUDA_ARCH__ >= 890
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(q)); // q in the low byte
    return r & 0xFFu;
#else
    return e4m3Code(q);
#endif
}

/// e4m3Value() of a code the codec writes (non-negative, below 0x7F): one conversion where the GPU
/// has it (every e4m3 value is an fp16 value, and every fp16 value an fp32 one).
__device__ __forceinline__ float e4m3ValueFast(uint32_t code)
{
#if __CUDA_ARCH__ >= 890
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(uint16_t(code)));
    return __half2float(__ushort_as_half(uint16_t(h)));
#else
    return e4m3Value(uint8_t(code));
#endif
}

/// The plan's fields a warp needs per block of its group, in registers (read through the plan's
/// reference they would be loaded again per block: the blob's stores may alias it).
struct WarpGroup
{
    uint32_t n;         ///< Blocks of the group: tokens * blocksPerRow.
    uint32_t perRow;    ///< blocksPerRow.
    uint32_t rowStride; ///< Blocks from one row of the buffer to the next: heads * blocksPerRow.
    uint32_t first;     ///< Index of the group's first block: g * blocksPerRow.
    FastDiv rowDiv;

    __device__ __forceinline__ WarpGroup(BufferPlan const& b, uint32_t g)
        : n(b.tokens * b.blocksPerRow)
        , perRow(b.blocksPerRow)
        , rowStride(b.heads * b.blocksPerRow)
        , first(g * b.blocksPerRow)
        , rowDiv(b.rowDiv)
    {
    }

    /// Index within the buffer of block k of the group (its k / blocksPerRow-th row's).
    __device__ __forceinline__ uint32_t index(uint32_t k) const
    {
        uint32_t const row = divide(k, rowDiv);
        return row * rowStride + first + (k - row * perRow);
    }
};

/// A threshold of e2m1Thresholds() rounded toward zero to the hot type (it is positive), in both
/// halves of a word.
template <bool kBf16>
__device__ __forceinline__ uint32_t packedThreshold(float t)
{
    if constexpr (kBf16)
    {
        return __byte_perm(floatBits(t), 0u, 0x3232u);
    }
    else
    {
        uint32_t h;
        asm("cvt.rz.f16x2.f32 %0, %1, %1;" : "=r"(h) : "f"(t));
        return h;
    }
}

/// The bits of a where `mask` has ones, the bits of b elsewhere: one lop3.
__device__ __forceinline__ uint32_t select(uint32_t mask, uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xCA;" : "=r"(d) : "r"(mask), "r"(a), "r"(b)); // (m & a) | (~m & b)
    return d;
}

/// Two elements' codes of the hot word w under the packed thresholds T (encodePair()'s search),
/// each where its sign bit is: element 0's code in bits 12-15, element 1's in bits 28-31 (the
/// other bits are left undefined). |w| is a half-precision multiply-add, off the ALU pipe.
template <bool kBf16>
__device__ __forceinline__ uint32_t encodePairHigh(uint32_t w, uint32_t const (&T)[7])
{
    using H2 = std::conditional_t<kBf16, __nv_bfloat162, __half2>;
    H2 const mag = __habs2(*reinterpret_cast<H2 const*>(&w));
    uint32_t m4, m2, m1;
    searchPair<kBf16>(*reinterpret_cast<uint32_t const*>(&mag), T, m4, m2, m1);
    // Bit 14 from m4, 13 from m2, 12 from m1, 15 from w (the sign); likewise 28-31. Three
    // selects, each one instruction (the compiler's own form of them takes four).
    uint32_t const x = select(0x40004000u, m4, m2);
    uint32_t const y = select(0x60006000u, x, m1);
    return select(0x80008000u, w, y);
}

/// The code word of four hot words (elements 2i and 2i + 1 in byte i's low and high nibbles) from
/// their encodePairHigh() results.
__device__ __forceinline__ uint32_t packPairsHigh(uint32_t z0, uint32_t z1, uint32_t z2, uint32_t z3)
{
    uint32_t const a = __byte_perm(z0, z1, 0x7351u); // bytes 1 and 3 of z0 and z1
    uint32_t const b = __byte_perm(z2, z3, 0x7351u);
    uint32_t const even = __byte_perm(a, b, 0x5410u); // byte i: element 2i's code in its top nibble
    uint32_t const odd = __byte_perm(a, b, 0x7632u);  // byte i: element 2i + 1's
    return ((even >> 4) & 0x0F0F0F0Fu) | (odd & 0xF0F0F0F0u);
}

/// encodeFinite() of a block whose effective scale is at least kMinFmaThresholdScale, without a
/// branch (so that a lane's blocks interleave), from its hot words as stagedBlock() read them (the
/// half `first` in w[0..3]; 0: block order).
template <bool kBf16>
__device__ __forceinline__ uint2 encodeScaled(uint32_t const (&w)[8], uint32_t first, float bs)
{
    uint32_t T[7];
    if constexpr (kBf16)
    {
        // t4, t5 and t6 are 2 t2, 2 t3 and 2 t4 exactly (their midpoints are twice t2's and t3's,
        // and a scale of at least 2^-100 keeps every value normal and finite): in bf16, one more
        // in the exponent field of both halves.
        float const d = __fmul_rn(bs, 0x1p-26f);
        auto below = [](float x) { return bitsFloat(floatBits(x) - 1u); };
        T[0] = packedThreshold<true>(__fmaf_rd(0.25f, bs, d));
        T[1] = packedThreshold<true>(below(__fmaf_ru(0.75f, bs, -2.0f * d)));
        T[2] = packedThreshold<true>(__fmaf_rd(1.25f, bs, 4.0f * d));
        T[3] = packedThreshold<true>(below(__fmaf_ru(1.75f, bs, -4.0f * d)));
        T[4] = T[2] + 0x00800080u;
        T[5] = T[3] + 0x00800080u;
        T[6] = T[4] + 0x00800080u;
    }
    else
    {
        float t[7];
        e2m1ThresholdsFma(bs, t);
#pragma unroll
        for (int i = 0; i < 7; ++i)
        {
            T[i] = packedThreshold<false>(t[i]);
        }
    }
    uint32_t out[2];
#pragma unroll
    for (int q = 0; q < 2; ++q)
    {
        out[q] = packPairsHigh(encodePairHigh<kBf16>(w[4 * q], T), encodePairHigh<kBf16>(w[4 * q + 1], T),
            encodePairHigh<kBf16>(w[4 * q + 2], T), encodePairHigh<kBf16>(w[4 * q + 3], T));
    }
    return first ? make_uint2(out[1], out[0]) : make_uint2(out[0], out[1]);
}

/// Codes and block scale of one block of a lane, block k of the group (k < n), the general way:
/// any magnitude, any scale. (encodeGroupWarp() writes the same lines out: called there, its
/// pointers spill the register encoder's 80 registers.)
template <bool kBf16>
__device__ __forceinline__ void encodeLaneBlock(
    uint32_t const (&w)[8], uint32_t raw, float s, uint32_t idx, uint2* codes, uint8_t* scales)
{
    uint32_t const expMask = kBf16 ? 0x7F80u : 0x7C00u;
    uint8_t sb;
    uint2 c;
    if (raw >= expMask)
    {
        uint3 const e = encodeSpecial(make_uint4(w[0], w[1], w[2], w[3]), make_uint4(w[4], w[5], w[6], w[7]), s, kBf16);
        c = make_uint2(e.x, e.y);
        sb = uint8_t(e.z);
    }
    else
    {
        sb = blockScaleCode(halfToFloat(uint16_t(raw), kBf16), s);
        c = encodeFinite<kBf16>(w, 0, blockScale(sb, s));
    }
    codes[idx] = c;
    scales[idx] = sb;
}

// ---- The warp-staged encoder: a group per warp, the next one copied in meanwhile -------------

#ifndef NVFP4_WARP_STAGED_BLOCKS_PER_SM
#define NVFP4_WARP_STAGED_BLOCKS_PER_SM 3
#endif
/// Shared memory of a thread block of the warp-staged encoder: two groups per warp.
constexpr uint32_t kWarpStagedSharedBytes = (kWarpThreads / 32) * 2 * kMaxWarpStagedGroupBytes;

/// Starts the asynchronous copy of group g of the item (hot bytes `hot`) into `stage` in group order
/// (block k at 32 k): consecutive lanes copy consecutive 16 bytes of a row of the group. Always
/// closes a group of copies (empty for an item out of range), so every loop turn commits one.
__device__ __forceinline__ bool stageWarpItem(
    KernelArgs const& a, uint64_t item, uint64_t total, uint8_t* stage, Item& it)
{
    bool const valid = item < total && resolveItem<true>(a, item, it);
    if (valid)
    {
        WarpGroup const grp(*it.b, uint32_t(it.sub));
        uint32_t const lane = threadIdx.x & 31u;
        if (grp.perRow <= 16 && (grp.perRow & (grp.perRow - 1)) == 0)
        {
            // Rows of 1 to 16 blocks: piece c + 32 of a lane lies 16 / perRow rows after piece c.
            uint8_t const* src = it.hot + 32ull * grp.index(lane >> 1) + 16 * (lane & 1u);
            uint64_t const step = 512ull / grp.perRow * grp.rowStride;
            uint32_t const pieces = 2 * grp.n;
#pragma unroll
            for (uint32_t m = 0; m < kMaxWarpStagedGroupBytes / 512; ++m, src += step)
            {
                if (pieces == kMaxWarpStagedGroupBytes / 16 || lane + 32 * m < pieces)
                {
                    kvcodec::copyAsync16(stage + 16 * lane + 512 * m, src);
                }
            }
        }
        else
        {
            for (uint32_t c = lane; c < 2 * grp.n; c += 32)
            {
                kvcodec::copyAsync16(stage + 16 * c, it.hot + (32ull * grp.index(c >> 1) + 16 * (c & 1u)));
            }
        }
    }
    kvcodec::copyAsyncCommit();
    return valid;
}

/// rawBlockMax() with packed half-precision maxima of magnitudes: the same bits (for non-negative
/// values the order of the bits is the order of the values; a NaN propagates as a NaN, above
/// every finite magnitude and infinity like rawBlockMax()'s).
template <bool kBf16>
__device__ __forceinline__ uint32_t rawBlockMaxPacked(uint32_t const (&w)[8])
{
    using H2 = std::conditional_t<kBf16, __nv_bfloat162, __half2>;
    auto h = [](uint32_t x) { return __habs2(*reinterpret_cast<H2 const*>(&x)); };
    H2 const a = __hmax2_nan(__hmax2_nan(h(w[0]), h(w[1])), __hmax2_nan(h(w[2]), h(w[3])));
    H2 const b = __hmax2_nan(__hmax2_nan(h(w[4]), h(w[5])), __hmax2_nan(h(w[6]), h(w[7])));
    H2 const m = __hmax2_nan(a, b);
    uint32_t const bits = *reinterpret_cast<uint32_t const*>(&m);
    return max(bits & 0xFFFFu, bits >> 16);
}

/// Encodes group g, staged in `stage`, into the blob: its largest magnitude from a first pass over
/// the stage, then each lane's blocks (block lane + 32 i) from a second.
template <bool kBf16>
__device__ void encodeStagedGroupWarp(BufferPlan const& b, uint32_t g, uint8_t const* stage, uint8_t* blob)
{
    uint32_t const expMask = kBf16 ? 0x7F80u : 0x7C00u;
    uint32_t const lane = threadIdx.x & 31u;
    WarpGroup const grp(b, g);
    uint2* const codes = reinterpret_cast<uint2*>(blob + b.dataOffset);
    uint8_t* const scales = blob + b.blockScaleOffset;
    uint32_t raw[kLaneBlocks];
    uint32_t m = 0;
#pragma unroll
    for (uint32_t i = 0; i < kLaneBlocks; ++i)
    {
        uint32_t const k = lane + 32 * i;
        raw[i] = 0;
        if (k < grp.n)
        {
            uint32_t w[8];
            (void)stagedBlock(stage, k, w);
            raw[i] = rawBlockMaxPacked<kBf16>(w);
            m = max(m, raw[i] >= expMask ? finiteBlockAmax(w, expMask) : raw[i]);
        }
    }
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    float const s = globalScale(halfToFloat(uint16_t(m), kBf16));
    float const d = mulRn(s, kE2m1Max); // blockScaleCode()'s divisor
    if (lane == 0)
    {
        reinterpret_cast<float*>(blob + b.globalScaleOffset)[g] = s;
    }
    // The common case, without a branch per block: every block of the lane in the group, finite,
    // and at a scale the fused thresholds take.
    bool fast = lane + 32 * (kLaneBlocks - 1) < grp.n;
    uint32_t sb[kLaneBlocks];
    float bs[kLaneBlocks];
#pragma unroll
    for (uint32_t i = 0; i < kLaneBlocks; ++i)
    {
        fast = fast && raw[i] < expMask;
    }
    if (fast)
    {
#pragma unroll
        for (uint32_t i = 0; i < kLaneBlocks; ++i)
        {
            sb[i] = e4m3CodeFast(divRn(halfToFloat(uint16_t(raw[i]), kBf16), d));
            bs[i] = mulRn(e4m3ValueFast(sb[i]), s);
            fast = fast && bs[i] >= kMinFmaThresholdScale;
        }
    }
    if (fast) // straight-line code: the lane's blocks interleave
    {
#pragma unroll
        for (uint32_t i = 0; i < kLaneBlocks; ++i)
        {
            uint32_t const k = lane + 32 * i;
            uint32_t w[8];
            uint32_t const first = stagedBlock(stage, k, w);
            uint32_t const idx = grp.index(k);
            codes[idx] = encodeScaled<kBf16>(w, first, bs[i]);
            scales[idx] = uint8_t(sb[i]);
        }
    }
#pragma unroll
    for (uint32_t i = 0; i < kLaneBlocks; ++i)
    {
        uint32_t const k = lane + 32 * i;
        if (!fast && k < grp.n)
        {
            uint4 const* p = reinterpret_cast<uint4 const*>(stage + 32ull * k);
            uint4 const x = p[0];
            uint4 const y = p[1];
            uint32_t const w[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
            encodeLaneBlock<kBf16>(w, raw[i], s, grp.index(k), codes, scales);
        }
    }
    if (g == 0)
    {
        zeroPadding(b, blob);
    }
}

// One warp per work item (a group), each warp with two stages of its own: while it encodes one
// group from shared memory, the next one's hot bytes are on their way (asynchronous copies, which
// leave L1 to the plan and hold no registers).
__global__ void __launch_bounds__(kWarpThreads, NVFP4_WARP_STAGED_BLOCKS_PER_SM)
    nvfp4WarpStaged(__grid_constant__ KernelArgs const a)
{
    extern __shared__ __align__(16) uint8_t dynamic[];
    uint8_t* const stages = dynamic + (threadIdx.x / 32) * 2 * kMaxWarpStagedGroupBytes;
    uint64_t const total = a.numPairs * a.itemsPerPage;
    uint64_t const step = uint64_t(gridDim.x) * (kWarpThreads / 32);
    uint64_t item = uint64_t(blockIdx.x) * (kWarpThreads / 32) + threadIdx.x / 32;
    Item next;
    bool nextValid = stageWarpItem(a, item, total, stages, next);
    for (uint32_t cur = 0; item < total; item += step, cur ^= 1u)
    {
        Item const it = next;
        bool const valid = nextValid;
        nextValid = stageWarpItem(a, item + step, total, stages + (cur ^ 1u) * kMaxWarpStagedGroupBytes, next);
        if (!valid)
        {
            continue;
        }
        kvcodec::copyAsyncWaitPrior<1>(); // this lane's copies of the item...
        __syncwarp();                     // ...and every lane's
        uint8_t const* const stage = stages + cur * kMaxWarpStagedGroupBytes;
        if (it.b->bf16)
        {
            encodeStagedGroupWarp<true>(*it.b, uint32_t(it.sub), stage, it.blob);
        }
        else
        {
            encodeStagedGroupWarp<false>(*it.b, uint32_t(it.sub), stage, it.blob);
        }
        __syncwarp(); // the stage is refilled on the next turn
    }
}

} // namespace
} // namespace nvfp4_codec

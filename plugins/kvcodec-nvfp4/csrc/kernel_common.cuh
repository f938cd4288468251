// SPDX-License-Identifier: Apache-2.0
//
// nvfp4: what both CUDA kernels share (included by kernel.cu): the thread block's shared memory,
// element loads and stores, the generic path (one work item per fp32 scale, for shapes the
// whole-buffer paths do not take), lossless copies, fast division and finding a work item.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "codec.h"
#include "format.h"

namespace nvfp4_codec {
namespace {

constexpr int kThreads = 512;
constexpr uint32_t kResident = 4;                       ///< Blocks a thread holds (fast path).
constexpr uint32_t kChunkBlocks = kThreads * kResident; ///< Blocks of a buffer per fast-path round.

// Resident thread blocks per SM (the launch bounds, and so the register budget) of each direction's
// kernel; tuned on Hopper, overridable at build time (-DNVFP4_ENCODE_BLOCKS_PER_SM=...).
#ifndef NVFP4_ENCODE_BLOCKS_PER_SM
#define NVFP4_ENCODE_BLOCKS_PER_SM 2
#endif
#ifndef NVFP4_DECODE_BLOCKS_PER_SM
#define NVFP4_DECODE_BLOCKS_PER_SM 2
#endif
constexpr int kEncodeBlocksPerSm = NVFP4_ENCODE_BLOCKS_PER_SM;
constexpr int kDecodeBlocksPerSm = NVFP4_DECODE_BLOCKS_PER_SM;

/// Shared memory of a thread block.
struct Staging
{
    uint32_t groupMax[kMaxWholeBufferGroups]; ///< Largest magnitude per group, as hot half bits.
    float groupScale[kMaxWholeBufferGroups];  ///< The groups' fp32 scales S.
    alignas(16) uint8_t codes[kChunkBlocks * kBlockElems / 2];
    alignas(16) uint8_t scales[kChunkBlocks];
    uint32_t warpMax[kThreads / 32];  ///< The generic path's block-wide maximum.
    uint4 scratch[kThreads / 32][64]; ///< Each warp's 1 KiB for storeWarpBlocks().
};

__device__ __forceinline__ bool aligned(void const* p, uintptr_t a)
{
    return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0;
}

// n <= 16 hot elements at `src` as fp32 bits: two 16-byte loads when whole and aligned.
__device__ __forceinline__ void loadBlock(uint8_t const* src, uint32_t n, bool bf16, uint32_t* u)
{
    if (n == kBlockElems && aligned(src, 16))
    {
        uint4 const v[2] = {reinterpret_cast<uint4 const*>(src)[0], reinterpret_cast<uint4 const*>(src)[1]};
        uint32_t const* w = reinterpret_cast<uint32_t const*>(v);
#pragma unroll
        for (uint32_t i = 0; i < kBlockElems; ++i)
        {
            u[i] = floatBits(halfToFloat(uint16_t(w[i / 2] >> (16 * (i & 1u))), bf16));
        }
        return;
    }
    bool const two = aligned(src, 2);
    for (uint32_t i = 0; i < n; ++i)
    {
        uint16_t const h
            = two ? reinterpret_cast<uint16_t const*>(src)[i] : uint16_t(src[2 * i] | (src[2 * i + 1] << 8));
        u[i] = floatBits(halfToFloat(h, bf16));
    }
}

__device__ __forceinline__ void storeBlock(uint8_t* dst, uint32_t n, uint16_t const* out)
{
    if (n == kBlockElems && aligned(dst, 16))
    {
        uint4 v[2];
        uint32_t* w = reinterpret_cast<uint32_t*>(v);
#pragma unroll
        for (uint32_t i = 0; i < kBlockElems / 2; ++i)
        {
            w[i] = uint32_t(out[2 * i]) | (uint32_t(out[2 * i + 1]) << 16);
        }
        reinterpret_cast<uint4*>(dst)[0] = v[0];
        reinterpret_cast<uint4*>(dst)[1] = v[1];
        return;
    }
    bool const two = aligned(dst, 2);
    for (uint32_t i = 0; i < n; ++i)
    {
        if (two)
        {
            reinterpret_cast<uint16_t*>(dst)[i] = out[i];
        }
        else
        {
            dst[2 * i] = uint8_t(out[i]);
            dst[2 * i + 1] = uint8_t(out[i] >> 8);
        }
    }
}

__device__ __forceinline__ void copyBytes(uint8_t* dst, uint8_t const* src, uint64_t n)
{
    if (aligned(dst, 16) && aligned(src, 16) && n % 16 == 0)
    {
        for (uint64_t i = threadIdx.x; i < n / 16; i += blockDim.x)
        {
            reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<uint4 const*>(src)[i];
        }
        return;
    }
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x)
    {
        dst[i] = src[i];
    }
}

__device__ __forceinline__ void zeroBytes(uint8_t* blob, uint64_t begin, uint64_t end)
{
    for (uint64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    {
        blob[i] = 0;
    }
}

// The largest of every thread's `v` (fp32 bits of non-negative values order like the floats).
__device__ float blockMax(uint32_t v, uint32_t* shared)
{
#pragma unroll
    for (int d = 16; d > 0; d /= 2)
    {
        v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, d));
    }
    if ((threadIdx.x & 31u) == 0)
    {
        shared[threadIdx.x / 32] = v;
    }
    __syncthreads();
    uint32_t m = 0;
    for (uint32_t w = 0; w < blockDim.x / 32; ++w)
    {
        m = max(m, shared[w]);
    }
    __syncthreads(); // `shared` is reused by the next work item
    return bitsFloat(m);
}

// Loads block k of group g into u (as fp32 bits), with its row and block column: returns its
// element count.
__device__ __forceinline__ uint32_t loadGroupBlock(
    BufferPlan const& b, uint64_t g, uint64_t k, uint8_t const* hot, bool bf16, uint32_t* u, uint64_t& row, uint32_t& j)
{
    blockPosition(b, g, k, row, j);
    uint32_t const n = min(kBlockElems, b.headDim - kBlockElems * j);
    loadBlock(hot + 2 * (row * b.headDim + kBlockElems * j), n, bf16, u);
    return n;
}

__device__ void encodeGroup(BufferPlan const& b, uint64_t g, uint8_t const* hot, uint8_t* blob, uint32_t* shared)
{
    bool const bf16 = b.bf16 != 0;
    uint32_t u[kBlockElems];
    uint32_t local = 0;
    for (uint64_t k = threadIdx.x; k < b.blocksPerGroup; k += blockDim.x)
    {
        uint64_t row;
        uint32_t j;
        uint32_t const n = loadGroupBlock(b, g, k, hot, bf16, u, row, j);
        local = max(local, floatBits(finiteAmax(u, n)));
    }
    float const s = globalScale(blockMax(local, shared));
    if (threadIdx.x == 0)
    {
        uint32_t const bits = floatBits(s);
        uint8_t* dst = blob + b.globalScaleOffset + 4 * g;
        for (int i = 0; i < 4; ++i)
        {
            dst[i] = uint8_t(bits >> (8 * i));
        }
    }
    for (uint64_t k = threadIdx.x; k < b.blocksPerGroup; k += blockDim.x)
    {
        uint64_t row;
        uint32_t j;
        uint32_t const n = loadGroupBlock(b, g, k, hot, bf16, u, row, j);
        uint8_t codes[kBlockElems / 2];
        uint8_t const sb = encodeBlock(u, n, s, codes);
        uint8_t* dst = blob + b.dataOffset + row * b.rowCodeBytes + kBlockElems / 2 * j;
        if (n == kBlockElems && aligned(dst, 8))
        {
            uint2 v;
            memcpy(&v, codes, sizeof(v));
            *reinterpret_cast<uint2*>(dst) = v;
        }
        else
        {
            for (uint32_t i = 0; i < (n + 1) / 2; ++i)
            {
                dst[i] = codes[i];
            }
        }
        blob[b.blockScaleOffset + row * b.blocksPerRow + j] = sb;
    }
    if (g == 0) // the buffer's padding, once
    {
        uint64_t const rows = uint64_t(b.tokens) * b.heads;
        zeroBytes(blob, b.dataEnd, b.blockScaleOffset);
        zeroBytes(blob, b.blockScaleOffset + rows * b.blocksPerRow, b.globalScaleOffset);
        zeroBytes(blob, b.globalScaleOffset + 4 * uint64_t(b.groups), b.regionEnd);
    }
}

__device__ void decodeGroup(BufferPlan const& b, uint64_t g, uint8_t* hot, uint8_t const* blob)
{
    uint8_t const* sp = blob + b.globalScaleOffset + 4 * g;
    float const s
        = bitsFloat(uint32_t(sp[0]) | (uint32_t(sp[1]) << 8) | (uint32_t(sp[2]) << 16) | (uint32_t(sp[3]) << 24));
    bool const bf16 = b.bf16 != 0;
    for (uint64_t k = threadIdx.x; k < b.blocksPerGroup; k += blockDim.x)
    {
        uint64_t row;
        uint32_t j;
        blockPosition(b, g, k, row, j);
        uint32_t const n = min(kBlockElems, b.headDim - kBlockElems * j);
        uint8_t const* src = blob + b.dataOffset + row * b.rowCodeBytes + kBlockElems / 2 * j;
        uint8_t codes[kBlockElems / 2];
        if (n == kBlockElems && aligned(src, 8))
        {
            uint2 const v = *reinterpret_cast<uint2 const*>(src);
            memcpy(codes, &v, sizeof(v));
        }
        else
        {
            for (uint32_t i = 0; i < (n + 1) / 2; ++i)
            {
                codes[i] = src[i];
            }
        }
        uint16_t out[kBlockElems];
        decodeBlock(codes, n, blob[b.blockScaleOffset + row * b.blocksPerRow + j], s, bf16, out);
        storeBlock(hot + 2 * (row * b.headDim + kBlockElems * j), n, out);
    }
}

// ---- Decoding a whole block (both decoders) ---------------------------------------------------

// floatToHalfSat() of two non-negative finite values with one hardware conversion (the first in
// the low half): clamping to the largest finite value first gives the same bits as saturating
// after rounding (both round to nearest even).
__device__ __forceinline__ uint32_t toHotSat2(float lo, float hi, bool bf16)
{
    if (bf16)
    {
        float const m = bitsFloat(0x7F7F0000u);
        __nv_bfloat162 const v = __floats2bfloat162_rn(fminf(lo, m), fminf(hi, m));
        return *reinterpret_cast<uint32_t const*>(&v);
    }
    __half2 const v = __floats2half2_rn(fminf(lo, 65504.0f), fminf(hi, 65504.0f));
    return *reinterpret_cast<uint32_t const*>(&v);
}

// prmt.b32 in its default mode: a selector nibble with its top bit set replicates the top bit of
// the byte it selects (which __byte_perm() does not promise).
__device__ __forceinline__ uint32_t prmtSign(uint32_t a, uint32_t b, uint32_t s)
{
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
    return d;
}

/// True when decodeByProduct() gives a block of effective scale `bs` decodeBlock()'s bits: bs
/// times 2^14 is exact and finite, every nonzero product is normal in fp32 (|e2m1| >= 0.5), and
/// none saturates in the hot type (floatToHalfSat()'s limits; below them its rounding is the
/// conversion's).
__device__ __forceinline__ bool decodesByProduct(float bs, bool bf16)
{
    uint32_t const top = floatBits(mulRn(6.0f, bs)); // the largest magnitude's product
    return (bs == 0.0f || (bs >= 0x1p-100f && bs <= 0x1p100f)) && top < (bf16 ? 0x7F7F8000u : 0x477FF000u);
}

/// decodeWords() for a block decodesByProduct() takes: each element's e2m1 value as fp16 bits, v
/// times 2^-14 exactly (the sign at bit 15, the three magnitude bits at bits 9-11, where fp16's two
/// low exponent bits and top mantissa bit are: 0.5 becomes the subnormal 2^-15), widened to fp32
/// and multiplied by bs times 2^14: mulRn(e2m1Value(code), bs), bit for bit, then converted as
/// toHotSat2() converts. Two byte permutes and a mask per word of output, the rest on the FMA
/// pipe, where the table's permutes took eight instructions of the ALU pipe.
template <bool kBf16>
__device__ __forceinline__ void decodeByProduct(uint2 codes, float bs, uint4 (&out)[2])
{
    float const scale = mulRn(bs, 0x1p14f);
    uint32_t* o = reinterpret_cast<uint32_t*>(out);
#pragma unroll
    for (uint32_t q = 0; q < 2; ++q)
    {
        uint32_t const w = q == 0 ? codes.x : codes.y;
        // Byte i: the fp16 high byte of element 2i (a) and of element 2i + 1 (b).
        uint32_t const a = ((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u);
        uint32_t const b = ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);
#pragma unroll
        for (uint32_t i = 0; i < 4; ++i)
        {
            uint32_t const h = __byte_perm(a, b, i * 0x0011u + (4 + i) * 0x1100u) & 0xFF00FF00u;
            float2 const v = __half22float2(*reinterpret_cast<__half2 const*>(&h));
            float const lo = mulRn(v.x, scale);
            float const hi = mulRn(v.y, scale);
            if constexpr (kBf16)
            {
                __nv_bfloat162 const r = __floats2bfloat162_rn(lo, hi);
                o[4 * q + i] = *reinterpret_cast<uint32_t const*>(&r);
            }
            else
            {
                __half2 const r = __floats2half2_rn(lo, hi);
                o[4 * q + i] = *reinterpret_cast<uint32_t const*>(&r);
            }
        }
    }
}

// One whole block's 32 hot bytes from its 8 code bytes (decodeBlock()'s result, without branches):
// by products where decodesByProduct() allows (every block of real K/V), else decodeTable()'s
// values picked two at a time with byte permutes and the sign bits set on top.
__device__ __forceinline__ void decodeWords(uint2 codes, uint8_t sb, float s, bool bf16, uint4 (&out)[2])
{
    float const bs = blockScale(sb, s);
    if (decodesByProduct(bs, bf16))
    {
        if (bf16)
        {
            decodeByProduct<true>(codes, bs, out);
        }
        else
        {
            decodeByProduct<false>(codes, bs, out);
        }
        return;
    }
    // decodeTable(): the hot bits of the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 times the block
    // scale, two per word.
    uint32_t const r0 = toHotSat2(0.0f, mulRn(e2m1Value(1), bs), bf16);
    uint32_t const r1 = toHotSat2(mulRn(e2m1Value(2), bs), mulRn(e2m1Value(3), bs), bf16);
    uint32_t const r2 = toHotSat2(mulRn(e2m1Value(4), bs), mulRn(e2m1Value(5), bs), bf16);
    uint32_t const r3 = toHotSat2(mulRn(e2m1Value(6), bs), mulRn(e2m1Value(7), bs), bf16);
    uint32_t* o = reinterpret_cast<uint32_t*>(out);
#pragma unroll
    for (uint32_t q = 0; q < 2; ++q)
    {
        // Byte i of a code word holds elements 2i (low nibble) and 2i + 1 (high nibble). Per word:
        uint32_t const w = q == 0 ? codes.x : codes.y;
        uint32_t const a = w & 0x03030303u;        // byte i: element 2i's low two magnitude bits
        uint32_t const b = (w >> 4) & 0x03030303u; // byte i: element 2i + 1's
        uint32_t const m = w << 5;                 // byte i's top bit: element 2i's third magnitude bit
        uint32_t const n = w << 1;                 // byte i's top bit: element 2i + 1's
        uint32_t const g = w << 4;                 // byte i's top bit: element 2i's sign (w's: 2i + 1's)
#pragma unroll
        for (uint32_t i = 0; i < 4; ++i)
        {
            // The table bytes of both elements (2a, 2a + 1 and 2b, 2b + 1 of an 8-byte half)...
            uint32_t const sel = __byte_perm(a, b, i | ((4 + i) << 4)) * 0x22u + 0x1010u;
            uint32_t const lo = __byte_perm(r0, r1, sel);
            uint32_t const hi = __byte_perm(r2, r3, sel);
            // ...the half each takes (byte permutes replicating a byte's top bit), and the signs.
            uint32_t const pick = prmtSign(m, n, (8 | i) * 0x11u + ((12 | i) * 0x1100u));
            uint32_t const sign = __byte_perm(g, w, (i << 4) | ((4 + i) << 12)) & 0x80008000u;
            o[4 * q + i] = (hi & pick) | (lo & ~pick) | sign;
        }
    }
}

// ---- The fast path: a whole buffer per work item ----------------------------------------------

// Bytes [0, n) of shared `src` to `dst`, then zeros up to `total` (the region's padding): 16-byte
// stores when `dst` and `total` allow.
__device__ void writeOut(uint8_t* dst, uint8_t const* src, uint32_t n, uint32_t total)
{
    if (aligned(dst, 16) && total % 16 == 0)
    {
        for (uint32_t i = threadIdx.x; i < total / 16; i += blockDim.x)
        {
            uint4 w;
            if (16 * i + 16 <= n)
            {
                w = reinterpret_cast<uint4 const*>(src)[i];
            }
            else
            {
                uint8_t tmp[16];
                for (uint32_t k = 0; k < 16; ++k)
                {
                    tmp[k] = 16 * i + k < n ? src[16 * i + k] : 0;
                }
                memcpy(&w, tmp, sizeof(w));
            }
            reinterpret_cast<uint4*>(dst)[i] = w;
        }
        return;
    }
    for (uint32_t i = threadIdx.x; i < total; i += blockDim.x)
    {
        dst[i] = i < n ? src[i] : 0;
    }
}

// Bytes [0, n) of `src` into shared `dst`: 16-byte loads when `src` allows.
__device__ void readIn(uint8_t* dst, uint8_t const* src, uint32_t n)
{
    uint32_t whole = 0;
    if (aligned(src, 16))
    {
        whole = n / 16;
        for (uint32_t i = threadIdx.x; i < whole; i += blockDim.x)
        {
            reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<uint4 const*>(src)[i];
        }
    }
    for (uint32_t i = 16 * whole + threadIdx.x; i < n; i += blockDim.x)
    {
        dst[i] = src[i];
    }
}

/// n / d for n < 2^31 (FastDiv, codec.h).
__device__ __forceinline__ uint32_t divide(uint32_t n, FastDiv const& d)
{
    return d.mul == 0 ? n >> d.shift : __umulhi(n, d.mul) >> d.shift;
}

// The group (index of its fp32 scale) of the blocks of a whole buffer, from a copy of the plan's
// fields in registers (read through the plan's reference, they would be loaded again per block).
struct GroupMap
{
    uint32_t groups;
    uint32_t heads;
    FastDiv row;
    FastDiv head;

    __device__ __forceinline__ explicit GroupMap(BufferPlan const& b)
        : groups(b.groups)
        , heads(b.heads)
        , row(b.rowDiv)
        , head(b.headDiv)
    {
    }

    __device__ __forceinline__ uint32_t of(uint32_t k) const
    {
        if (groups == 1)
        {
            return 0;
        }
        uint32_t const r = divide(k, row);
        return r - divide(r, head) * heads;
    }
};

// Where work item `item` of a launch lies: its buffer, hot bytes and blob; false for a pair out of
// range (skipped uniformly per thread block: never write outside the pools). Every thread of the
// block calls it for the same item (the buffer search is one ballot per 32 buffers).
struct Item
{
    BufferPlan const* b;
    uint64_t sub; ///< The work item within its buffer.
    uint8_t* hot;
    uint8_t* blob;
};

template <bool kEncode>
__device__ __forceinline__ bool resolveItem(KernelArgs const& a, uint64_t item, Item& it)
{
    bool const small = item < (uint64_t(1) << 31) && a.itemsPerPage < (uint64_t(1) << 31);
    uint64_t const page = small ? divide(uint32_t(item), a.itemsDiv) : item / a.itemsPerPage;
    uint64_t const r = item - page * a.itemsPerPage;
    kvcodec::PageIndexPair const pair = a.pairs[page];
    int32_t const hotIdx = kEncode ? pair.src : pair.dst;
    int32_t const coldIdx = kEncode ? pair.dst : pair.src;
    if (hotIdx < 0 || uint64_t(hotIdx) >= a.numHotSlots || coldIdx < 0)
    {
        return false;
    }
    // The last buffer whose first item is at most r (first items ascend from 0).
    uint32_t bi = 0;
    uint32_t const lane = threadIdx.x & 31u;
    for (uint32_t base = 0; base < a.numBuffers; base += 32)
    {
        bool const started = base + lane < a.numBuffers && a.buffers[base + lane].firstItem <= r;
        uint32_t const ballot = __ballot_sync(0xFFFFFFFFu, started);
        if (ballot != 0)
        {
            bi = base + 31 - __clz(ballot);
        }
        if (ballot != 0xFFFFFFFFu)
        {
            break;
        }
    }
    it.b = &a.buffers[bi];
    it.sub = r - it.b->firstItem;
    it.hot = reinterpret_cast<uint8_t*>(it.b->poolBase + uint64_t(hotIdx) * it.b->slotBytes + it.b->hotOffset);
    it.blob = reinterpret_cast<uint8_t*>(a.blob + uint64_t(coldIdx) * a.coldPageBytes);
    return true;
}

// The items of the generic path and lossless copies (both kernels).
template <bool kEncode>
__device__ void unstagedItem(Item const& it, uint32_t* warpMax)
{
    BufferPlan const& b = *it.b;
    if (b.quantized)
    {
        if constexpr (kEncode)
        {
            encodeGroup(b, it.sub, it.hot, it.blob, warpMax);
        }
        else
        {
            decodeGroup(b, it.sub, it.hot, it.blob);
        }
        return;
    }
    uint64_t const begin = it.sub * kCopyChunkBytes;
    uint64_t const n = min(kCopyChunkBytes, b.bytes - min(begin, b.bytes));
    if constexpr (kEncode)
    {
        copyBytes(it.blob + b.dataOffset + begin, it.hot + begin, n);
        if (it.sub + 1 == b.items)
        {
            zeroBytes(it.blob, b.dataEnd, b.regionEnd);
        }
    }
    else
    {
        copyBytes(it.hot + begin, it.blob + b.dataOffset + begin, n);
    }
}

} // namespace
} // namespace nvfp4_codec

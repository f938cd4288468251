// SPDX-License-Identifier: Apache-2.0
//
// The fp8 codec's tile kernel (kernel variant 'tile'): see the comment below. Launched by
// launchFp8 (kernel.cu) through launchTileKernel.
#include "kernel.h"

#include <algorithm>

#include "kernel_warp.cuh"
#include "kvcodec/kernels.cuh"

namespace kvcodec::fp8 {
namespace {

// ---------------------------------------------------------------------------------------------
// The tile variant: one thread block per tile, a run of whole scale blocks of one (page,
// buffer). The tile is laid out as `rows` rows of `nb * rowElems` contiguous elements (page_head:
// the page's token rows, the tile's heads side by side; token_head and page: one row), and
// block j of the tile is columns [j * rowElems, (j + 1) * rowElems) of every row, so its hot
// bytes, its codes and its scales are each a few long contiguous runs.
// ---------------------------------------------------------------------------------------------

// Chunks of 16 code pieces a decoding thread loads before its first store.
constexpr int kTileDecodeBatch = 4;

// Largest power of two (<= 32) dividing n: groups of that many consecutive lanes, starting at a
// multiple of 32, never straddle a multiple of n.
__device__ __forceinline__ uint32_t alignedLanes(uint32_t n)
{
    uint32_t const low = n & (0u - n);
    return low == 0 || low > 32 ? 32u : low;
}

// Finite amax (fp32 bits) of a 16-byte chunk of hot elements: one raw maximum, and the exact
// per-element pass only for a chunk that holds a NaN or an infinity (which then sets *flag).
template <int DT>
__device__ __forceinline__ uint32_t chunkAmax(uint4 v, uint32_t* flag)
{
    uint32_t const w[4] = {v.x, v.y, v.z, v.w};
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        m = DT == kFp32 ? max(m, w[i] & 0x7FFFFFFFu) : __vmaxu2(m, w[i] & 0x7FFF7FFFu);
    }
    if constexpr (DT != kFp32)
    {
        m = max(m & 0xFFFFu, m >> 16);
    }
    if (!rawNonFinite<DT>(m))
    {
        return rawToAmaxBits<DT>(m);
    }
    atomicOr(flag, 1u);
    uint32_t exact = 0;
#pragma unroll
    for (int i = 0; i < 16 / elemBytes<DT>(); ++i)
    {
        uint32_t const a = elemBits<DT>(w, i) & 0x7FFFFFFFu;
        exact = max(exact, a < 0x7F800000u ? a : 0u);
    }
    return exact;
}

// Encode of one tile of `nb` blocks starting at block `first`: the hot bytes are copied into
// shared memory once (16-byte pieces, all in flight together), each block's amax is reduced
// from there, and the codes are written in blob order, 16 per thread and store, so a warp
// writes 512 contiguous bytes per instruction; the tile's scales are one contiguous run.
template <int DT, int FMT>
__device__ void encodeTileCta(BufferPlan const& b, char const* hot, char* cold, uint64_t first, uint32_t nb, char* smem)
{
    constexpr uint32_t E = elemBytes<DT>();
    uint32_t const tid = threadIdx.x;
    uint32_t const lane = tid & 31;
    uint32_t const rowElems = static_cast<uint32_t>(b.rowElems);
    uint32_t const rows = static_cast<uint32_t>(b.blockElems / b.rowElems);
    uint32_t const segElems = nb * rowElems;
    uint32_t const segBytes = segElems * E;
    uint32_t const segChunks = segBytes / 16;
    uint32_t const chunks = rows * segChunks;
    uint64_t const segStart = first * b.blockStride;
    uint32_t* amax = reinterpret_cast<uint32_t*>(smem + uint64_t(rows) * segBytes);
    uint32_t* flag = amax + nb;

    char const* src = hot + segStart * E;
    for (uint32_t q = tid; q < chunks; q += kThreads)
    {
        uint32_t const row = q / segChunks;
        kvcodec::copyAsync16(smem + 16ull * q, src + (uint64_t(row) * b.rowStride) * E + 16ull * (q - row * segChunks));
    }
    for (uint32_t j = tid; j < nb; j += kThreads)
    {
        amax[j] = 0;
        flag[j] = 0;
    }
    kvcodec::copyAsyncWaitAll();
    __syncthreads();

    // Block amax, block by block (q runs over each block's chunks in turn) so that aligned
    // groups of lanes share a block and reduce with shuffles before one shared atomic.
    uint32_t const bwChunks = rowElems * E / 16;
    uint32_t const perBlock = rows * bwChunks;
    uint32_t const groupLanes = alignedLanes(perBlock);
    for (uint32_t base = tid & ~31u; base < chunks; base += kThreads)
    {
        uint32_t const q = base + lane;
        uint32_t m = 0, j = 0;
        if (q < chunks)
        {
            j = q / perBlock;
            uint32_t const within = q - j * perBlock;
            uint32_t const row = within / bwChunks;
            uint4 const v = *reinterpret_cast<uint4 const*>(
                smem + uint64_t(row) * segBytes + 16ull * (j * bwChunks + within - row * bwChunks));
            m = chunkAmax<DT>(v, &flag[j]);
        }
        m = groupMax(m, groupLanes);
        if (q < chunks && (lane & (groupLanes - 1)) == 0)
        {
            atomicMax(&amax[j], m);
        }
    }
    __syncthreads();

    for (uint32_t j = tid; j < nb; j += kThreads)
    {
        BlockScale const bs = blockScale(__uint_as_float(amax[j]), Format(FMT));
        *reinterpret_cast<float*>(cold + b.scaleOffset + 4 * (first + j)) = bs.scale;
        amax[j] = __float_as_uint(bs.reciprocal);
    }
    if (first == 0)
    {
        zeroPadding(b, cold, tid, kThreads);
    }
    __syncthreads();

    using A = Access<DT, true, 128>;
    uint32_t const segPieces = segElems / 16;
    uint32_t const pieces = rows * segPieces;
    char* codes = cold + b.dataOffset + segStart;
    for (uint32_t p = tid; p < pieces; p += kThreads)
    {
        uint32_t const row = p / segPieces;
        uint32_t const col = 16 * (p - row * segPieces);
        uint32_t const j = col / rowElems;
        uint32_t w[A::kWords];
        auto const* s = reinterpret_cast<uint4 const*>(smem + uint64_t(row) * segBytes + col * E);
#pragma unroll
        for (int k = 0; k < A::kWords / 4; ++k)
        {
            uint4 const v = s[k];
            w[4 * k] = v.x, w[4 * k + 1] = v.y, w[4 * k + 2] = v.z, w[4 * k + 3] = v.w;
        }
        float const r = __uint_as_float(amax[j]);
        uint32_t c[4];
        if (flag[j])
        {
            quantize<DT, FMT, true, true>(w, r, c);
        }
        else
        {
            quantize<DT, FMT, true, false>(w, r, c);
        }
        *reinterpret_cast<uint4*>(codes + uint64_t(row) * b.rowStride + col) = make_uint4(c[0], c[1], c[2], c[3]);
    }
}

// Decode of one tile: its scales into shared memory, then 16 codes per thread and load (a warp
// reads 512 contiguous blob bytes per instruction), kTileDecodeBatch loads in flight per thread,
// and 16-byte stores of the hot elements in the same order.
template <int DT, int FMT>
__device__ void decodeTileCta(BufferPlan const& b, char* hot, char const* cold, uint64_t first, uint32_t nb, char* smem)
{
    constexpr uint32_t E = elemBytes<DT>();
    using A = Access<DT, true, 128>;
    uint32_t const tid = threadIdx.x;
    uint32_t const rowElems = static_cast<uint32_t>(b.rowElems);
    uint32_t const rows = static_cast<uint32_t>(b.blockElems / b.rowElems);
    uint32_t const segPieces = nb * rowElems / 16;
    uint32_t const pieces = rows * segPieces;
    uint64_t const segStart = first * b.blockStride;
    float* scale = reinterpret_cast<float*>(smem);
    for (uint32_t j = tid; j < nb; j += kThreads)
    {
        scale[j] = *reinterpret_cast<float const*>(cold + b.scaleOffset + 4 * (first + j));
    }
    __syncthreads();
    char const* codes = cold + b.dataOffset + segStart;
    char* dst = hot + segStart * E;
    for (uint32_t p0 = tid; p0 < pieces; p0 += kThreads * kTileDecodeBatch)
    {
        uint32_t c[kTileDecodeBatch][4];
        uint32_t off[kTileDecodeBatch];
        uint32_t blk[kTileDecodeBatch];
#pragma unroll
        for (int u = 0; u < kTileDecodeBatch; ++u)
        {
            uint32_t const p = p0 + u * kThreads;
            if (p < pieces)
            {
                uint32_t const row = p / segPieces;
                uint32_t const col = 16 * (p - row * segPieces);
                blk[u] = col / rowElems;
                off[u] = row * static_cast<uint32_t>(b.rowStride) + col;
                loadCodes(codes + off[u], c[u], true);
            }
        }
#pragma unroll
        for (int u = 0; u < kTileDecodeBatch; ++u)
        {
            if (p0 + u * kThreads < pieces)
            {
                uint32_t w[A::kWords];
                dequantizeAccess<DT, FMT, true>(c[u], scale[blk[u]], w, true);
                storeRaw<DT, true>(dst + uint64_t(off[u]) * E, w, true);
            }
        }
    }
}

template <bool ENC, int FMT>
__device__ __forceinline__ void tileCtaFmt(
    BufferPlan const& b, char* hot, char* cold, uint64_t first, uint32_t nb, char* smem)
{
    switch (b.dtype)
    {
    case kBf16:
        ENC ? encodeTileCta<kBf16, FMT>(b, hot, cold, first, nb, smem)
            : decodeTileCta<kBf16, FMT>(b, hot, cold, first, nb, smem);
        break;
    case kFp16:
        ENC ? encodeTileCta<kFp16, FMT>(b, hot, cold, first, nb, smem)
            : decodeTileCta<kFp16, FMT>(b, hot, cold, first, nb, smem);
        break;
    default:
        ENC ? encodeTileCta<kFp32, FMT>(b, hot, cold, first, nb, smem)
            : decodeTileCta<kFp32, FMT>(b, hot, cold, first, nb, smem);
        break;
    }
}

// A tile whose blob is not 16-byte aligned (the cold base is not): its blocks are handed to the
// warps as the warp units would take them, on the element path with byte-wise scales.
template <bool ENC, int FMT, int LB>
__device__ void tileByWarps(BufferPlan const& b, char* hot, char* cold, uint64_t first, uint32_t nb, bool fast)
{
    uint32_t const lane = threadIdx.x & 31;
    uint32_t const perWarp = 32 / b.groupLanes;
    for (uint32_t g = (threadIdx.x / 32) * perWarp; g < nb; g += kWarpsPerBlock * perWarp) // warp-uniform
    {
        Tile t;
        t.hot = hot;
        t.cold = cold;
        t.active = g + lane / b.groupLanes < nb;
        t.block = first + g + lane / b.groupLanes;
        t.sub = lane % b.groupLanes;
        t.lanes = b.groupLanes;
        switch (b.dtype)
        {
        case kBf16:
            ENC ? encodeTile<kBf16, FMT, false, LB, true>(b, t, false, fast)
                : decodeTile<kBf16, FMT, false, LB, true>(b, t, false, fast);
            break;
        case kFp16:
            ENC ? encodeTile<kFp16, FMT, false, LB, true>(b, t, false, fast)
                : decodeTile<kFp16, FMT, false, LB, true>(b, t, false, fast);
            break;
        default:
            ENC ? encodeTile<kFp32, FMT, false, LB, true>(b, t, false, fast)
                : decodeTile<kFp32, FMT, false, LB, true>(b, t, false, fast);
            break;
        }
    }
}

// Work units are thread blocks: a tile of a tiled buffer, or kWarpsPerCta warp units of any
// other buffer (one per warp, as the b4 variant runs them). Every branch below depends on the
// unit only, so the whole thread block takes it and reaches each __syncthreads.
template <bool ENC>
__global__ void __launch_bounds__(kThreads, kKernelVariants[kTileVariant].blocksPerSm) fp8TileKernel(KernelArgs a)
{
    constexpr int LB = kKernelVariants[kTileVariant].laneBytes;
    extern __shared__ uint4 tileShared[];
    char* smem = reinterpret_cast<char*>(tileShared);
    uint32_t const lane = threadIdx.x & 31;
    uint64_t const total = a.numPairs * a.unitsPerPage;
    bool const fast = a.blockFinite != 0;
    for (uint64_t w = blockIdx.x; w < total; w += gridDim.x)
    {
        UnitRef u;
        if (!locateUnit<ENC>(a, w, u))
        {
            continue;
        }
        BufferPlan const& b = *u.b;
        if (b.tileBlocks == 0)
        {
            uint64_t const unit = u.unit * kWarpsPerCta + threadIdx.x / 32;
            if (unit < b.warpUnits)
            {
                warpUnit<ENC, LB, true>(a, b, u.hot, u.cold, unit, lane);
            }
            continue;
        }
        uint64_t const first = u.unit * b.tileBlocks;
        uint32_t const nb = static_cast<uint32_t>(min(b.tileBlocks, b.numBlocks - first));
        bool const e4m3 = a.format == uint32_t(Format::kE4M3);
        if (a.scalarOnly)
        {
            e4m3 ? tileByWarps<ENC, int(Format::kE4M3), LB>(b, u.hot, u.cold, first, nb, fast)
                 : tileByWarps<ENC, int(Format::kE5M2), LB>(b, u.hot, u.cold, first, nb, fast);
            continue;
        }
        e4m3 ? tileCtaFmt<ENC, int(Format::kE4M3)>(b, u.hot, u.cold, first, nb, smem)
             : tileCtaFmt<ENC, int(Format::kE5M2)>(b, u.hot, u.cold, first, nb, smem);
        __syncthreads(); // the next tile reuses the shared memory
    }
}

} // namespace

void launchTileKernel(KernelArgs const& args, uint64_t total, int numSms, cudaStream_t stream) noexcept
{
    uint64_t const blocks = std::min<uint64_t>(total, uint64_t(std::max(numSms, 1)) * std::max(args.tileResident, 1u));
    if (args.encode)
    {
        fp8TileKernel<true><<<static_cast<unsigned>(blocks), kThreads, args.tileSmem, stream>>>(args);
    }
    else
    {
        fp8TileKernel<false><<<static_cast<unsigned>(blocks), kThreads, args.tileSmem, stream>>>(args);
    }
}

cudaError_t preloadTileKernel() noexcept
{
    return preloadKernels(fp8TileKernel<true>, fp8TileKernel<false>);
}

cudaError_t prepareTileKernel(bool encode, uint64_t budget, uint32_t smem, int* residentPerSm) noexcept
{
    auto const kernel = encode ? fp8TileKernel<true> : fp8TileKernel<false>;
    cudaError_t st = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(budget));
    if (st == cudaSuccess)
    {
        st = cudaOccupancyMaxActiveBlocksPerMultiprocessor(residentPerSm, kernel, kThreads, smem);
    }
    return st;
}

} // namespace kvcodec::fp8

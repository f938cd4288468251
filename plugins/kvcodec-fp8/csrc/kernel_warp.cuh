// SPDX-License-Identifier: Apache-2.0
//
// The warp units of the fp8 kernels: one unit of a lossless buffer (a kCopyUnitBytes piece) or
// of a quantized buffer (a group of scale blocks), run by one warp. The warp kernel (kernel.cu)
// runs nothing else; the tile kernel (kernel_tile.cu) runs them for the buffers it does not tile.
#pragma once

#include "kernel_common.cuh"

namespace kvcodec::fp8 {
namespace {

// The original (v1) encode of one tile, kept as it was: the default until the variants are measured.
template <int DT, int FMT, bool VEC>
__device__ void encodeTileV1(BufferPlan const& b, Tile const& t, bool alignedCold)
{
    using A = Access<DT, VEC, 128>;
    constexpr int N = A::kElems;
    constexpr int E = elemBytes<DT>();
    uint32_t const nv = static_cast<uint32_t>(b.blockElems / N);
    bool const cached = nv <= uint32_t(A::kCached) * t.lanes;
    uint32_t cache[A::kCached][A::kWords];
    uint32_t amax = 0;
    if (t.active)
    {
        if (cached)
        {
#pragma unroll
            for (int c = 0; c < A::kCached; ++c)
            {
                uint32_t const k = t.sub + c * t.lanes;
                if (k < nv)
                {
                    loadRaw<DT, VEC>(t.hot + elemOffset<N>(b, t.block, k) * E, cache[c], b.hotAligned != 0);
                }
            }
#pragma unroll
            for (int c = 0; c < A::kCached; ++c)
            {
                if (t.sub + c * t.lanes < nv)
                {
                    amax = max(amax, amaxBits<DT, VEC>(cache[c]));
                }
            }
        }
        else
        {
            for (uint32_t k = t.sub; k < nv; k += t.lanes)
            {
                uint32_t w[A::kWords];
                loadRaw<DT, VEC>(t.hot + elemOffset<N>(b, t.block, k) * E, w, b.hotAligned != 0);
                amax = max(amax, amaxBits<DT, VEC>(w));
            }
        }
    }
    for (uint32_t o = t.lanes / 2; o >= 1; o /= 2)
    {
        amax = max(amax, __shfl_xor_sync(kFull, amax, o));
    }
    if (!t.active)
    {
        return;
    }
    BlockScale const bs = blockScale(__uint_as_float(amax), Format(FMT));
    if (t.sub == 0)
    {
        storeScale(t.cold + b.scaleOffset + 4 * t.block, bs.scale, alignedCold);
    }
    char* codesBase = t.cold + b.dataOffset;
    if (cached)
    {
#pragma unroll
        for (int c = 0; c < A::kCached; ++c)
        {
            uint32_t const k = t.sub + c * t.lanes;
            if (k < nv)
            {
                uint32_t codes[N == 16 ? 4 : 1];
                quantize<DT, FMT, VEC>(cache[c], bs.reciprocal, codes);
                storeCodes(codesBase + elemOffset<N>(b, t.block, k), codes, N);
            }
        }
    }
    else
    {
        for (uint32_t k = t.sub; k < nv; k += t.lanes)
        {
            uint32_t w[A::kWords];
            uint64_t const off = elemOffset<N>(b, t.block, k);
            loadRaw<DT, VEC>(t.hot + off * E, w, b.hotAligned != 0);
            uint32_t codes[N == 16 ? 4 : 1];
            quantize<DT, FMT, VEC>(w, bs.reciprocal, codes);
            storeCodes(codesBase + off, codes, N);
        }
    }
    if (t.block == 0)
    {
        // Zero padding, so blobs are fully determined by the hot data.
        for (uint64_t p = b.dataEnd + t.sub; p < b.scaleOffset; p += t.lanes)
        {
            t.cold[p] = 0;
        }
        for (uint64_t p = b.scaleEnd + t.sub; p < b.regionEnd; p += t.lanes)
        {
            t.cold[p] = 0;
        }
    }
}

// Reduces a group's per-lane maximum (groups are aligned power-of-two lane ranges).
__device__ __forceinline__ uint32_t groupMax(uint32_t m, uint32_t lanes)
{
    for (uint32_t o = lanes / 2; o >= 1; o /= 2)
    {
        m = max(m, __shfl_xor_sync(kFull, m, o));
    }
    return m;
}

// Quantizes and stores one cached access (the finite fast path when `unchecked`).
template <int DT, int FMT, bool VEC, int LB>
__device__ __forceinline__ void quantizeStore(uint32_t const* w, float r, char* dst, bool unchecked)
{
    constexpr int N = Access<DT, VEC, LB>::kElems;
    uint32_t codes[N == 16 ? 4 : 1];
    if (unchecked)
    {
        quantize<DT, FMT, VEC, false>(w, r, codes);
    }
    else
    {
        quantize<DT, FMT, VEC, true>(w, r, codes);
    }
    storeCodes(dst, codes, N);
}

// Loads the lane's accesses k0, k0 + lanes, ..., k0 + (C - 1) * lanes of the tile's block that
// lie below nv into `cache`, all issued before any is used.
template <int DT, bool VEC, int LB, int C>
__device__ __forceinline__ void loadBatch(
    BufferPlan const& b, Tile const& t, uint32_t k0, uint32_t nv, uint32_t (&cache)[C][Access<DT, VEC, LB>::kWords])
{
    constexpr int N = Access<DT, VEC, LB>::kElems;
#pragma unroll
    for (int c = 0; c < C; ++c)
    {
        uint32_t const k = k0 + c * t.lanes;
        if (k < nv)
        {
            loadRaw<DT, VEC, LB>(t.hot + elemOffset<N>(b, t.block, k) * elemBytes<DT>(), cache[c], b.hotAligned != 0);
        }
    }
}

// Encode of one tile: a scale block spread over `lanes` lanes. LB: hot bytes a lane caches;
// BATCH: blocks larger than the cache are streamed LB bytes per lane at a time (else one access).
// `fast` (finite_check=block): one raw maximum per access, the exact finite amax and the
// per-element NaN/Inf handling only for warps that hold a non-finite element.
template <int DT, int FMT, bool VEC, int LB, bool BATCH>
__device__ void encodeTile(BufferPlan const& b, Tile const& t, bool alignedCold, bool fast)
{
    using A = Access<DT, VEC, LB>;
    constexpr int N = A::kElems;
    constexpr int E = elemBytes<DT>();
    constexpr int C = A::kCached;
    fast = BATCH && fast; // v1 has no fast path
    uint32_t const nv = static_cast<uint32_t>(b.blockElems / N);
    uint32_t const step = uint32_t(C) * t.lanes;
    bool const cached = nv <= step;
    uint32_t cache[C][A::kWords];
    // The first pass: the exact finite amax (fp32 bits) or, when `exact` is false, the raw
    // maximum in the hot dtype's bits.
    auto firstPass = [&](bool exact) {
        uint32_t m = 0;
        if (!t.active)
        {
            return m;
        }
        if (cached || BATCH)
        {
            for (uint32_t k0 = t.sub; k0 < nv; k0 += step)
            {
                loadBatch<DT, VEC, LB, C>(b, t, k0, nv, cache);
#pragma unroll
                for (int c = 0; c < C; ++c)
                {
                    if (k0 + c * t.lanes < nv)
                    {
                        m = max(m, exact ? amaxBits<DT, VEC>(cache[c]) : rawMaxBits<DT, VEC>(cache[c]));
                    }
                }
            }
        }
        else
        {
            for (uint32_t k = t.sub; k < nv; k += t.lanes)
            {
                uint32_t w[A::kWords];
                loadRaw<DT, VEC, LB>(t.hot + elemOffset<N>(b, t.block, k) * E, w, b.hotAligned != 0);
                m = max(m, exact ? amaxBits<DT, VEC>(w) : rawMaxBits<DT, VEC>(w));
            }
        }
        return m;
    };
    bool unchecked = false;
    uint32_t amax = groupMax(firstPass(!fast), t.lanes);
    if (fast)
    {
        // Warp-uniform: a warp holding a NaN or Inf takes the exact path for all its lanes.
        if (__any_sync(kFull, t.active && rawNonFinite<DT>(amax)))
        {
            amax = groupMax(firstPass(true), t.lanes);
        }
        else
        {
            amax = rawToAmaxBits<DT>(amax);
            unchecked = true;
        }
    }
    if (!t.active)
    {
        return;
    }
    BlockScale const bs = blockScale(__uint_as_float(amax), Format(FMT));
    if (t.sub == 0)
    {
        storeScale(t.cold + b.scaleOffset + 4 * t.block, bs.scale, alignedCold);
    }
    char* codesBase = t.cold + b.dataOffset;
    if (cached)
    {
#pragma unroll
        for (int c = 0; c < C; ++c)
        {
            uint32_t const k = t.sub + c * t.lanes;
            if (k < nv)
            {
                quantizeStore<DT, FMT, VEC, LB>(
                    cache[c], bs.reciprocal, codesBase + elemOffset<N>(b, t.block, k), unchecked);
            }
        }
    }
    else if (BATCH)
    {
        for (uint32_t k0 = t.sub; k0 < nv; k0 += step)
        {
            loadBatch<DT, VEC, LB, C>(b, t, k0, nv, cache);
#pragma unroll
            for (int c = 0; c < C; ++c)
            {
                uint32_t const k = k0 + c * t.lanes;
                if (k < nv)
                {
                    quantizeStore<DT, FMT, VEC, LB>(
                        cache[c], bs.reciprocal, codesBase + elemOffset<N>(b, t.block, k), unchecked);
                }
            }
        }
    }
    else
    {
        for (uint32_t k = t.sub; k < nv; k += t.lanes)
        {
            uint32_t w[A::kWords];
            uint64_t const off = elemOffset<N>(b, t.block, k);
            loadRaw<DT, VEC, LB>(t.hot + off * E, w, b.hotAligned != 0);
            quantizeStore<DT, FMT, VEC, LB>(w, bs.reciprocal, codesBase + off, unchecked);
        }
    }
    if (t.block == 0)
    {
        zeroPadding(b, t.cold, t.sub, t.lanes);
    }
}

// Encode of a unit of several rounds (small_blocks=deep): round s covers the blocks
// t.block + s * 32 / lanes, and each lane holds at most one access of each, so all rounds'
// loads are in flight before the first reduction.
template <int DT, int FMT, bool VEC, int LB>
__device__ void encodeRounds(BufferPlan const& b, Tile const& t, bool alignedCold, bool fast)
{
    using A = Access<DT, VEC, LB>;
    constexpr int N = A::kElems;
    constexpr int E = elemBytes<DT>();
    constexpr int C = A::kCached;
    uint32_t const perRound = 32 / t.lanes;
    uint32_t const nv = static_cast<uint32_t>(b.blockElems / N);
    uint32_t cache[C][A::kWords];
    uint32_t m[C];
    bool act[C];
#pragma unroll
    for (int s = 0; s < C; ++s)
    {
        uint64_t const block = t.block + uint64_t(s) * perRound;
        act[s] = uint32_t(s) < b.rounds && block < b.numBlocks && t.sub < nv;
        if (act[s])
        {
            loadRaw<DT, VEC, LB>(t.hot + elemOffset<N>(b, block, t.sub) * E, cache[s], b.hotAligned != 0);
        }
    }
    bool nonFinite = false;
#pragma unroll
    for (int s = 0; s < C; ++s)
    {
        m[s] = !act[s] ? 0u : (fast ? rawMaxBits<DT, VEC>(cache[s]) : amaxBits<DT, VEC>(cache[s]));
        m[s] = groupMax(m[s], t.lanes);
        nonFinite = nonFinite || (fast && act[s] && rawNonFinite<DT>(m[s]));
    }
    bool unchecked = false;
    if (fast)
    {
        bool const exact = __any_sync(kFull, nonFinite);
#pragma unroll
        for (int s = 0; s < C; ++s)
        {
            m[s] = exact ? groupMax(act[s] ? amaxBits<DT, VEC>(cache[s]) : 0u, t.lanes) : rawToAmaxBits<DT>(m[s]);
        }
        unchecked = !exact;
    }
#pragma unroll
    for (int s = 0; s < C; ++s)
    {
        if (!act[s])
        {
            continue;
        }
        uint64_t const block = t.block + uint64_t(s) * perRound;
        BlockScale const bs = blockScale(__uint_as_float(m[s]), Format(FMT));
        if (t.sub == 0)
        {
            storeScale(t.cold + b.scaleOffset + 4 * block, bs.scale, alignedCold);
        }
        quantizeStore<DT, FMT, VEC, LB>(
            cache[s], bs.reciprocal, t.cold + b.dataOffset + elemOffset<N>(b, block, t.sub), unchecked);
        if (block == 0)
        {
            zeroPadding(b, t.cold, t.sub, t.lanes);
        }
    }
}

// True when a word of four codes holds a NaN code (e4m3: low 7 bits all ones; e5m2: above
// 0x7C); the carry of the add lands in bit 7 of the byte and never crosses into the next one.
template <int FMT>
__device__ __forceinline__ bool nanCodeIn(uint32_t w)
{
    constexpr uint32_t kAdd = FMT == int(Format::kE4M3) ? 0x01010101u : 0x03030303u;
    return (((w & 0x7F7F7F7Fu) + kAdd) & 0x80808080u) != 0;
}

template <int DT, int FMT, bool VEC>
__device__ __forceinline__ void dequantizeAccess(uint32_t const* codes, float s, uint32_t* w, bool fast)
{
    constexpr int kCodeWords = VEC ? 4 : 1;
    bool nan = !fast;
#pragma unroll
    for (int i = 0; i < kCodeWords; ++i)
    {
        nan = nan || nanCodeIn<FMT>(codes[i]);
    }
    if (nan)
    {
        dequantize<DT, FMT, VEC, true>(codes, s, w);
    }
    else
    {
        dequantize<DT, FMT, VEC, false>(codes, s, w);
    }
}

__device__ __forceinline__ void loadCodes(char const* p, uint32_t* codes, bool vec16)
{
    if (vec16)
    {
        uint4 const v = *reinterpret_cast<uint4 const*>(p);
        codes[0] = v.x, codes[1] = v.y, codes[2] = v.z, codes[3] = v.w;
    }
    else
    {
        codes[0] = static_cast<unsigned char>(*p);
    }
}

// Decode of one tile; code loads of kBatch accesses per lane are in flight before the first
// store (4 for v1, the lane cache's accesses for the other variants).
template <int DT, int FMT, bool VEC, int LB, bool BATCH>
__device__ void decodeTile(BufferPlan const& b, Tile const& t, bool alignedCold, bool fast)
{
    using A = Access<DT, VEC, LB>;
    constexpr int N = A::kElems;
    constexpr int E = elemBytes<DT>();
    constexpr int kBatch = BATCH ? A::kCached : 4;
    fast = BATCH && fast; // v1 has no fast path
    if (!t.active)
    {
        return;
    }
    uint32_t const nv = static_cast<uint32_t>(b.blockElems / N);
    float const s = loadScale(t.cold + b.scaleOffset + 4 * t.block, alignedCold);
    char const* codesBase = t.cold + b.dataOffset;
    for (uint32_t k0 = t.sub; k0 < nv; k0 += kBatch * t.lanes)
    {
        uint32_t codes[kBatch][N == 16 ? 4 : 1];
#pragma unroll
        for (int u = 0; u < kBatch; ++u)
        {
            uint32_t const k = k0 + u * t.lanes;
            if (k < nv)
            {
                loadCodes(codesBase + elemOffset<N>(b, t.block, k), codes[u], N == 16);
            }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u)
        {
            uint32_t const k = k0 + u * t.lanes;
            if (k < nv)
            {
                uint32_t w[A::kWords];
                dequantizeAccess<DT, FMT, VEC>(codes[u], s, w, fast);
                storeRaw<DT, VEC, LB>(t.hot + elemOffset<N>(b, t.block, k) * E, w, b.hotAligned != 0);
            }
        }
    }
}

// Decode of a unit of several rounds (see encodeRounds): scales and codes of every round are
// loaded before the first store.
template <int DT, int FMT, bool VEC, int LB>
__device__ void decodeRounds(BufferPlan const& b, Tile const& t, bool alignedCold, bool fast)
{
    using A = Access<DT, VEC, LB>;
    constexpr int N = A::kElems;
    constexpr int E = elemBytes<DT>();
    constexpr int C = A::kCached;
    uint32_t const perRound = 32 / t.lanes;
    uint32_t const nv = static_cast<uint32_t>(b.blockElems / N);
    uint32_t codes[C][N == 16 ? 4 : 1];
    float scale[C];
#pragma unroll
    for (int s = 0; s < C; ++s)
    {
        uint64_t const block = t.block + uint64_t(s) * perRound;
        if (uint32_t(s) < b.rounds && block < b.numBlocks && t.sub < nv)
        {
            scale[s] = loadScale(t.cold + b.scaleOffset + 4 * block, alignedCold);
            loadCodes(t.cold + b.dataOffset + elemOffset<N>(b, block, t.sub), codes[s], N == 16);
        }
    }
#pragma unroll
    for (int s = 0; s < C; ++s)
    {
        uint64_t const block = t.block + uint64_t(s) * perRound;
        if (uint32_t(s) < b.rounds && block < b.numBlocks && t.sub < nv)
        {
            uint32_t w[A::kWords];
            dequantizeAccess<DT, FMT, VEC>(codes[s], scale[s], w, fast);
            storeRaw<DT, VEC, LB>(t.hot + elemOffset<N>(b, block, t.sub) * E, w, b.hotAligned != 0);
        }
    }
}

template <int DT, int FMT, bool ENC, bool VEC, int LB, bool BATCH>
__device__ __forceinline__ void tileOf(BufferPlan const& b, Tile const& t, bool alignedCold, bool fast)
{
    if constexpr (!BATCH)
    {
        // v1: rounds are always 1 and `fast` always false (the plan and the parameters see to it).
        if constexpr (ENC)
        {
            encodeTileV1<DT, FMT, VEC>(b, t, alignedCold);
        }
        else
        {
            decodeTile<DT, FMT, VEC, LB, false>(b, t, alignedCold, false);
        }
    }
    else if (b.rounds > 1 && VEC)
    {
        // One access per lane and round: every round's loads go out before the first reduction.
        if constexpr (ENC)
        {
            encodeRounds<DT, FMT, VEC, LB>(b, t, alignedCold, fast);
        }
        else
        {
            decodeRounds<DT, FMT, VEC, LB>(b, t, alignedCold, fast);
        }
    }
    else
    {
        // One round after the other (also the element path of a deep unit, whose blocks may
        // need several accesses per lane).
        Tile r = t;
        for (uint32_t s = 0; s < b.rounds; ++s)
        {
            r.block = t.block + uint64_t(s) * (32 / t.lanes);
            r.active = r.block < b.numBlocks;
            if constexpr (ENC)
            {
                encodeTile<DT, FMT, VEC, LB, BATCH>(b, r, alignedCold, fast);
            }
            else
            {
                decodeTile<DT, FMT, VEC, LB, BATCH>(b, r, alignedCold, fast);
            }
        }
    }
}

template <int DT, int FMT, bool ENC, int LB, bool BATCH>
__device__ void quantizedUnit(BufferPlan const& b, Tile const& t, bool vec, bool alignedCold, bool fast)
{
    vec ? tileOf<DT, FMT, ENC, true, LB, BATCH>(b, t, alignedCold, fast)
        : tileOf<DT, FMT, ENC, false, LB, BATCH>(b, t, alignedCold, fast);
}

template <int FMT, bool ENC, int LB, bool BATCH>
__device__ void quantizedUnitFmt(BufferPlan const& b, Tile const& t, bool vec, bool alignedCold, bool fast)
{
    switch (b.dtype)
    {
    case kBf16: quantizedUnit<kBf16, FMT, ENC, LB, BATCH>(b, t, vec, alignedCold, fast); break;
    case kFp16: quantizedUnit<kFp16, FMT, ENC, LB, BATCH>(b, t, vec, alignedCold, fast); break;
    default: quantizedUnit<kFp32, FMT, ENC, LB, BATCH>(b, t, vec, alignedCold, fast); break;
    }
}

// One lossless piece: the warp copies up to kCopyUnitBytes with the widest aligned access.
__device__ void copyUnit(BufferPlan const& b, char* hot, char* cold, uint64_t unit, uint32_t lane, bool encode)
{
    uint64_t const off = unit * kCopyUnitBytes;
    uint64_t const len = min(kCopyUnitBytes, b.bytes - off);
    char* h = hot + off;
    char* c = cold + b.dataOffset + off;
    char* dst = encode ? c : h;
    char const* src = encode ? h : c;
    if (((reinterpret_cast<uint64_t>(dst) | reinterpret_cast<uint64_t>(src) | len) & 15) == 0)
    {
        auto* d = reinterpret_cast<uint4*>(dst);
        auto const* s = reinterpret_cast<uint4 const*>(src);
        constexpr uint32_t kWordsPerUnit = kCopyUnitBytes / 16;
        uint4 v[kWordsPerUnit / 32];
#pragma unroll
        for (uint32_t i = 0; i < kWordsPerUnit / 32; ++i)
        {
            uint64_t const k = lane + 32 * i;
            if (k < len / 16)
            {
                v[i] = s[k];
            }
        }
#pragma unroll
        for (uint32_t i = 0; i < kWordsPerUnit / 32; ++i)
        {
            uint64_t const k = lane + 32 * i;
            if (k < len / 16)
            {
                d[k] = v[i];
            }
        }
    }
    else
    {
        for (uint64_t k = lane; k < len; k += 32)
        {
            dst[k] = src[k];
        }
    }
    if (encode && unit == 0)
    {
        for (uint64_t p = b.dataEnd + lane; p < b.regionEnd; p += 32)
        {
            cold[p] = 0;
        }
    }
}

// Where work unit `w` of a call lies: its buffer, the page's hot slot and blob, and the unit's
// index inside the buffer. False when the page's pair is skipped (an index out of range). Every
// value depends on `w` only, so the result is uniform over whoever shares `w`.
struct UnitRef
{
    BufferPlan const* b;
    char* hot;
    char* cold;
    uint64_t unit;
};

template <bool ENC>
__device__ __forceinline__ bool locateUnit(KernelArgs const& a, uint64_t w, UnitRef& u)
{
    uint64_t const page = w / a.unitsPerPage;
    uint64_t const r = w - page * a.unitsPerPage;
    // The buffer owning unit r: the last whose firstUnit <= r.
    uint32_t lo = 0, hi = a.numBuffers - 1;
    while (lo < hi)
    {
        uint32_t const mid = (lo + hi + 1) / 2;
        if (a.buffers[mid].firstUnit <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    BufferPlan const& b = a.buffers[lo];
    // One aligned 64-bit load fetches both indices.
    long long const packed = __ldg(reinterpret_cast<long long const*>(a.pairs) + page);
    int32_t const dstIdx = static_cast<int32_t>(packed & 0xffffffffll);
    int32_t const srcIdx = static_cast<int32_t>(packed >> 32);
    int32_t const hotIdx = ENC ? srcIdx : dstIdx;
    int32_t const coldIdx = ENC ? dstIdx : srcIdx;
    if (hotIdx < 0 || uint64_t(hotIdx) >= a.numHotSlots || coldIdx < 0)
    {
        return false;
    }
    u.b = &b;
    u.hot = reinterpret_cast<char*>(b.poolBase + uint64_t(hotIdx) * b.slotBytes + b.hotOffset);
    u.cold = reinterpret_cast<char*>(a.blob + uint64_t(coldIdx) * a.coldPageBytes);
    u.unit = r - b.firstUnit;
    return true;
}

// One warp unit `unit` of a buffer (the whole warp calls it).
template <bool ENC, int LB, bool BATCH>
__device__ __forceinline__ void warpUnit(
    KernelArgs const& a, BufferPlan const& b, char* hot, char* cold, uint64_t unit, uint32_t lane)
{
    if (!b.quantized)
    {
        copyUnit(b, hot, cold, unit, lane, ENC);
        return;
    }
    uint32_t const group = lane / b.groupLanes;
    Tile t;
    t.hot = hot;
    t.cold = cold;
    t.block = unit * (32 / b.groupLanes) * (BATCH ? b.rounds : 1u) + group;
    t.active = t.block < b.numBlocks;
    t.sub = lane % b.groupLanes;
    t.lanes = b.groupLanes;
    bool const vec = b.vector && !a.scalarOnly;
    bool const fast = BATCH && a.blockFinite != 0;
    if (a.format == uint32_t(Format::kE4M3))
    {
        quantizedUnitFmt<int(Format::kE4M3), ENC, LB, BATCH>(b, t, vec, !a.scalarOnly, fast);
    }
    else
    {
        quantizedUnitFmt<int(Format::kE5M2), ENC, LB, BATCH>(b, t, vec, !a.scalarOnly, fast);
    }
}

} // namespace
} // namespace kvcodec::fp8

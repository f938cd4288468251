// SPDX-License-Identifier: Apache-2.0
//
// The CPU implementation of blob format 1: see cpu.h. Each element function below is the
// branch-free twin of a scalar function of format.h: the same IEEE operations on the same
// operands (or an integer identity of them, noted where used), with both ranges of a
// conversion computed and one selected, so that the element loops vectorize.
#include "cpu.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "kvcodec/codec.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVFP8_CPU_X86_VARIANTS 1
#define KVFP8_TARGET_AVX2 __attribute__((target("avx2")))
// x86-64-v4's AVX-512 subsets, with 512-bit vectors for the loops (the compiler otherwise prefers
// 256-bit ones).
#define KVFP8_TARGET_AVX512 __attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")))
#endif

#if defined(__GNUC__) || defined(__clang__)
#define KVFP8_CPU_INLINE inline __attribute__((always_inline))
#else
#define KVFP8_CPU_INLINE inline
#endif

namespace kvcodec::fp8::cpu {
namespace {

// ---------------------------------------------------------------------------------------------
// Element arithmetic
// ---------------------------------------------------------------------------------------------

/// Constants of an fp8 format.
template <Format F>
struct Fp8Traits
{
    static constexpr bool kE4M3 = F == Format::kE4M3;
    static constexpr uint32_t kMantBits = kE4M3 ? 3 : 2;
    static constexpr uint32_t kBias = kE4M3 ? 7 : 15;
    static constexpr uint32_t kMaxCode = kE4M3 ? 0x7E : 0x7B;
    /// Smallest normal of the format, 2^(1 - bias), as fp32 bits.
    static constexpr uint32_t kMinNormalBits = (127u + 1u - kBias) << 23;
    /// 2^(bias - 1 + mantBits): scales the subnormal range to units of its step.
    static constexpr uint32_t kSubnormalScaleBits = (127u + kBias - 1u + kMantBits) << 23;
    /// 2^(127 - bias): an fp8 magnitude moved into fp32's bit positions, times this, is its value.
    static constexpr uint32_t kValueScaleBits = (127u + 127u - kBias) << 23;
};

/// `c ? a : b` as a bit mask blend. A plain conditional whose operand comes from floating-point
/// arithmetic may be turned into a branch around that arithmetic, and under the default
/// -ftrapping-math the compiler then cannot vectorize the loop; the blend keeps it straight-line.
template <class T>
KVFP8_CPU_INLINE T select(bool c, T a, T b)
{
    T const mask = T(0) - T(c);
    return T((a & mask) | (b & T(~mask)));
}

/// RNE(v) for 0 <= v < 2^22 as an integer: adding 2^23 leaves the rounded integer in the
/// mantissa bits, so this equals uint32_t(roundHalfEvenSmall(v)).
KVFP8_CPU_INLINE uint32_t roundSmallToInt(float v)
{
    return floatBits(v + 8388608.0f) - 0x4B000000u;
}

/// fp32ToFp8Sat on the magnitude bits `a` of a finite value: the code without its sign.
template <Format F>
KVFP8_CPU_INLINE uint32_t fp8Magnitude(uint32_t a)
{
    using T = Fp8Traits<F>;
    uint32_t constexpr shift = 23 - T::kMantBits;
    uint32_t const normal
        = ((a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u)) >> shift) - ((127u - T::kBias) << T::kMantBits);
    uint32_t const subnormal = roundSmallToInt(bitsFloat(a) * bitsFloat(T::kSubnormalScaleBits));
    return select(a < T::kMinNormalBits, subnormal, std::min(normal, T::kMaxCode));
}

/// The fp32 value of an fp8 code (fp8ToFp32) for every code but the NaN codes (their callers
/// replace them): the magnitude moved into fp32's bit positions is the value times 2^(bias-127),
/// also for subnormal codes (an fp32 subnormal), so one exact multiplication gives it.
template <Format F>
KVFP8_CPU_INLINE float fp8Value(uint32_t c)
{
    using T = Fp8Traits<F>;
    uint32_t const magnitude = c & 0x7Fu;
    uint32_t v = floatBits(bitsFloat(magnitude << (23 - T::kMantBits)) * bitsFloat(T::kValueScaleBits));
    if constexpr (F == Format::kE5M2)
    {
        v = select(magnitude == 0x7Cu, 0x7F800000u, v); // e5m2 infinity
    }
    return bitsFloat(v | (c & 0x80u) << 24);
}

/// fp32ToFp16 with both ranges computed and one selected.
KVFP8_CPU_INLINE uint16_t fp32ToFp16Select(float x)
{
    uint32_t const u = floatBits(x);
    uint32_t const sign = (u >> 16) & 0x8000u;
    uint32_t const a = u & 0x7FFFFFFFu;
    uint32_t const normal = ((a + 0xFFFu + ((a >> 13) & 1u)) >> 13) - (112u << 10);
    uint32_t const subnormal = roundSmallToInt(bitsFloat(a) * 16777216.0f);
    uint32_t const magnitude = select(a >= 0x477FF000u, 0x7C00u, select(a < 0x38800000u, subnormal, normal));
    return uint16_t(sign | magnitude);
}

// Hot dtypes of quantized buffers: the element's bits, its magnitude bits (sign cleared; as
// integers they order like the values), the magnitude of infinity (at or above: non-finite),
// and the conversions from and to fp32.

template <class B, uint32_t AbsMask, uint32_t Inf, uint32_t SignShift, float (*Magnitude)(uint32_t), B (*Round)(float),
    B (*Nan)(uint32_t)>
struct HotDtype
{
    using Bits = B;
    static constexpr uint32_t kAbsMask = AbsMask;
    static constexpr uint32_t kInf = Inf;
    static constexpr uint32_t kSignShift = SignShift; ///< Moves the sign bit to 0x80.

    static KVFP8_CPU_INLINE float magnitude(uint32_t a)
    {
        return Magnitude(a);
    }
    static KVFP8_CPU_INLINE Bits round(float y)
    {
        return Round(y);
    }
    static KVFP8_CPU_INLINE Bits nan(uint32_t negative)
    {
        return Nan(negative);
    }
};

KVFP8_CPU_INLINE float bf16Magnitude(uint32_t a)
{
    return bitsFloat(a << 16);
}

/// fp16ToFp32 of a finite magnitude: moved into fp32's bit positions it is the value times
/// 2^-112 (an fp32 subnormal for fp16 subnormals), so one exact multiplication gives it.
KVFP8_CPU_INLINE float fp16Magnitude(uint32_t a)
{
    return bitsFloat(a << 13) * bitsFloat((127u + 112u) << 23);
}

using HotBf16 = HotDtype<uint16_t, 0x7FFFu, 0x7F80u, 8, bf16Magnitude, fp32ToBf16, bf16Nan>;
using HotFp16 = HotDtype<uint16_t, 0x7FFFu, 0x7C00u, 8, fp16Magnitude, fp32ToFp16Select, fp16Nan>;
using HotFp32 = HotDtype<uint32_t, 0x7FFFFFFFu, 0x7F800000u, 24, bitsFloat, floatBits, fp32Nan>;

template <class H>
KVFP8_CPU_INLINE typename H::Bits loadHot(char const* p, uint64_t i)
{
    typename H::Bits v;
    std::memcpy(&v, p + i * sizeof(v), sizeof(v));
    return v;
}

template <class H>
KVFP8_CPU_INLINE void storeHot(char* p, uint64_t i, typename H::Bits v)
{
    std::memcpy(p + i * sizeof(v), &v, sizeof(v));
}

/// Encode of one element given its block's reciprocal r > 0: x * r has the sign of x and the
/// magnitude |x| * r, so fp32ToFp8Sat(x * r) is the sign of x with fp8Magnitude(|x| * r).
/// Non-finite elements take nonFiniteCode.
template <class H, Format F>
KVFP8_CPU_INLINE uint8_t quantizeElem(uint32_t raw, float r)
{
    uint32_t const a = raw & H::kAbsMask;
    uint32_t const sign = (raw >> H::kSignShift) & 0x80u;
    uint32_t const finite = fp8Magnitude<F>(floatBits(H::magnitude(a) * r));
    uint32_t const nonFinite = (F == Format::kE5M2 && a == H::kInf) ? 0x7Cu : 0x7Fu;
    return uint8_t(sign | select(a < H::kInf, finite, nonFinite));
}

/// Decode of one element: round_to_hot(fp8ToFp32(c) * s), the canonical NaN for NaN codes.
template <class H, Format F>
KVFP8_CPU_INLINE typename H::Bits dequantizeElem(uint32_t c, float s)
{
    typename H::Bits const value = H::round(fp8Value<F>(c) * s);
    return select<typename H::Bits>(fp8IsNan(c, F), H::nan(c & 0x80u), value);
}

// ---------------------------------------------------------------------------------------------
// Loops over contiguous elements (the compiler vectorizes these) and over scale blocks
// ---------------------------------------------------------------------------------------------

/// Largest finite magnitude (bits) of n elements, 0 if none.
template <class H>
KVFP8_CPU_INLINE uint32_t finiteAmaxBits(char const* hot, uint64_t n)
{
    using Bits = typename H::Bits;
    Bits m = 0;
    for (uint64_t i = 0; i < n; ++i)
    {
        Bits const a = Bits(loadHot<H>(hot, i) & H::kAbsMask);
        m = m > a ? m : a;
    }
    if (m < H::kInf)
    {
        return m;
    }
    // Some element is NaN or infinite (rare): the maximum again without them.
    m = 0;
    for (uint64_t i = 0; i < n; ++i)
    {
        Bits const a = Bits(loadHot<H>(hot, i) & H::kAbsMask);
        m = (a < H::kInf && a > m) ? a : m;
    }
    return m;
}

template <class H, Format F>
KVFP8_CPU_INLINE void quantizeElems(char const* hot, uint64_t n, float r, uint8_t* codes)
{
    for (uint64_t i = 0; i < n; ++i)
    {
        codes[i] = quantizeElem<H, F>(loadHot<H>(hot, i), r);
    }
}

template <class H, Format F>
KVFP8_CPU_INLINE void dequantizeElems(uint8_t const* codes, uint64_t n, float s, char* hot)
{
    for (uint64_t i = 0; i < n; ++i)
    {
        storeHot<H>(hot, i, dequantizeElem<H, F>(codes[i], s));
    }
}

// A scale block is `rowElems`-element rows, `rowStride` elements apart, starting at element
// block * blockStride; its codes sit at the same element offsets in the codes region. Blocks are
// handled kGroupBlocks at a time, row by row across the group: the rows of page_head's blocks
// interleave (token t holds every head's row side by side), so this walks the buffer in memory
// order, which the hardware prefetchers follow, while a group of token_head blocks stays in L1
// between the amax and the quantize pass.
inline constexpr uint64_t kGroupBlocks = 32;

template <class H, Format F>
KVFP8_CPU_INLINE void encodeQuantized(BufferPlan const& b, char const* hot, char* cold)
{
    constexpr uint64_t esize = sizeof(typename H::Bits);
    uint8_t* codes = reinterpret_cast<uint8_t*>(cold + b.dataOffset);
    uint64_t const rows = b.blockElems / b.rowElems;
    for (uint64_t j0 = 0; j0 < b.numBlocks; j0 += kGroupBlocks)
    {
        uint64_t const nj = std::min(kGroupBlocks, b.numBlocks - j0);
        uint32_t amax[kGroupBlocks] = {};
        for (uint64_t row = 0; row < rows; ++row)
        {
            for (uint64_t j = 0; j < nj; ++j)
            {
                uint64_t const e = (j0 + j) * b.blockStride + row * b.rowStride;
                amax[j] = std::max(amax[j], finiteAmaxBits<H>(hot + e * esize, b.rowElems));
            }
        }
        float reciprocal[kGroupBlocks];
        for (uint64_t j = 0; j < nj; ++j)
        {
            BlockScale const bs = blockScale(H::magnitude(amax[j]), F);
            uint32_t const sb = floatBits(bs.scale);
            uint8_t const le[4] = {uint8_t(sb), uint8_t(sb >> 8), uint8_t(sb >> 16), uint8_t(sb >> 24)};
            std::memcpy(cold + b.scaleOffset + 4 * (j0 + j), le, 4);
            reciprocal[j] = bs.reciprocal;
        }
        for (uint64_t row = 0; row < rows; ++row)
        {
            for (uint64_t j = 0; j < nj; ++j)
            {
                uint64_t const e = (j0 + j) * b.blockStride + row * b.rowStride;
                quantizeElems<H, F>(hot + e * esize, b.rowElems, reciprocal[j], codes + e);
            }
        }
    }
    std::memset(cold + b.dataEnd, 0, b.scaleOffset - b.dataEnd);
    std::memset(cold + b.scaleEnd, 0, b.regionEnd - b.scaleEnd);
}

template <class H, Format F>
KVFP8_CPU_INLINE void decodeQuantized(BufferPlan const& b, char* hot, char const* cold)
{
    constexpr uint64_t esize = sizeof(typename H::Bits);
    uint8_t const* codes = reinterpret_cast<uint8_t const*>(cold + b.dataOffset);
    uint64_t const rows = b.blockElems / b.rowElems;
    for (uint64_t j0 = 0; j0 < b.numBlocks; j0 += kGroupBlocks)
    {
        uint64_t const nj = std::min(kGroupBlocks, b.numBlocks - j0);
        float scale[kGroupBlocks];
        for (uint64_t j = 0; j < nj; ++j)
        {
            unsigned char le[4];
            std::memcpy(le, cold + b.scaleOffset + 4 * (j0 + j), 4);
            scale[j]
                = bitsFloat(uint32_t(le[0]) | uint32_t(le[1]) << 8 | uint32_t(le[2]) << 16 | uint32_t(le[3]) << 24);
        }
        for (uint64_t row = 0; row < rows; ++row)
        {
            for (uint64_t j = 0; j < nj; ++j)
            {
                uint64_t const e = (j0 + j) * b.blockStride + row * b.rowStride;
                dequantizeElems<H, F>(codes + e, b.rowElems, scale[j], hot + e * esize);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Variants and dispatch
// ---------------------------------------------------------------------------------------------

/// The kernels of one (instruction set, hot dtype, format).
struct Kernels
{
    void (*encode)(BufferPlan const&, char const*, char*);
    void (*decode)(BufferPlan const&, char*, char const*);
    uint32_t (*amax)(char const*, uint64_t);
    void (*quantize)(char const*, uint64_t, float, uint8_t*);
    void (*dequantize)(uint8_t const*, uint64_t, float, char*);
};

// The entry points of one instruction set: the loops above inlined into functions compiled for
// it (ATTR: its target attribute, empty for the baseline).
#define KVFP8_CPU_VARIANT(NAME, ATTR)                                                                                  \
    template <class H, Format F>                                                                                       \
    ATTR void NAME##Encode(BufferPlan const& b, char const* hot, char* cold)                                           \
    {                                                                                                                  \
        encodeQuantized<H, F>(b, hot, cold);                                                                           \
    }                                                                                                                  \
    template <class H, Format F>                                                                                       \
    ATTR void NAME##Decode(BufferPlan const& b, char* hot, char const* cold)                                           \
    {                                                                                                                  \
        decodeQuantized<H, F>(b, hot, cold);                                                                           \
    }                                                                                                                  \
    template <class H>                                                                                                 \
    ATTR uint32_t NAME##Amax(char const* hot, uint64_t n)                                                              \
    {                                                                                                                  \
        return finiteAmaxBits<H>(hot, n);                                                                              \
    }                                                                                                                  \
    template <class H, Format F>                                                                                       \
    ATTR void NAME##Quantize(char const* hot, uint64_t n, float r, uint8_t* codes)                                     \
    {                                                                                                                  \
        quantizeElems<H, F>(hot, n, r, codes);                                                                         \
    }                                                                                                                  \
    template <class H, Format F>                                                                                       \
    ATTR void NAME##Dequantize(uint8_t const* codes, uint64_t n, float s, char* hot)                                   \
    {                                                                                                                  \
        dequantizeElems<H, F>(codes, n, s, hot);                                                                       \
    }                                                                                                                  \
    template <class H, Format F>                                                                                       \
    constexpr Kernels NAME##Kernels()                                                                                  \
    {                                                                                                                  \
        return {                                                                                                       \
            &NAME##Encode<H, F>, &NAME##Decode<H, F>, &NAME##Amax<H>, &NAME##Quantize<H, F>, &NAME##Dequantize<H, F>}; \
    }

KVFP8_CPU_VARIANT(portable, )
#if KVFP8_CPU_X86_VARIANTS
KVFP8_CPU_VARIANT(avx2, KVFP8_TARGET_AVX2)
KVFP8_CPU_VARIANT(avx512, KVFP8_TARGET_AVX512)
#endif
#undef KVFP8_CPU_VARIANT

constexpr Format kE4 = Format::kE4M3;
constexpr Format kE5 = Format::kE5M2;

/// [instruction set][bf16, fp16, fp32][e4m3, e5m2]
Kernels const kKernels[kNumSimd][3][2] = {
    {{portableKernels<HotBf16, kE4>(), portableKernels<HotBf16, kE5>()},
        {portableKernels<HotFp16, kE4>(), portableKernels<HotFp16, kE5>()},
        {portableKernels<HotFp32, kE4>(), portableKernels<HotFp32, kE5>()}},
#if KVFP8_CPU_X86_VARIANTS
    {{avx2Kernels<HotBf16, kE4>(), avx2Kernels<HotBf16, kE5>()},
        {avx2Kernels<HotFp16, kE4>(), avx2Kernels<HotFp16, kE5>()},
        {avx2Kernels<HotFp32, kE4>(), avx2Kernels<HotFp32, kE5>()}},
    {{avx512Kernels<HotBf16, kE4>(), avx512Kernels<HotBf16, kE5>()},
        {avx512Kernels<HotFp16, kE4>(), avx512Kernels<HotFp16, kE5>()},
        {avx512Kernels<HotFp32, kE4>(), avx512Kernels<HotFp32, kE5>()}},
#else // never selected: simdSupported() is false for both
    {{portableKernels<HotBf16, kE4>(), portableKernels<HotBf16, kE5>()},
        {portableKernels<HotFp16, kE4>(), portableKernels<HotFp16, kE5>()},
        {portableKernels<HotFp32, kE4>(), portableKernels<HotFp32, kE5>()}},
    {{portableKernels<HotBf16, kE4>(), portableKernels<HotBf16, kE5>()},
        {portableKernels<HotFp16, kE4>(), portableKernels<HotFp16, kE5>()},
        {portableKernels<HotFp32, kE4>(), portableKernels<HotFp32, kE5>()}},
#endif
};

Kernels const& kernels(Simd simd, uint32_t dtype, Format f)
{
    uint32_t const d = dtype == uint32_t(DataType::kBFloat16) ? 0 : dtype == uint32_t(DataType::kFloat16) ? 1 : 2;
    uint32_t const s = simdSupported(simd) ? uint32_t(simd) : uint32_t(Simd::kPortable);
    return kKernels[s][d][f == Format::kE4M3 ? 0 : 1];
}

bool detectAvx2() noexcept
{
#if KVFP8_CPU_X86_VARIANTS
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
#else
    return false;
#endif
}

bool detectAvx512() noexcept
{
#if KVFP8_CPU_X86_VARIANTS
    __builtin_cpu_init();
    return detectAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return false;
#endif
}

/// -1: automatic; otherwise a Simd value.
std::atomic<int> gOverride{-1};

} // namespace

char const* simdName(Simd simd) noexcept
{
    return simd == Simd::kAvx512 ? "avx512" : simd == Simd::kAvx2 ? "avx2" : "portable";
}

bool simdSupported(Simd simd) noexcept
{
    static bool const avx2 = detectAvx2();
    static bool const avx512 = detectAvx512();
    return simd == Simd::kPortable || (simd == Simd::kAvx2 && avx2) || (simd == Simd::kAvx512 && avx512);
}

Simd activeSimd() noexcept
{
    int const o = gOverride.load(std::memory_order_relaxed);
    if (o >= 0)
    {
        return Simd(o);
    }
    return simdSupported(Simd::kAvx512) ? Simd::kAvx512 : simdSupported(Simd::kAvx2) ? Simd::kAvx2 : Simd::kPortable;
}

bool overrideSimd(Simd const* simd) noexcept
{
    if (simd != nullptr && !simdSupported(*simd))
    {
        return false;
    }
    gOverride.store(simd ? int(*simd) : -1, std::memory_order_relaxed);
    return true;
}

bool simdOverride(Simd* simd) noexcept
{
    int const o = gOverride.load(std::memory_order_relaxed);
    if (o >= 0)
    {
        *simd = Simd(o);
    }
    return o >= 0;
}

void encodeBuffer(BufferPlan const& b, char const* hot, char* cold, Format f, Simd simd) noexcept
{
    if (!b.quantized)
    {
        std::memcpy(cold + b.dataOffset, hot, b.bytes);
        std::memset(cold + b.dataEnd, 0, b.regionEnd - b.dataEnd);
        return;
    }
    kernels(simd, b.dtype, f).encode(b, hot, cold);
}

void decodeBuffer(BufferPlan const& b, char* hot, char const* cold, Format f, Simd simd) noexcept
{
    if (!b.quantized)
    {
        std::memcpy(hot, cold + b.dataOffset, b.bytes);
        return;
    }
    kernels(simd, b.dtype, f).decode(b, hot, cold);
}

float finiteAmax(char const* hot, uint64_t n, uint32_t dtype, Simd simd) noexcept
{
    uint32_t const bits = kernels(simd, dtype, Format::kE4M3).amax(hot, n);
    if (dtype == uint32_t(DataType::kBFloat16))
    {
        return HotBf16::magnitude(bits);
    }
    return dtype == uint32_t(DataType::kFloat16) ? HotFp16::magnitude(bits) : HotFp32::magnitude(bits);
}

void quantizeRow(
    char const* hot, uint64_t n, uint32_t dtype, Format f, float reciprocal, uint8_t* codes, Simd simd) noexcept
{
    kernels(simd, dtype, f).quantize(hot, n, reciprocal, codes);
}

void dequantizeRow(
    uint8_t const* codes, uint64_t n, uint32_t dtype, Format f, float scale, char* hot, Simd simd) noexcept
{
    kernels(simd, dtype, f).dequantize(codes, n, scale, hot);
}

} // namespace kvcodec::fp8::cpu

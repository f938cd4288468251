// SPDX-License-Identifier: Apache-2.0
//
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF,
// chainable through `crc`): the one implementation of the SDK, its disk tier and its codecs,
// built-in or plugin, on the host and on the device. Header-only.
//
//   crc32c()             bitwise reference (host and device; the envelope's 28-byte header).
//   crc32cFast()         host, fast: carry-less multiply folding (AVX-512 with VPCLMULQDQ) on
//                        buffers of 512 bytes and more, else the CPU's CRC instruction when it
//                        has one, else slicing-by-8. crc32cCopy(): the same, copying as it goes.
//   crcMulMod() ...      the raw CRC register's algebra (host and device): pieces of a message
//                        checksummed apart (threads of a block, blocks of a batch) and joined.
//
// Host dispatch: the SSE4.2 crc32 instruction on x86-64 (checked once at run time), the ARMv8
// CRC32 extension on AArch64 (checked once at run time on Linux), else slicing-by-8 tables. The
// hardware paths run three independent streams over 3 x 4 KiB blocks and join them with a
// carry-less shift, so one core reaches several GB/s on large buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && !defined(__CUDA_ARCH__)
#include <immintrin.h>
#include <nmmintrin.h>
#define KVCODEC_CRC32C_X86 1
#elif defined(__aarch64__) && defined(__linux__) && !defined(__CUDA_ARCH__)
#include <arm_acle.h>
#include <sys/auxv.h>
#define KVCODEC_CRC32C_ARM 1
#endif

/// Marks a function for the host and the device under nvcc; nothing for a host compiler.
#if !defined(KVCODEC_HD)
#if defined(__CUDACC__)
#define KVCODEC_HD __host__ __device__
#else
#define KVCODEC_HD
#endif
#endif

/// Inlined on the device (the CRC steps sit in the kernels' inner loops); plain inline on the host.
#if !defined(KVCODEC_FORCEINLINE)
#if defined(__CUDACC__)
#define KVCODEC_FORCEINLINE __forceinline__
#else
#define KVCODEC_FORCEINLINE inline
#endif
#endif

namespace kvcodec {
/// The reflected CRC-32C polynomial.
inline constexpr uint32_t kCrc32cPoly = 0x82F63B78u;

/// CRC-32C, bitwise reference (host and device). Continue a running CRC by passing the previous
/// result as `crc`.
KVCODEC_HD KVCODEC_FORCEINLINE constexpr uint32_t crc32c(void const* data, size_t bytes, uint32_t crc = 0) noexcept
{
    auto const* p = static_cast<unsigned char const*>(data);
    crc = ~crc;
    for (size_t i = 0; i < bytes; ++i)
    {
        crc ^= p[i];
        for (int k = 0; k < 8; ++k)
        {
            crc = (crc >> 1) ^ (kCrc32cPoly & (0u - (crc & 1u)));
        }
    }
    return ~crc;
}

// ---- The raw register's algebra -------------------------------------------------------------
//
// The raw CRC register update (initial value 0, no final XOR) is linear, so the CRC of A||B is
// shift(raw(A), |B|) ^ raw(B), where shift multiplies by x^(8|B|) modulo the polynomial.
// Polynomials are reflected: bit 31 holds x^0.

/// a * b modulo the CRC-32C polynomial. Branch-free with a fixed trip count, so the compiler
/// unrolls it: the only serial chain is b's 32 steps of one multiplication by x, which keeps
/// the kernels that join pieces (a chain of these per tree level) short.
KVCODEC_HD KVCODEC_FORCEINLINE constexpr uint32_t crcMulMod(uint32_t a, uint32_t b) noexcept
{
    uint32_t p = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 31; i >= 0; --i)
    {
        p ^= b & (0u - ((a >> i) & 1u)); // a's bit i is x^(31 - i)
        b = (b >> 1) ^ (kCrc32cPoly & (0u - (b & 1u)));
    }
    return p;
}

/// Fills xpow[k] = x^(2^k) mod P for k in [0, 64).
constexpr void crcPowerTable(uint32_t* xpow) noexcept
{
    xpow[0] = 1u << 30; // x^1
    for (int k = 1; k < 64; ++k)
    {
        xpow[k] = crcMulMod(xpow[k - 1], xpow[k - 1]);
    }
}

/// x^0: the operator of an empty piece.
inline constexpr uint32_t kCrcOne = 1u << 31;

/// x^(8 * bytes) mod P; a power of two costs one table read.
KVCODEC_HD KVCODEC_FORCEINLINE constexpr uint32_t crcShiftOperator(uint64_t bytes, uint32_t const* xpow) noexcept
{
    uint32_t r = kCrcOne;
    uint64_t e = bytes;
    for (int k = 3; e != 0; ++k, e >>= 1)
    {
        if (e & 1)
        {
            r = r == kCrcOne ? xpow[k] : crcMulMod(xpow[k], r);
        }
    }
    return r;
}

/// Standard CRC-32C of a message whose raw CRC is `raw` and whose operator is `op`.
KVCODEC_HD KVCODEC_FORCEINLINE constexpr uint32_t crcFinishOp(uint32_t raw, uint32_t op) noexcept
{
    return ~(crcMulMod(op, 0xFFFFFFFFu) ^ raw);
}

/// Standard CRC-32C of a message of `bytes` whose raw CRC is `raw`.
KVCODEC_HD KVCODEC_FORCEINLINE constexpr uint32_t crcFinish(uint32_t raw, uint64_t bytes, uint32_t const* xpow) noexcept
{
    return crcFinishOp(raw, crcShiftOperator(bytes, xpow));
}

/// rawA extended by a piece B of `bytesB` bytes whose raw CRC is rawB: raw(A||B).
KVCODEC_HD KVCODEC_FORCEINLINE constexpr uint32_t crcCombine(
    uint32_t rawA, uint32_t rawB, uint64_t bytesB, uint32_t const* xpow) noexcept
{
    return crcMulMod(crcShiftOperator(bytesB, xpow), rawA) ^ rawB;
}

/// A piece of a message: its raw CRC and its operator x^(8 * its length). Pieces join without
/// knowing their lengths, at two multiplications per join.
struct CrcPiece
{
    uint32_t raw;
    uint32_t op;
};

/// The piece A||B.
KVCODEC_HD KVCODEC_FORCEINLINE constexpr CrcPiece crcJoin(CrcPiece a, CrcPiece b) noexcept
{
    if (b.op == kCrcOne)
        return a; // empty
    if (a.op == kCrcOne)
        return b;
    return CrcPiece{crcMulMod(b.op, a.raw) ^ b.raw, crcMulMod(a.op, b.op)};
}

/// Entry i of the byte table: the raw register after byte i from register 0.
KVCODEC_HD KVCODEC_FORCEINLINE constexpr uint32_t crcByteTableEntry(uint32_t i) noexcept
{
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
    {
        c = (c >> 1) ^ (kCrc32cPoly & (0u - (c & 1u)));
    }
    return c;
}

/// Raw register `c` advanced by one byte already XORed into its low byte (a zero byte: `c`
/// itself), with the byte table t0.
KVCODEC_HD KVCODEC_FORCEINLINE constexpr uint32_t crcAdvanceByte(uint32_t c, uint32_t const* t0) noexcept
{
    return (c >> 8) ^ t0[c & 0xffu];
}

/// Raw register after one little-endian 32-bit word, with slicing-by-4 tables (crcSliceTables).
KVCODEC_HD KVCODEC_FORCEINLINE constexpr uint32_t crcWord(uint32_t c, uint32_t word, uint32_t const (*t)[256]) noexcept
{
    c ^= word;
    return t[3][c & 0xffu] ^ t[2][(c >> 8) & 0xffu] ^ t[1][(c >> 16) & 0xffu] ^ t[0][c >> 24];
}

/// Raw register `c` advanced over `n` bytes at `p`: 16 bytes per step when p is 16-byte aligned.
KVCODEC_HD KVCODEC_FORCEINLINE uint32_t crcUpdate(
    uint32_t c, unsigned char const* p, uint64_t n, uint32_t const (*t)[256]) noexcept
{
    uint64_t b = 0;
    if ((reinterpret_cast<uintptr_t>(p) & 15) == 0)
    {
        for (; b + 16 <= n; b += 16)
        {
            uint32_t w[4];
#if defined(__CUDA_ARCH__)
            uint4 const v = *reinterpret_cast<uint4 const*>(p + b);
            w[0] = v.x;
            w[1] = v.y;
            w[2] = v.z;
            w[3] = v.w;
#else
            for (int j = 0; j < 4; ++j)
            {
                w[j] = uint32_t(p[b + 4 * j]) | (uint32_t(p[b + 4 * j + 1]) << 8) | (uint32_t(p[b + 4 * j + 2]) << 16)
                    | (uint32_t(p[b + 4 * j + 3]) << 24);
            }
#endif
            for (int j = 0; j < 4; ++j)
            {
                c = crcWord(c, w[j], t);
            }
        }
    }
    for (; b < n; ++b)
    {
        c = crcAdvanceByte(c ^ p[b], t[0]);
    }
    return c;
}

/// The bytes [b0, b1) of a message of `bytes` bytes that thread `t` of `threads` (a power of two)
/// checksums, with `seg` = crcSegmentBytes(bytes, threads). The message is taken as preceded by
/// zeros up to threads * seg bytes, which leaves its raw CRC unchanged: every thread's piece then
/// has seg bytes, and pieces join with operators read from the power table. b0 is congruent to
/// `bytes` modulo 16, so 16-byte aligned loads stay aligned for a multiple of 16.
KVCODEC_HD KVCODEC_FORCEINLINE void crcLeadingZeroSegment(
    uint64_t bytes, uint64_t seg, uint32_t threads, uint32_t t, uint64_t& b0, uint64_t& b1) noexcept
{
    uint64_t const z = uint64_t(threads) * seg - bytes;
    uint64_t const s = uint64_t(t) * seg;
    b0 = s > z ? s - z : 0;
    b1 = s + seg > z ? s + seg - z : 0;
}

/// Segment length used by `threads` cooperating threads on `bytes`: a power of two >= 16.
KVCODEC_HD KVCODEC_FORCEINLINE constexpr uint64_t crcSegmentBytes(uint64_t bytes, uint32_t threads) noexcept
{
    uint64_t per = (bytes + threads - 1) / threads;
    uint64_t seg = 16;
    while (seg < per)
    {
        seg <<= 1;
    }
    return seg;
}

// ---- Host tables and fast host paths ----------------------------------------------------------

namespace crc32c_detail {

struct Tables
{
    uint32_t t[8][256];
};

// Slicing tables: t[0] is the byte table; t[s][i] advances t[s-1][i] by one zero byte.
constexpr Tables makeTables() noexcept
{
    Tables tab{};
    for (uint32_t i = 0; i < 256; ++i)
    {
        tab.t[0][i] = crcByteTableEntry(i);
    }
    for (uint32_t i = 0; i < 256; ++i)
    {
        for (int s = 1; s < 8; ++s)
        {
            tab.t[s][i] = crcAdvanceByte(tab.t[s - 1][i], tab.t[0]);
        }
    }
    return tab;
}

inline constexpr Tables kTables = makeTables();

struct Powers
{
    uint32_t x[64];
};

constexpr Powers makePowers() noexcept
{
    Powers p{};
    crcPowerTable(p.x);
    return p;
}

inline constexpr Powers kPowers = makePowers();

// Raw (un-inverted) CRC state shift of `bytes` zero bytes.
inline constexpr size_t kBlock = 4096;
inline constexpr uint32_t kBlockShift = crcShiftOperator(kBlock, kPowers.x);
inline constexpr uint32_t kDoubleBlockShift = crcShiftOperator(2 * kBlock, kPowers.x);

inline uint32_t slicing8(unsigned char const* p, size_t bytes, uint32_t state) noexcept
{
    auto const& t = kTables.t;
    while (bytes >= 8)
    {
        uint64_t word;
        std::memcpy(&word, p, 8); // little-endian hosts only (x86-64, aarch64 LE)
        word ^= state;
        state = t[7][word & 0xFF] ^ t[6][(word >> 8) & 0xFF] ^ t[5][(word >> 16) & 0xFF] ^ t[4][(word >> 24) & 0xFF]
            ^ t[3][(word >> 32) & 0xFF] ^ t[2][(word >> 40) & 0xFF] ^ t[1][(word >> 48) & 0xFF] ^ t[0][word >> 56];
        p += 8;
        bytes -= 8;
    }
    while (bytes--)
    {
        state = (state >> 8) ^ t[0][(state ^ *p++) & 0xFFu];
    }
    return state;
}

#if defined(KVCODEC_CRC32C_X86)
#define KVCODEC_CRC32C_TARGET __attribute__((target("sse4.2")))
KVCODEC_CRC32C_TARGET inline uint64_t hw64(uint64_t c, uint64_t w) noexcept
{
    return _mm_crc32_u64(c, w);
}
KVCODEC_CRC32C_TARGET inline uint32_t hw8(uint32_t c, unsigned char b) noexcept
{
    return _mm_crc32_u8(c, b);
}
inline bool hardwareAvailable() noexcept
{
    static bool const has = __builtin_cpu_supports("sse4.2");
    return has;
}
#elif defined(KVCODEC_CRC32C_ARM)
#define KVCODEC_CRC32C_TARGET __attribute__((target("+crc")))
KVCODEC_CRC32C_TARGET inline uint64_t hw64(uint64_t c, uint64_t w) noexcept
{
    return __crc32cd(uint32_t(c), w);
}
KVCODEC_CRC32C_TARGET inline uint32_t hw8(uint32_t c, unsigned char b) noexcept
{
    return __crc32cb(c, b);
}
inline bool hardwareAvailable() noexcept
{
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
    static bool const has = (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
    return has;
}
#endif

#if defined(KVCODEC_CRC32C_TARGET)
/// The CRC of `bytes` at `p`; with kCopy, the bytes are also stored to `dst` in the same pass
/// (each word is loaded once: a checked copy costs about what the slower of the two costs).
template <bool kCopy>
KVCODEC_CRC32C_TARGET inline uint32_t hardwarePass(
    unsigned char const* p, unsigned char* dst, size_t bytes, uint32_t state) noexcept
{
    uint64_t c0 = state;
    // Three independent chains hide the instruction's latency (3 cycles, 1 per cycle issue).
    while (bytes >= 3 * kBlock)
    {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < kBlock; i += 8)
        {
            uint64_t w0, w1, w2;
            std::memcpy(&w0, p + i, 8);
            std::memcpy(&w1, p + kBlock + i, 8);
            std::memcpy(&w2, p + 2 * kBlock + i, 8);
            c0 = hw64(c0, w0);
            c1 = hw64(c1, w1);
            c2 = hw64(c2, w2);
            if constexpr (kCopy)
            {
                std::memcpy(dst + i, &w0, 8);
                std::memcpy(dst + kBlock + i, &w1, 8);
                std::memcpy(dst + 2 * kBlock + i, &w2, 8);
            }
        }
        // state(A||B||C) = shift(state(A), 2 blocks) ^ shift(state(B), 1 block) ^ state(C),
        // where B and C start from a zero state (raw, un-inverted CRCs are linear).
        c0 = crcMulMod(kDoubleBlockShift, uint32_t(c0)) ^ crcMulMod(kBlockShift, uint32_t(c1)) ^ uint32_t(c2);
        p += 3 * kBlock;
        dst += kCopy ? 3 * kBlock : 0;
        bytes -= 3 * kBlock;
    }
    while (bytes >= 8)
    {
        uint64_t w;
        std::memcpy(&w, p, 8);
        c0 = hw64(c0, w);
        if constexpr (kCopy)
        {
            std::memcpy(dst, &w, 8);
            dst += 8;
        }
        p += 8;
        bytes -= 8;
    }
    auto c32 = uint32_t(c0);
    while (bytes--)
    {
        if constexpr (kCopy)
        {
            *dst++ = *p;
        }
        c32 = hw8(c32, *p++);
    }
    return c32;
}

KVCODEC_CRC32C_TARGET inline uint32_t hardware(unsigned char const* p, size_t bytes, uint32_t state) noexcept
{
    return hardwarePass<false>(p, nullptr, bytes, state);
}
#endif

#if defined(KVCODEC_CRC32C_X86)
// ---- Folding with carry-less multiplies (x86-64 with AVX-512 and VPCLMULQDQ) -------------------
//
// A 16-byte piece X of the message, d bytes before a later piece, contributes to the CRC what
// lo64(X) * x^(8d + 31) + hi64(X) * x^(8d - 33) (mod P, reflected: 32-bit constants times 64-bit
// halves fit in 128 bits) contributes at the later piece's place. 32 lanes of 16 bytes fold 512
// bytes per step, then into one lane; the last 16 bytes of the folded message go through the
// CRC instruction from a zero state (the folded value equals the message modulo P), and so does
// the tail. Loads and stores are 64 bytes wide: a checked copy costs about what the copy costs.

/// x^e mod P, reflected as the raw register's algebra (bit 31 holds x^0).
constexpr uint32_t crcXPow(uint64_t e) noexcept
{
    uint32_t r = kCrcOne;
    for (int k = 0; e != 0; ++k, e >>= 1)
    {
        if (e & 1)
        {
            r = crcMulMod(kPowers.x[k], r);
        }
    }
    return r;
}

/// The two fold constants of a distance of `d` bytes (low half: the low 64 bits' multiplier).
struct FoldConstants
{
    uint64_t lo;
    uint64_t hi;
};

constexpr FoldConstants foldBy(uint64_t d) noexcept
{
    return FoldConstants{crcXPow(8 * d + 31), crcXPow(8 * d - 33)};
}

inline constexpr FoldConstants kFold16 = foldBy(16);
inline constexpr FoldConstants kFold32 = foldBy(32);
inline constexpr FoldConstants kFold48 = foldBy(48);
inline constexpr FoldConstants kFold64 = foldBy(64);
inline constexpr FoldConstants kFold256 = foldBy(256);
inline constexpr FoldConstants kFold512 = foldBy(512);

#define KVCODEC_CRC32C_FOLD_TARGET __attribute__((target("avx512f,avx512bw,vpclmulqdq,pclmul,sse4.2")))

/// Folds every 16-byte lane of x forward by the distance of k (both halves of k per lane).
KVCODEC_CRC32C_FOLD_TARGET inline __m512i fold512(__m512i x, __m512i k) noexcept
{
    return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11));
}

KVCODEC_CRC32C_FOLD_TARGET inline __m512i broadcastFold(FoldConstants k) noexcept
{
    return _mm512_set_epi64(int64_t(k.hi), int64_t(k.lo), int64_t(k.hi), int64_t(k.lo), int64_t(k.hi), int64_t(k.lo),
        int64_t(k.hi), int64_t(k.lo));
}

KVCODEC_CRC32C_FOLD_TARGET inline __m128i fold128(__m128i x, FoldConstants k) noexcept
{
    __m128i const kk = _mm_set_epi64x(int64_t(k.hi), int64_t(k.lo));
    return _mm_xor_si128(_mm_clmulepi64_si128(x, kk, 0x00), _mm_clmulepi64_si128(x, kk, 0x11));
}

/// The raw state after `bytes` (at least 512) from `state`; with kCopy also copies them to dst.
template <bool kCopy>
KVCODEC_CRC32C_FOLD_TARGET inline uint32_t foldPass(
    unsigned char const* p, unsigned char* dst, size_t bytes, uint32_t state) noexcept
{
    // Eight registers (512 bytes) in flight hide the multiplies' latency.
    __m512i x[8];
    for (int i = 0; i < 8; ++i)
    {
        x[i] = _mm512_loadu_si512(p + 64 * i);
        if constexpr (kCopy)
        {
            _mm512_storeu_si512(dst + 64 * i, x[i]);
        }
    }
    x[0] = _mm512_xor_si512(x[0], _mm512_castsi128_si512(_mm_cvtsi32_si128(int(state))));
    size_t done = 512;
    __m512i const k512 = broadcastFold(kFold512);
    for (; done + 512 <= bytes; done += 512)
    {
        for (int i = 0; i < 8; ++i)
        {
            __m512i const y = _mm512_loadu_si512(p + done + 64 * i);
            if constexpr (kCopy)
            {
                _mm512_storeu_si512(dst + done + 64 * i, y);
            }
            x[i] = _mm512_xor_si512(fold512(x[i], k512), y);
        }
    }
    // Eight registers into four (256 bytes on), four into one (64 bytes on), its four lanes into
    // the last.
    __m512i const k256 = broadcastFold(kFold256);
    for (int i = 0; i < 4; ++i)
    {
        x[i + 4] = _mm512_xor_si512(fold512(x[i], k256), x[i + 4]);
    }
    __m512i const k64 = broadcastFold(kFold64);
    __m512i v = _mm512_xor_si512(fold512(x[4], k64), x[5]);
    v = _mm512_xor_si512(fold512(v, k64), x[6]);
    v = _mm512_xor_si512(fold512(v, k64), x[7]);
    // Lanes by zero-masking extracts (the plain ones pass an undefined operand, which some
    // compilers warn about).
    __m128i r = _mm512_maskz_extracti32x4_epi32(0xF, v, 3);
    r = _mm_xor_si128(r, fold128(_mm512_maskz_extracti32x4_epi32(0xF, v, 0), kFold48));
    r = _mm_xor_si128(r, fold128(_mm512_maskz_extracti32x4_epi32(0xF, v, 1), kFold32));
    r = _mm_xor_si128(r, fold128(_mm512_maskz_extracti32x4_epi32(0xF, v, 2), kFold16));
    for (; done + 16 <= bytes; done += 16)
    {
        __m128i const y = _mm_loadu_si128(reinterpret_cast<__m128i const*>(p + done));
        if constexpr (kCopy)
        {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + done), y);
        }
        r = _mm_xor_si128(fold128(r, kFold16), y);
    }
    uint64_t c = _mm_crc32_u64(0, uint64_t(_mm_cvtsi128_si64(r)));
    c = _mm_crc32_u64(c, uint64_t(_mm_extract_epi64(r, 1)));
    auto c32 = uint32_t(c);
    for (; done < bytes; ++done)
    {
        if constexpr (kCopy)
        {
            dst[done] = p[done];
        }
        c32 = _mm_crc32_u8(c32, p[done]);
    }
    return c32;
}

/// Messages from this many bytes on take foldPass() where the CPU has what it needs.
inline constexpr size_t kFoldMinBytes = 512;

inline bool foldAvailable() noexcept
{
    static bool const has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2");
    return has;
}
#endif

} // namespace crc32c_detail

/// Slicing-by-4 tables for crcWord / crcUpdate: t[0] is the byte table; t[k][i] advances
/// t[k-1][i] by one zero byte (the first four of the host's slicing-by-8 tables).
inline void crcSliceTables(uint32_t (*t)[256]) noexcept
{
    std::memcpy(t, crc32c_detail::kTables.t, 4 * sizeof(crc32c_detail::kTables.t[0]));
}

/// CRC-32C by table lookup only (slicing-by-8); always available.
inline uint32_t crc32cSlicing8(void const* data, size_t bytes, uint32_t crc = 0) noexcept
{
    return ~crc32c_detail::slicing8(static_cast<unsigned char const*>(data), bytes, ~crc);
}

/// True when this CPU runs the hardware CRC-32C instruction that crc32cFast() uses.
inline bool crc32cHardwareAvailable() noexcept
{
#if defined(KVCODEC_CRC32C_TARGET)
    return crc32c_detail::hardwareAvailable();
#else
    return false;
#endif
}

/// True when crc32cFast() and crc32cCopy() fold buffers of crc32c_detail::kFoldMinBytes and more
/// with carry-less multiplies (x86-64 with AVX-512 and VPCLMULQDQ).
inline bool crc32cFoldAvailable() noexcept
{
#if defined(KVCODEC_CRC32C_X86)
    return crc32c_detail::foldAvailable();
#else
    return false;
#endif
}

/// CRC-32C with the CPU's CRC instruction; only valid when crc32cHardwareAvailable() is true
/// (falls back to slicing-by-8 where the target has no such instruction).
inline uint32_t crc32cHardware(void const* data, size_t bytes, uint32_t crc = 0) noexcept
{
    auto const* p = static_cast<unsigned char const*>(data);
#if defined(KVCODEC_CRC32C_TARGET)
    return ~crc32c_detail::hardware(p, bytes, ~crc);
#else
    return ~crc32c_detail::slicing8(p, bytes, ~crc);
#endif
}

namespace crc32c_detail {
/// The raw state after `bytes` at `p` from `state` by the fastest path this CPU has (folding, the
/// CRC instruction, slicing-by-8); with kCopy the bytes are also stored to `dst`.
template <bool kCopy>
inline uint32_t fastPass(unsigned char const* p, unsigned char* dst, size_t bytes, uint32_t state) noexcept
{
#if defined(KVCODEC_CRC32C_X86)
    if (bytes >= kFoldMinBytes && foldAvailable())
    {
        return foldPass<kCopy>(p, dst, bytes, state);
    }
#endif
#if defined(KVCODEC_CRC32C_TARGET)
    if (hardwareAvailable())
    {
        return hardwarePass<kCopy>(p, dst, bytes, state);
    }
#endif
    if constexpr (kCopy)
    {
        std::memcpy(dst, p, bytes);
    }
    return slicing8(p, bytes, state);
}
} // namespace crc32c_detail

/// Copies `bytes` from `src` to `dst` (not overlapping) and returns their CRC-32C, in one pass
/// over the bytes where the CPU has folding or a CRC instruction (else a copy, then slicing-by-8).
inline uint32_t crc32cCopy(void* dst, void const* src, size_t bytes, uint32_t crc = 0) noexcept
{
    return ~crc32c_detail::fastPass<true>(
        static_cast<unsigned char const*>(src), static_cast<unsigned char*>(dst), bytes, ~crc);
}

/// CRC-32C by the fastest path this CPU has: folding, else its CRC instruction, else slicing-by-8.
inline uint32_t crc32cFast(void const* data, size_t bytes, uint32_t crc = 0) noexcept
{
    return ~crc32c_detail::fastPass<false>(static_cast<unsigned char const*>(data), nullptr, bytes, ~crc);
}

} // namespace kvcodec

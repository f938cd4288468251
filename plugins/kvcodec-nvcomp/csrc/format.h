// SPDX-License-Identifier: Apache-2.0
//
// Blob format of the nvCOMP codecs (format version 1), shared by the CPU reference and the CUDA
// implementation. All integers little-endian.
//
//   [0, 32)            ColdPageEnvelope (kvcodec/codec.h): magic, version, flags, headerBytes,
//                      payloadBytes, rawBytes, CRC-32C checksum of [32, headerBytes+payloadBytes),
//                      CRC-32C of the envelope's first 28 bytes.
//   [32, 48)           codec header: u32 numChunks, u32 chunkBytes, u8 algorithm, u8 elementBytes,
//                      u8 bitshuffle (0/1), u8 zero, u32 zero.
//   [48, 48+4*numChunks) chunk table: one u32 per chunk; bit 31 set = compressed, clear = stored
//                      raw; bits 0..30 = stored bytes.
//   zero padding up to headerBytes = roundUp(48 + 4*numChunks, 16).
//   payload            chunk i at headerBytes + sum_{j<i} roundUp(stored_j, 16); padding is zero;
//                      payloadBytes = sum_j roundUp(stored_j, 16).
//
// Chunks: each pool slot of the page (pools in order) is cut into chunkBytes pieces, the last
// one shorter. The chunk data is the raw chunk, bit-shuffled first when bitshuffle is set (see
// bitShuffle below); a compressed chunk is one nvCOMP batched-API chunk of that data (for LZ4 a
// standard LZ4 block), a raw chunk is the data itself. A chunk whose compressed form is not
// smaller than the data is stored raw, so the payload never exceeds the padded raw page: the
// worst-case cold page is headerBytes + sum_j roundUp(raw_j, 16).
//
// Flags: kEnvelopeCompressed when any chunk is compressed, else kEnvelopeStoredRaw; a page whose
// blob exceeds the cold page size is written as an envelope alone with kEnvelopeDidNotFit
// (headerBytes 32, payloadBytes 0, checksum 0).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define KVNV_HD __host__ __device__ __forceinline__
#else
#define KVNV_HD inline
#endif

namespace kvcodec::nvcomp_plugin {

inline constexpr uint16_t kFormatVersion = 1;
inline constexpr uint32_t kCodecHeaderOffset = 32;
inline constexpr uint32_t kChunkTableOffset = 48;
inline constexpr uint32_t kPayloadAlign = 16;
inline constexpr uint32_t kChunkCompressedBit = 0x80000000u;
inline constexpr uint32_t kChunkSizeMask = 0x7fffffffu;

/// Algorithm identifiers stored in the codec header.
enum class Algorithm : uint8_t
{
    kLz4 = 1,
    kGdeflate = 2,
    kAns = 3,
    kZstd = 4,
};

KVNV_HD uint64_t roundUp(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

KVNV_HD uint32_t headerBytesFor(uint32_t numChunks)
{
    return uint32_t(roundUp(kChunkTableOffset + 4ull * numChunks, kPayloadAlign));
}

// Bit shuffle of one chunk of `bytes` bytes with `w`-byte little-endian elements: the first
// g = bytes / (8w) groups of 8 elements are transposed into 8w bit planes of g bytes each;
// plane p holds bit (p % 8) of byte (p / 8) of every element, element 8k+j at bit j of byte k.
// Bytes past 8wg are copied unchanged. Lossless and size-preserving.
KVNV_HD uint64_t shuffleGroups(uint64_t bytes, uint32_t w)
{
    return bytes / (8ull * w);
}

/// Shuffles group k: reads 8w bytes at in + 8wk, writes one byte into each plane.
KVNV_HD void shuffleGroup(unsigned char const* in, unsigned char* out, uint64_t groups, uint64_t k, uint32_t w)
{
    unsigned char e[32];
    for (uint32_t i = 0; i < 8 * w; ++i)
    {
        e[i] = in[8ull * w * k + i];
    }
    for (uint32_t p = 0; p < 8 * w; ++p)
    {
        uint32_t const byte = p >> 3;
        uint32_t const bit = p & 7;
        unsigned v = 0;
        for (uint32_t j = 0; j < 8; ++j)
        {
            v |= ((e[j * w + byte] >> bit) & 1u) << j;
        }
        out[uint64_t(p) * groups + k] = static_cast<unsigned char>(v);
    }
}

/// Inverse of shuffleGroup.
KVNV_HD void unshuffleGroup(unsigned char const* in, unsigned char* out, uint64_t groups, uint64_t k, uint32_t w)
{
    unsigned char e[32] = {};
    for (uint32_t p = 0; p < 8 * w; ++p)
    {
        unsigned const v = in[uint64_t(p) * groups + k];
        uint32_t const byte = p >> 3;
        uint32_t const bit = p & 7;
        for (uint32_t j = 0; j < 8; ++j)
        {
            e[j * w + byte] |= static_cast<unsigned char>(((v >> j) & 1u) << bit);
        }
    }
    for (uint32_t i = 0; i < 8 * w; ++i)
    {
        out[8ull * w * k + i] = e[i];
    }
}

/// Bitwise CRC-32C, usable on the device for the 28-byte envelope header.
KVNV_HD uint32_t crc32cBitwise(unsigned char const* p, uint32_t bytes, uint32_t crc = 0)
{
    crc = ~crc;
    for (uint32_t i = 0; i < bytes; ++i)
    {
        crc ^= p[i];
        for (int k = 0; k < 8; ++k)
        {
            crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
        }
    }
    return ~crc;
}

} // namespace kvcodec::nvcomp_plugin

namespace kvcodec::nvcomp_plugin {

// CRC-32C in pieces. The raw CRC register update (initial value 0, no final XOR) is linear, so
// the CRC of A||B is shift(raw(A), |B|) ^ raw(B), where shift multiplies by x^(8|B|) modulo the
// polynomial. Polynomials are reflected: bit 31 holds x^0.
inline constexpr uint32_t kCrc32cPoly = 0x82F63B78u;

/// a * b modulo the CRC-32C polynomial. Branch-free with a fixed trip count, so the compiler
/// unrolls it: the only serial chain is b's 32 steps of one multiplication by x, which keeps
/// the kernels that join pieces (a chain of these per tree level) short.
KVNV_HD uint32_t crcMulMod(uint32_t a, uint32_t b)
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
inline void crcPowerTable(uint32_t* xpow)
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
KVNV_HD uint32_t crcShiftOperator(uint64_t bytes, uint32_t const* xpow)
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
KVNV_HD uint32_t crcFinishOp(uint32_t raw, uint32_t op)
{
    return ~(crcMulMod(op, 0xFFFFFFFFu) ^ raw);
}

/// Standard CRC-32C of a message of `bytes` whose raw CRC is `raw`.
KVNV_HD uint32_t crcFinish(uint32_t raw, uint64_t bytes, uint32_t const* xpow)
{
    return crcFinishOp(raw, crcShiftOperator(bytes, xpow));
}

/// rawA extended by a piece B of `bytesB` bytes whose raw CRC is rawB: raw(A||B).
KVNV_HD uint32_t crcCombine(uint32_t rawA, uint32_t rawB, uint64_t bytesB, uint32_t const* xpow)
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
KVNV_HD CrcPiece crcJoin(CrcPiece a, CrcPiece b)
{
    if (b.op == kCrcOne) return a; // empty
    if (a.op == kCrcOne) return b;
    return CrcPiece{crcMulMod(b.op, a.raw) ^ b.raw, crcMulMod(a.op, b.op)};
}

/// Entry i of the byte table: the raw register after byte i from register 0.
KVNV_HD uint32_t crcByteTableEntry(uint32_t i)
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
KVNV_HD uint32_t crcAdvanceByte(uint32_t c, uint32_t const* t0)
{
    return (c >> 8) ^ t0[c & 0xffu];
}

/// Slicing-by-4 tables: t[0] is the byte table; t[k][i] advances t[k-1][i] by one zero byte.
inline void crcSliceTables(uint32_t (*t)[256])
{
    for (uint32_t i = 0; i < 256; ++i)
    {
        t[0][i] = crcByteTableEntry(i);
    }
    for (int k = 1; k < 4; ++k)
    {
        for (uint32_t i = 0; i < 256; ++i)
        {
            t[k][i] = crcAdvanceByte(t[k - 1][i], t[0]);
        }
    }
}

/// Raw register after one little-endian 32-bit word.
KVNV_HD uint32_t crcWord(uint32_t c, uint32_t word, uint32_t const (*t)[256])
{
    c ^= word;
    return t[3][c & 0xffu] ^ t[2][(c >> 8) & 0xffu] ^ t[1][(c >> 16) & 0xffu] ^ t[0][c >> 24];
}

/// Raw register `c` advanced over `n` bytes at `p`: 16 bytes per step when p is 16-byte aligned.
KVNV_HD uint32_t crcUpdate(uint32_t c, unsigned char const* p, uint64_t n, uint32_t const (*t)[256])
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
KVNV_HD void crcLeadingZeroSegment(uint64_t bytes, uint64_t seg, uint32_t threads, uint32_t t, uint64_t& b0, uint64_t& b1)
{
    uint64_t const z = uint64_t(threads) * seg - bytes;
    uint64_t const s = uint64_t(t) * seg;
    b0 = s > z ? s - z : 0;
    b1 = s + seg > z ? s + seg - z : 0;
}

/// Segment length used by `threads` cooperating threads on `bytes`: a power of two >= 16.
KVNV_HD uint64_t crcSegmentBytes(uint64_t bytes, uint32_t threads)
{
    uint64_t per = (bytes + threads - 1) / threads;
    uint64_t seg = 16;
    while (seg < per)
    {
        seg <<= 1;
    }
    return seg;
}

} // namespace kvcodec::nvcomp_plugin

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

#include "kvcodec/crc32c.h" // KVCODEC_HD, and the CRC-32C of the envelope and the checksum

// Host and device, inlined on the device.
#define KVNV_HD KVCODEC_HD KVCODEC_FORCEINLINE

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

} // namespace kvcodec::nvcomp_plugin

// nvfp4: a kvcodec cold-page codec.
//
// Blob format, version 1 (one format for the CUDA and the CPU implementation):
// the cold page of a lifecycle holds, for every pool of its hot pool group in pool order, the
// page's slot split into byte planes. With W = word_bytes and n = slotBytes / W words, plane j
// (j < W) holds byte j of every word: blob[off + j*n + i] = slot[i*W + j]. The slotBytes % W
// trailing bytes follow the planes unchanged. off = sum of the previous pools' slotBytes, so a
// cold page has exactly as many bytes as the hot page.
// Before splitting, the lowest drop_bits bits of every little-endian W-byte word are cleared
// (lossy): decoded words differ from the originals only in those bits.
//
// Byte planes group the similar bytes of 16-bit KV data (signs and exponents in one plane,
// low mantissa bytes in the other), which is what a compressor behind this transform wants.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include <kvcodec/codec_base.h>

namespace nvfp4_codec {

inline constexpr uint32_t kFormatVersion = 1;

struct Params
{
    uint32_t wordBytes = 2;
    uint32_t dropBits = 4;

    void read(kvcodec::ParamReader& r); ///< Reads the values plugin.py's schema validated.
};

/// Bytes [begin, end) of pool `pool` holding 16-bit K/V data, where drop_bits applies.
struct KernelRange
{
    uint64_t pool;
    uint64_t begin;
    uint64_t end;

    bool operator==(KernelRange const& o) const
    {
        return pool == o.pool && begin == o.begin && end == o.end;
    }
};

/// Largest number of index pairs passed by value in one launch (host page indices).
inline constexpr uint32_t kPairsPerLaunch = 512;

struct KernelArgs
{
    kvcodec::ChunkedPool const* pools; ///< Device array: the hot pool group's pools.
    uint32_t numPools;
    uint32_t encode;
    uint32_t wordBytes;
    uint32_t dropBits;
    KernelRange const* ranges; ///< Device array: the lifecycle's lossy ranges (used when dropBits > 0).
    uint32_t numRanges;
    uint64_t chunksPerPage;
    uint64_t pageBytes;
    uint64_t numHotSlots;
    uint64_t numPairs;
    uint64_t blob;
    kvcodec::PageIndexPair const* devicePairs; ///< Device indices, or null when `hostPairs` is used.
    kvcodec::PageIndexPair hostPairs[kPairsPerLaunch];
};

/// Bytes of one pool processed by one thread block.
inline constexpr uint64_t kChunkBytes = 8192;

/// Loads the kernel now (at configure): with lazy module loading a first launch can wait for
/// work already queued on the device, and encode/decode must never wait.
cudaError_t preloadKernel() noexcept;

/// Enqueues one launch on `stream` covering every (page, pool, chunk) of `args`.
cudaError_t launchKernel(KernelArgs const& args, int numSms, cudaStream_t stream) noexcept;

/// The codec's factory (its PyCapsule is what the Python plugin registers).
KvcodecCodecFactory const* codecFactory() noexcept;

} // namespace nvfp4_codec

// SPDX-License-Identifier: Apache-2.0
#include "nvcomp_ops.h"

namespace kvcodec::nvcomp_plugin {
namespace {

#define KVNV_DEFINE_OPS(CLASS, X)                                                                                      \
    class CLASS final : public NvcompOps                                                                               \
    {                                                                                                                  \
    public:                                                                                                            \
        CLASS(nvcompBatched##X##CompressOpts_t c, nvcompBatched##X##DecompressOpts_t d)                                \
            : c_(c)                                                                                                    \
            , d_(d)                                                                                                    \
        {                                                                                                              \
        }                                                                                                              \
        nvcompStatus_t maxCompressedChunk(size_t chunk, size_t* out) const override                                    \
        {                                                                                                              \
            return nvcompBatched##X##CompressGetMaxOutputChunkSize(chunk, c_, out);                                    \
        }                                                                                                              \
        nvcompStatus_t compressAlignment(nvcompAlignmentRequirements_t* out) const override                            \
        {                                                                                                              \
            return nvcompBatched##X##CompressGetRequiredAlignments(c_, out);                                           \
        }                                                                                                              \
        nvcompStatus_t decompressAlignment(nvcompAlignmentRequirements_t* out) const override                          \
        {                                                                                                              \
            return nvcompBatched##X##DecompressGetRequiredAlignments(d_, out);                                         \
        }                                                                                                              \
        nvcompStatus_t compressTemp(size_t n, size_t chunk, size_t total, size_t* temp, cudaStream_t s) const override \
        {                                                                                                              \
            return nvcompBatched##X##CompressGetTempSize(n, chunk, c_, temp, total, s);                                \
        }                                                                                                              \
        nvcompStatus_t decompressTemp(                                                                                 \
            size_t n, size_t chunk, size_t total, size_t* temp, cudaStream_t s) const override                         \
        {                                                                                                              \
            return nvcompBatched##X##DecompressGetTempSize(n, chunk, d_, temp, total, s);                              \
        }                                                                                                              \
        nvcompStatus_t compress(void const* const* in, size_t const* inBytes, size_t maxChunk, size_t n, void* temp,   \
            size_t tempBytes, void* const* out, size_t* outBytes, nvcompStatus_t* st, cudaStream_t s) const override   \
        {                                                                                                              \
            return nvcompBatched##X##CompressAsync(                                                                    \
                in, inBytes, maxChunk, n, temp, tempBytes, out, outBytes, c_, st, s);                                  \
        }                                                                                                              \
        nvcompStatus_t decompress(void const* const* in, size_t const* inBytes, size_t const* capacity,                \
            size_t* actual, size_t n, void* temp, size_t tempBytes, void* const* out, nvcompStatus_t* st,              \
            cudaStream_t s) const override                                                                             \
        {                                                                                                              \
            return nvcompBatched##X##DecompressAsync(                                                                  \
                in, inBytes, capacity, actual, n, temp, tempBytes, out, d_, st, s);                                    \
        }                                                                                                              \
                                                                                                                       \
    private:                                                                                                           \
        nvcompBatched##X##CompressOpts_t c_;                                                                           \
        nvcompBatched##X##DecompressOpts_t d_;                                                                         \
    };

KVNV_DEFINE_OPS(Lz4Ops, LZ4)
KVNV_DEFINE_OPS(GdeflateOps, Gdeflate)
KVNV_DEFINE_OPS(AnsOps, ANS)
KVNV_DEFINE_OPS(ZstdOps, Zstd)

#undef KVNV_DEFINE_OPS

} // namespace

std::unique_ptr<NvcompOps> makeNvcompOps(Algorithm algorithm, uint32_t elementBytes)
{
    switch (algorithm)
    {
    case Algorithm::kLz4:
    {
        // The element width steers LZ4's match search; the block format stays standard LZ4.
        nvcompBatchedLZ4CompressOpts_t c = nvcompBatchedLZ4CompressDefaultOpts;
        c.data_type = elementBytes == 4 ? NVCOMP_TYPE_INT : elementBytes == 2 ? NVCOMP_TYPE_SHORT : NVCOMP_TYPE_CHAR;
        return std::make_unique<Lz4Ops>(c, nvcompBatchedLZ4DecompressDefaultOpts);
    }
    case Algorithm::kGdeflate:
        return std::make_unique<GdeflateOps>(
            nvcompBatchedGdeflateCompressDefaultOpts, nvcompBatchedGdeflateDecompressDefaultOpts);
    case Algorithm::kAns:
    {
        // nvCOMP's float16 model applies to every 16-bit float format (bf16 too); decompression
        // reads the type from the bitstream.
        nvcompBatchedANSCompressOpts_t c = nvcompBatchedANSCompressDefaultOpts;
        nvcompBatchedANSDecompressOpts_t d = nvcompBatchedANSDecompressDefaultOpts;
        c.data_type = elementBytes == 4 ? NVCOMP_TYPE_FLOAT32
            : elementBytes == 2         ? NVCOMP_TYPE_FLOAT16
                                        : NVCOMP_TYPE_CHAR;
        return std::make_unique<AnsOps>(c, d);
    }
    case Algorithm::kZstd:
        return std::make_unique<ZstdOps>(nvcompBatchedZstdCompressDefaultOpts, nvcompBatchedZstdDecompressDefaultOpts);
    }
    return nullptr;
}

} // namespace kvcodec::nvcomp_plugin

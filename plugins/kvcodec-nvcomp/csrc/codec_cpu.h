// SPDX-License-Identifier: Apache-2.0
//
// CPU reference of the nvCOMP codecs (codec_cpu.cpp): host pointers, synchronous, stream ignored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "codec.h"

namespace kvcodec::nvcomp_plugin {

struct ChunkLists;

class NvcompCodecCpu final : public NvcompCodec
{
public:
    /// Throws CodecCreateError for an algorithm without a CPU coder (nvcomp-ans, nvcomp-zstd).
    explicit NvcompCodecCpu(Params const& params);

private:
    bool planBackend() override
    {
        return true;
    }

    PageIndexLocation pageIndexLocation(HotLayout::LifeCycle const&) const override
    {
        return PageIndexLocation::kHost;
    }

    bool submit(CodecCall const& call) override;

    void compressChunks(std::vector<uint8_t const*> const& data, std::vector<size_t> const& raw,
        std::vector<std::vector<uint8_t>>& out, std::vector<size_t>& sizes) const;
    void decompressChunks(ChunkLists const& l, std::vector<uint8_t>& failed) const;
    void encodeWindow(HotLayout::Group const& group, GroupPlan const& plan, uintptr_t blobBase,
        PageIndexPair const* pairs, size_t m) const;
    void writeBlob(HotLayout::Group const& group, GroupPlan const& plan, uint8_t* blob, uint8_t const* const* data,
        size_t const* raw, std::vector<uint8_t> const* packed, size_t const* sizes) const;
    void decodeWindow(HotLayout::Group const& group, GroupPlan const& plan, uintptr_t blobBase,
        PageIndexPair const* pairs, size_t first, size_t m, std::vector<std::vector<uint8_t>>& pages, uint8_t* status,
        std::string* why) const;
    uint8_t parseBlob(HotLayout::Group const& group, GroupPlan const& plan, uint8_t const* blob, uint8_t* page,
        size_t j, ChunkLists& lists, std::string* why) const;
};

} // namespace kvcodec::nvcomp_plugin

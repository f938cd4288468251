// SPDX-License-Identifier: Apache-2.0
#include "workspace.h"

#include <algorithm>
#include <stdexcept>

namespace kvcodec::nvcomp_plugin {
namespace {

void require(nvcompStatus_t st, char const* what)
{
    if (st != nvcompSuccess)
    {
        throw std::runtime_error(std::string(what) + " failed: nvcompStatus_t " + std::to_string(int(st)));
    }
}

bool aligned(uint64_t v, uint64_t a)
{
    return a <= 1 || v % a == 0;
}

struct Temp
{
    size_t compress = 0;
    size_t decompress = 0;
};

} // namespace

WorkspacePlan planWorkspace(
    Params const& options, HotLayout const& layout, std::vector<GroupPlan>& plans, NvcompOps const& ops)
{
    WorkspacePlan w;
    nvcompAlignmentRequirements_t ca{}, da{};
    require(ops.compressAlignment(&ca), "nvCOMP compress alignment query");
    require(ops.decompressAlignment(&da), "nvCOMP decompress alignment query");
    if (std::max({ca.input, ca.output, da.output}) > kStagingAlign)
    {
        throw std::runtime_error("nvCOMP asks for buffer alignments above " + std::to_string(kStagingAlign) + " bytes");
    }
    for (size_t g = 0; g < plans.size(); ++g)
    {
        auto const& group = layout.groups()[g];
        bool inOk = true, outOk = true;
        for (auto const& c : plans[g].chunks)
        {
            auto const& pool = group.pools[c.pool];
            w.maxChunkBytes = std::max<uint64_t>(w.maxChunkBytes, c.bytes);
            inOk = inOk && aligned(pool.base, ca.input) && aligned(pool.slotBytes, ca.input)
                && aligned(c.offset, ca.input);
            outOk = outOk && aligned(pool.base, da.output) && aligned(pool.slotBytes, da.output)
                && aligned(c.offset, da.output);
        }
        w.encodeDirect.push_back(!options.bitshuffle && inOk);
        w.decodeDirect.push_back(!options.bitshuffle && outOk);
        w.encodeStaging = w.encodeStaging || !w.encodeDirect.back();
        w.decodeStaging = w.decodeStaging || !w.decodeDirect.back();
    }
    w.decodeMaxChunkBytes = std::max(w.maxChunkBytes, kDummyRawBytes);

    // Staged chunks sit at a stride of the largest real chunk, not of chunk_bytes: a layout of
    // 32-byte slots must not reserve 64 KiB per chunk.
    size_t maxOut = 0;
    require(ops.maxCompressedChunk(w.maxChunkBytes, &maxOut), "nvCOMP max chunk size query");
    w.maxCompressedChunk = maxOut;
    w.chunkStride = roundUp(w.maxChunkBytes, kStagingAlign);
    w.compStride = roundUp(maxOut, kStagingAlign);

    auto measure = [&]() {
        w.maxChunks = w.maxPages = w.blobBytes = w.compressTotalBytes = 0;
        for (size_t g = 0; g < plans.size(); ++g)
        {
            auto const& plan = plans[g];
            w.maxChunks = std::max<uint64_t>(w.maxChunks, plan.maxPagesPerBatch * plan.chunks.size());
            w.maxPages = std::max<uint64_t>(w.maxPages, plan.maxPagesPerBatch);
            w.blobBytes
                = std::max<uint64_t>(w.blobBytes, plan.maxPagesPerBatch * roundUp(plan.coldBytes, kStagingAlign));
            w.compressTotalBytes
                = std::max<uint64_t>(w.compressTotalBytes, plan.maxPagesPerBatch * layout.groups()[g].pageBytes);
        }
        Temp t;
        require(ops.compressTemp(w.maxChunks, w.maxChunkBytes, w.compressTotalBytes, &t.compress, nullptr),
            "nvCOMP compress temp-size query");
        require(ops.decompressTemp(
                    w.maxChunks, w.decodeMaxChunkBytes, w.maxChunks * w.decodeMaxChunkBytes, &t.decompress, nullptr),
            "nvCOMP decompress temp-size query");
        w.compressTempBytes = t.compress;
        w.decompressTempBytes = t.decompress;
    };

    // The budget: what a max_batch_bytes batch of full chunk_bytes chunks needs anyway, at least
    // kTempBudgetFloor. Per-chunk temp costs (LZ4's hash table, gdeflate's match state) would
    // otherwise reach gigabytes for layouts of tiny slots.
    uint64_t const fullChunks = std::max<uint64_t>(1, options.maxBatchBytes / options.chunkBytes);
    Temp full;
    require(ops.compressTemp(fullChunks, options.chunkBytes, fullChunks * options.chunkBytes, &full.compress, nullptr),
        "nvCOMP compress temp-size query");
    require(ops.decompressTemp(fullChunks, std::max(options.chunkBytes, kDummyRawBytes),
                fullChunks * std::max(options.chunkBytes, kDummyRawBytes), &full.decompress, nullptr),
        "nvCOMP decompress temp-size query");
    w.tempBudget = std::max<uint64_t>({kTempBudgetFloor, full.compress, full.decompress});

    measure();
    while (std::max(w.compressTempBytes, w.decompressTempBytes) > w.tempBudget && w.maxPages > 1)
    {
        // Halve the chunk count of the largest batches; a batch keeps at least one page.
        uint64_t const cap = w.maxChunks / 2;
        for (auto& plan : plans)
        {
            uint64_t const pages = std::max<uint64_t>(1, cap / plan.chunks.size());
            plan.maxPagesPerBatch = std::min(plan.maxPagesPerBatch, pages);
        }
        measure();
    }

    // Per chunk: nvCOMP's tables, the chunk entry or kind, its offset and its 8-byte CRC piece; per page
    // a 24-byte state. Encode writes payloads straight into the cold slots (no blob staging);
    // decode stages the used bytes of each blob.
    uint64_t const tables
        = sizeof(void*) * 2 + sizeof(size_t) * 2 + sizeof(nvcompStatus_t) + sizeof(uint32_t) + sizeof(uint64_t) + 8;
    w.encodeLaneBytes = w.maxChunks * (tables + w.compStride + (w.encodeStaging ? w.chunkStride : 0)) + 24 * w.maxPages
        + w.compressTempBytes;
    uint64_t const dtables = sizeof(void*) * 2 + sizeof(size_t) * 3 + sizeof(nvcompStatus_t) + 1 + sizeof(uint64_t) + 8;
    w.decodeLaneBytes = w.maxChunks * (dtables + kDummyRawBytes + (w.decodeStaging ? w.chunkStride : 0)) + w.blobBytes
        + 24 * w.maxPages + w.decompressTempBytes;
    return w;
}

} // namespace kvcodec::nvcomp_plugin

// SPDX-License-Identifier: Apache-2.0
//
// CPU reference of the nvCOMP codecs' blob format (format.h): host pointers, synchronous,
// stream ignored. LZ4 chunks use the plugin's own block coder (lz4_block.h); gdeflate chunks use
// nvCOMP's CPU library, whose batched gdeflate functions read and write the GPU chunk format.
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include <nvcomp/native/gdeflate_cpu.h>

#include "codec_base.h"
#include "codec_factories.h"
#include "lz4_block.h"

namespace kvcodec::nvcomp_plugin {
namespace {

void shuffleChunk(uint8_t const* in, uint8_t* out, uint64_t bytes, uint32_t w)
{
    uint64_t const groups = shuffleGroups(bytes, w);
    for (uint64_t k = 0; k < groups; ++k)
    {
        shuffleGroup(in, out, groups, k, w);
    }
    std::memcpy(out + groups * 8 * w, in + groups * 8 * w, bytes - groups * 8 * w);
}

void unshuffleChunk(uint8_t const* in, uint8_t* out, uint64_t bytes, uint32_t w)
{
    uint64_t const groups = shuffleGroups(bytes, w);
    for (uint64_t k = 0; k < groups; ++k)
    {
        unshuffleGroup(in, out, groups, k, w);
    }
    std::memcpy(out + groups * 8 * w, in + groups * 8 * w, bytes - groups * 8 * w);
}

void put32(uint8_t* p, uint32_t v)
{
    std::memcpy(p, &v, 4);
}

uint32_t get32(uint8_t const* p)
{
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

char const* statusText(EnvelopeStatus s)
{
    switch (s)
    {
    case EnvelopeStatus::kOk: return "ok";
    case EnvelopeStatus::kBadMagic: return "bad magic";
    case EnvelopeStatus::kBadFormatVersion: return "wrong format version";
    case EnvelopeStatus::kBadHeader: return "bad header (header CRC or sizes)";
    case EnvelopeStatus::kDidNotFit: return "the page did not fit its cold slot when encoded (a miss)";
    case EnvelopeStatus::kBadChecksum: return "checksum mismatch";
    }
    return "unknown";
}

class NvcompCodecCpu final : public NvcompCodecBase
{
public:
    using NvcompCodecBase::NvcompCodecBase;

private:
    bool configureBackend() override
    {
        return true;
    }

    PageIndexLocation location() const noexcept override
    {
        return PageIndexLocation::kHost;
    }

    // Compresses every chunk (data[c], raw[c] bytes) into out[c]; sizes[c] = compressed size, or
    // 0 when it did not shrink. gdeflate goes through nvCOMP's CPU library in one batched call
    // per page (its per-call set-up dominates small chunks).
    void compressChunks(std::vector<uint8_t const*> const& data, std::vector<size_t> const& raw,
        std::vector<std::vector<uint8_t>>& out, std::vector<size_t>& sizes) const
    {
        size_t const n = data.size();
        out.resize(n);
        sizes.assign(n, 0);
        if (options_.algorithm == Algorithm::kLz4)
        {
            for (size_t c = 0; c < n; ++c)
            {
                out[c].resize(lz4::compressBound(raw[c]));
                sizes[c] = lz4::compress(data[c], raw[c], out[c].data(), raw[c] - 1);
            }
            return;
        }
        if (options_.algorithm != Algorithm::kGdeflate)
        {
            throw std::runtime_error(std::string(algorithmInfo(options_.algorithm).name) + " has no CPU implementation");
        }
        size_t cap = 0;
        nvcomp::gdeflate::compressCPUGetMaxOutputChunkSize(options_.chunkBytes, &cap);
        std::vector<void const*> in(data.begin(), data.end());
        std::vector<void*> outs(n);
        for (size_t c = 0; c < n; ++c)
        {
            out[c].resize(cap);
            outs[c] = out[c].data();
        }
        // Level 1: the CPU reference needs the format, not the best ratio (level 12, the default, runs
        // at a few MB/s).
        nvcomp::gdeflate::compressCPU(in.data(), raw.data(), options_.chunkBytes, n, outs.data(), sizes.data(), 1);
        for (size_t c = 0; c < n; ++c)
        {
            sizes[c] = sizes[c] < raw[c] ? sizes[c] : 0;
        }
    }

    // Decompresses chunks; returns the index of the first that does not decode to exactly
    // raw[c] bytes, or -1.
    int64_t decompressChunks(std::vector<uint8_t const*> const& in, std::vector<size_t> const& inBytes,
        std::vector<uint8_t*> const& out, std::vector<size_t> const& raw) const
    {
        size_t const n = in.size();
        if (options_.algorithm == Algorithm::kLz4)
        {
            for (size_t c = 0; c < n; ++c)
            {
                if (lz4::decompress(in[c], inBytes[c], out[c], raw[c]) != int64_t(raw[c])) return int64_t(c);
            }
            return -1;
        }
        if (n == 0) return -1;
        std::vector<void const*> ins(in.begin(), in.end());
        std::vector<void*> outs(out.begin(), out.end());
        std::vector<size_t> got(n, 0);
        std::vector<size_t> capacity(raw); // the API takes a mutable array
        nvcomp::gdeflate::decompressCPU(ins.data(), inBytes.data(), n, outs.data(), capacity.data(), got.data());
        for (size_t c = 0; c < n; ++c)
        {
            if (got[c] != raw[c]) return int64_t(c);
        }
        return -1;
    }

    bool submit(PoolGroupIndex g, uintptr_t blobBase, PageIndexPair const* pairs, size_t n, cudaStream_t,
        bool encode) override
    {
        auto const& group = layout_.groups()[g];
        auto const& plan = plans_[g];
        for (size_t i = 0; i < n; ++i)
        {
            int32_t const hot = encode ? pairs[i].src : pairs[i].dst;
            int32_t const cold = encode ? pairs[i].dst : pairs[i].src;
            if (hot < 0 || uint64_t(hot) >= group.numSlots)
            {
                return fail("pageIndices[" + std::to_string(i) + "]." + (encode ? "src" : "dst") + " is "
                    + std::to_string(hot) + "; hot slot indices are 0.." + std::to_string(group.numSlots - 1));
            }
            if (cold < 0)
            {
                return fail("pageIndices[" + std::to_string(i) + "]." + (encode ? "dst" : "src") + " is "
                    + std::to_string(cold) + "; cold slot indices must be >= 0");
            }
        }
        if (encode)
        {
            for (size_t first = 0; first < n; first += kWindowPages)
            {
                encodeWindow(group, plan, blobBase, pairs + first, std::min(kWindowPages, n - first));
            }
            return true;
        }
        // Every blob is checked and decoded into scratch before any hot slot is written: a bad
        // blob fails the call and leaves the hot pages untouched.
        std::vector<std::vector<uint8_t>> pages(n);
        for (size_t first = 0; first < n; first += kWindowPages)
        {
            std::string err = decodeWindow(group, plan, blobBase, pairs, first, std::min(kWindowPages, n - first), pages);
            if (!err.empty())
            {
                return fail("decode(): " + err + "; no hot page was written");
            }
        }
        for (size_t i = 0; i < n; ++i)
        {
            uint64_t off = 0;
            for (size_t p = 0; p < group.pools.size(); ++p)
            {
                auto const& pool = group.pools[p];
                std::memcpy(reinterpret_cast<void*>(pool.base + uint64_t(pairs[i].dst) * pool.slotBytes),
                    pages[i].data() + off, pool.slotBytes);
                off += pool.slotBytes;
            }
        }
        return true;
    }

    // Pages compressed together: nvCOMP's CPU gdeflate has a large fixed cost per call.
    static constexpr size_t kWindowPages = 1024;

    void encodeWindow(HotLayout::Group const& group, GroupPlan const& plan, uintptr_t blobBase,
        PageIndexPair const* pairs, size_t m) const
    {
        uint32_t const numChunks = uint32_t(plan.chunks.size());
        std::vector<std::vector<uint8_t>> shuffled(options_.bitshuffle ? m * numChunks : 0);
        std::vector<uint8_t const*> data(m * numChunks);
        std::vector<size_t> raw(m * numChunks);
        for (size_t i = 0; i < m; ++i)
        {
            for (uint32_t c = 0; c < numChunks; ++c)
            {
                size_t const k = i * numChunks + c;
                auto const& chunk = plan.chunks[c];
                auto const& pool = group.pools[chunk.pool];
                data[k] = reinterpret_cast<uint8_t const*>(pool.base + uint64_t(pairs[i].src) * pool.slotBytes + chunk.offset);
                raw[k] = chunk.bytes;
                if (options_.bitshuffle)
                {
                    shuffled[k].resize(chunk.bytes);
                    shuffleChunk(data[k], shuffled[k].data(), chunk.bytes, options_.elementBytes);
                    data[k] = shuffled[k].data();
                }
            }
        }
        std::vector<std::vector<uint8_t>> packed;
        std::vector<size_t> sizes;
        compressChunks(data, raw, packed, sizes);
        for (size_t i = 0; i < m; ++i)
        {
            size_t const k0 = i * numChunks;
            writeBlob(group, plan, reinterpret_cast<uint8_t*>(blobBase + uint64_t(pairs[i].dst) * plan.coldBytes),
                &data[k0], &raw[k0], &packed[k0], &sizes[k0]);
        }
    }

    void writeBlob(HotLayout::Group const& group, GroupPlan const& plan, uint8_t* blob, uint8_t const* const* data,
        size_t const* raw, std::vector<uint8_t> const* packed, size_t const* sizes) const
    {
        uint32_t const numChunks = uint32_t(plan.chunks.size());
        std::vector<uint8_t> out(plan.boundBytes, 0);
        put32(&out[32], numChunks);
        put32(&out[36], uint32_t(options_.chunkBytes));
        out[40] = uint8_t(options_.algorithm);
        out[41] = uint8_t(options_.elementBytes);
        out[42] = options_.bitshuffle ? 1 : 0;
        uint64_t pos = plan.headerBytes;
        bool anyCompressed = false;
        for (uint32_t c = 0; c < numChunks; ++c)
        {
            bool const compressed = sizes[c] != 0 && sizes[c] < raw[c];
            uint32_t const stored = uint32_t(compressed ? sizes[c] : raw[c]);
            std::memcpy(&out[pos], compressed ? packed[c].data() : data[c], stored);
            put32(&out[kChunkTableOffset + 4 * c], stored | (compressed ? kChunkCompressedBit : 0));
            pos += roundUp(stored, kPayloadAlign);
            anyCompressed = anyCompressed || compressed;
        }
        ColdPageEnvelope env{};
        env.magic = kColdPageEnvelopeMagic;
        env.formatVersion = kFormatVersion;
        env.rawBytes = group.pageBytes;
        if (pos > plan.coldBytes)
        {
            env.flags = kEnvelopeDidNotFit;
            env.headerBytes = sizeof(ColdPageEnvelope);
            pos = sizeof(ColdPageEnvelope);
        }
        else
        {
            env.flags = anyCompressed ? kEnvelopeCompressed : kEnvelopeStoredRaw;
            env.headerBytes = plan.headerBytes;
            env.payloadBytes = uint32_t(pos - plan.headerBytes);
            env.checksum = crc32c(&out[32], pos - 32);
        }
        env.headerCrc = crc32c(&env, offsetof(ColdPageEnvelope, headerCrc));
        std::memcpy(out.data(), &env, sizeof(env));
        std::memcpy(blob, out.data(), pos);
    }

    // Checks and decodes pages [first, first + m) of the call into pages[]; returns an empty
    // string, or the reason naming the page.
    std::string decodeWindow(HotLayout::Group const& group, GroupPlan const& plan, uintptr_t blobBase,
        PageIndexPair const* pairs, size_t first, size_t m, std::vector<std::vector<uint8_t>>& pages) const
    {
        std::vector<std::vector<uint8_t>> scratch(options_.bitshuffle ? m : 0);
        std::vector<uint8_t const*> cin;
        std::vector<size_t> cinBytes, craw, cpage;
        std::vector<uint8_t*> cout;
        std::vector<uint32_t> cchunk;
        auto where = [&](size_t i) {
            return "pageIndices[" + std::to_string(i) + "] (cold slot " + std::to_string(pairs[i].src) + "): ";
        };
        for (size_t j = 0; j < m; ++j)
        {
            size_t const i = first + j;
            auto const* blob = reinterpret_cast<uint8_t const*>(blobBase + uint64_t(pairs[i].src) * plan.coldBytes);
            pages[i].resize(group.pageBytes);
            uint8_t* dst = pages[i].data();
            if (options_.bitshuffle)
            {
                scratch[j].resize(group.pageBytes);
                dst = scratch[j].data();
            }
            std::string err = parseBlob(group, plan, blob, dst, cin, cinBytes, cout, craw, cchunk);
            if (!err.empty())
            {
                return where(i) + err;
            }
            cpage.resize(cin.size(), i);
        }
        int64_t const bad = decompressChunks(cin, cinBytes, cout, craw);
        if (bad >= 0)
        {
            uint32_t const c = cchunk[size_t(bad)];
            return where(cpage[size_t(bad)]) + "chunk " + std::to_string(c) + " does not decompress to "
                + std::to_string(plan.chunks[c].bytes) + " bytes";
        }
        if (options_.bitshuffle)
        {
            std::vector<uint64_t> poolOffset = poolOffsets(group);
            for (size_t j = 0; j < m; ++j)
            {
                for (auto const& chunk : plan.chunks)
                {
                    uint64_t const at = poolOffset[chunk.pool] + chunk.offset;
                    unshuffleChunk(scratch[j].data() + at, pages[first + j].data() + at, chunk.bytes, options_.elementBytes);
                }
            }
        }
        return {};
    }

    static std::vector<uint64_t> poolOffsets(HotLayout::Group const& group)
    {
        std::vector<uint64_t> off(group.pools.size(), 0);
        for (size_t p = 1; p < group.pools.size(); ++p)
        {
            off[p] = off[p - 1] + group.pools[p - 1].slotBytes;
        }
        return off;
    }

    // Checks one blob (envelope, checksum, codec header, chunk table), copies its raw chunks to
    // `page` and appends its compressed chunks to the lists. Returns an empty string or the reason.
    std::string parseBlob(HotLayout::Group const& group, GroupPlan const& plan, uint8_t const* blob, uint8_t* page,
        std::vector<uint8_t const*>& cin, std::vector<size_t>& cinBytes, std::vector<uint8_t*>& cout,
        std::vector<size_t>& craw, std::vector<uint32_t>& cchunk) const
    {
        EnvelopeStatus const st = checkColdPageEnvelope(blob, plan.coldBytes, kFormatVersion);
        if (st != EnvelopeStatus::kOk)
        {
            return std::string("envelope check failed: ") + statusText(st);
        }
        ColdPageEnvelope env;
        std::memcpy(&env, blob, sizeof(env));
        uint32_t const numChunks = uint32_t(plan.chunks.size());
        if (env.rawBytes != group.pageBytes || env.headerBytes != plan.headerBytes || get32(blob + 32) != numChunks
            || get32(blob + 36) != options_.chunkBytes || blob[40] != uint8_t(options_.algorithm)
            || blob[41] != options_.elementBytes || blob[42] != (options_.bitshuffle ? 1 : 0))
        {
            return "the blob was written with another layout or parameters (raw bytes, chunk count, chunk_bytes, "
                   "algorithm, data_type or bitshuffle differ)";
        }
        std::vector<uint64_t> const poolOffset = poolOffsets(group);
        uint64_t const end = uint64_t(env.headerBytes) + env.payloadBytes;
        uint64_t pos = env.headerBytes;
        for (uint32_t c = 0; c < numChunks; ++c)
        {
            auto const& chunk = plan.chunks[c];
            uint32_t const entry = get32(blob + kChunkTableOffset + 4 * c);
            uint32_t const stored = entry & kChunkSizeMask;
            bool const compressed = (entry & kChunkCompressedBit) != 0;
            if (pos + stored > end || (!compressed && stored != chunk.bytes) || (compressed && stored >= chunk.bytes))
            {
                return "chunk " + std::to_string(c) + " table entry is invalid";
            }
            uint8_t* target = page + poolOffset[chunk.pool] + chunk.offset;
            if (compressed)
            {
                cin.push_back(blob + pos);
                cinBytes.push_back(stored);
                cout.push_back(target);
                craw.push_back(chunk.bytes);
                cchunk.push_back(c);
            }
            else
            {
                std::memcpy(target, blob + pos, stored);
            }
            pos += roundUp(stored, kPayloadAlign);
        }
        if (pos != end)
        {
            return "payloadBytes " + std::to_string(env.payloadBytes) + " disagrees with the chunk table";
        }
        return {};
    }
};

} // namespace

IKvCacheColdPageCodec* createCpuCodec(CodecOptions const& options, std::string& error)
{
    if (!algorithmInfo(options.algorithm).hasCpu)
    {
        error = std::string(algorithmInfo(options.algorithm).name)
            + " has no CPU implementation: nvCOMP's CPU library offers no coder of its chunk format; use device='cuda'";
        return nullptr;
    }
    return new NvcompCodecCpu(options);
}

} // namespace kvcodec::nvcomp_plugin

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

    // Compresses `data` into `out`; returns the size, or 0 when it does not shrink.
    size_t compressChunk(uint8_t const* data, size_t bytes, std::vector<uint8_t>& out) const
    {
        switch (options_.algorithm)
        {
        case Algorithm::kLz4:
        {
            out.resize(lz4::compressBound(bytes));
            size_t const n = lz4::compress(data, bytes, out.data(), bytes - 1);
            return n;
        }
        case Algorithm::kGdeflate:
        {
            size_t cap = 0;
            nvcomp::gdeflate::compressCPUGetMaxOutputChunkSize(bytes, &cap);
            out.resize(cap);
            void const* in[] = {data};
            size_t inBytes[] = {bytes};
            void* outs[] = {out.data()};
            size_t outBytes[] = {0};
            nvcomp::gdeflate::compressCPU(in, inBytes, bytes, 1, outs, outBytes);
            return outBytes[0] < bytes ? outBytes[0] : 0;
        }
        default: throw std::runtime_error(std::string(algorithmInfo(options_.algorithm).name) + " has no CPU implementation");
        }
    }

    bool decompressChunk(uint8_t const* in, size_t inBytes, uint8_t* out, size_t rawBytes) const
    {
        switch (options_.algorithm)
        {
        case Algorithm::kLz4: return lz4::decompress(in, inBytes, out, rawBytes) == int64_t(rawBytes);
        case Algorithm::kGdeflate:
        {
            void const* ins[] = {in};
            size_t inSizes[] = {inBytes};
            void* outs[] = {out};
            size_t cap[] = {rawBytes};
            size_t got[] = {0};
            nvcomp::gdeflate::decompressCPU(ins, inSizes, 1, outs, cap, got);
            return got[0] == rawBytes;
        }
        default: return false;
        }
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
            for (size_t i = 0; i < n; ++i)
            {
                encodePage(group, plan, pairs[i].src, reinterpret_cast<uint8_t*>(blobBase + uint64_t(pairs[i].dst) * plan.coldBytes));
            }
            return true;
        }
        // Every blob is checked and decoded into scratch before any hot slot is written: a bad
        // blob fails the call and leaves the hot pages untouched.
        std::vector<std::vector<uint8_t>> pages(n);
        for (size_t i = 0; i < n; ++i)
        {
            auto const* blob = reinterpret_cast<uint8_t const*>(blobBase + uint64_t(pairs[i].src) * plan.coldBytes);
            std::string err = decodePage(group, plan, blob, pages[i]);
            if (!err.empty())
            {
                return fail("decode(): pageIndices[" + std::to_string(i) + "] (cold slot " + std::to_string(pairs[i].src)
                    + "): " + err + "; no hot page was written");
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

    void encodePage(HotLayout::Group const& group, GroupPlan const& plan, int32_t hot, uint8_t* blob) const
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
        std::vector<uint8_t> shuffled;
        std::vector<uint8_t> packed;
        for (uint32_t c = 0; c < numChunks; ++c)
        {
            auto const& chunk = plan.chunks[c];
            auto const& pool = group.pools[chunk.pool];
            auto const* data = reinterpret_cast<uint8_t const*>(pool.base + uint64_t(hot) * pool.slotBytes + chunk.offset);
            if (options_.bitshuffle)
            {
                shuffled.resize(chunk.bytes);
                shuffleChunk(data, shuffled.data(), chunk.bytes, options_.elementBytes);
                data = shuffled.data();
            }
            size_t const packedBytes = compressChunk(data, chunk.bytes, packed);
            bool const compressed = packedBytes != 0 && packedBytes < chunk.bytes;
            uint32_t const stored = compressed ? uint32_t(packedBytes) : chunk.bytes;
            std::memcpy(&out[pos], compressed ? packed.data() : data, stored);
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

    // Returns an empty string and the decoded page, or the reason the blob cannot be decoded.
    std::string decodePage(HotLayout::Group const& group, GroupPlan const& plan, uint8_t const* blob,
        std::vector<uint8_t>& page) const
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
        page.resize(group.pageBytes);
        std::vector<uint64_t> poolOffset(group.pools.size());
        for (size_t p = 1; p < group.pools.size(); ++p)
        {
            poolOffset[p] = poolOffset[p - 1] + group.pools[p - 1].slotBytes;
        }
        uint64_t const end = uint64_t(env.headerBytes) + env.payloadBytes;
        uint64_t pos = env.headerBytes;
        std::vector<uint8_t> scratch;
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
            uint8_t* dst = page.data() + poolOffset[chunk.pool] + chunk.offset;
            uint8_t* target = dst;
            if (options_.bitshuffle)
            {
                scratch.resize(chunk.bytes);
                target = scratch.data();
            }
            if (compressed)
            {
                if (!decompressChunk(blob + pos, stored, target, chunk.bytes))
                {
                    return "chunk " + std::to_string(c) + " does not decompress to " + std::to_string(chunk.bytes) + " bytes";
                }
            }
            else
            {
                std::memcpy(target, blob + pos, stored);
            }
            if (options_.bitshuffle)
            {
                unshuffleChunk(scratch.data(), dst, chunk.bytes, options_.elementBytes);
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

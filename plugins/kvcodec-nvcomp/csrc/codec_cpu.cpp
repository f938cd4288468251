// SPDX-License-Identifier: Apache-2.0
//
// CPU reference of the nvCOMP codecs' blob format (format.h): host pointers, synchronous,
// stream ignored. LZ4 chunks use the LZ4 reference library (lz4_block.h); gdeflate chunks use
// nvCOMP's CPU library, whose batched gdeflate functions read and write the GPU chunk format.
// Checksums use the SDK's host CRC-32C (kvcodec/crc32c.h: the CPU's CRC instruction where it has
// one).
//
// A blob is checked in the order the CUDA kernels check it, so both report the same PageStatus
// for it: envelope (magic, header CRC, format version, did not fit, sizes), codec header and
// chunk table, checksum, decompression.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kvcodec/crc32c.h"

#include <nvcomp/native/gdeflate_cpu.h>

#include "codec_cpu.h"
#include "lz4_block.h"

namespace kvcodec::nvcomp_plugin {
namespace {

// Transposes the 8x8 bit matrix whose row r is byte r of x (bit c of that byte is column c): byte
// c of the result holds bit c of every input byte, input byte r at bit r. Its own inverse.
uint64_t transpose8x8(uint64_t x)
{
    uint64_t t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAull;
    x ^= t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCull;
    x ^= t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ull;
    return x ^ t ^ (t << 28);
}

// shuffleGroup / unshuffleGroup of format.h for every group of a chunk, with one 8x8 bit
// transpose per byte of the element instead of a loop per bit (tests pin them to format.h). The
// planes of a chunk lie `groups` bytes apart, often a multiple of 4 KiB, so they share cache sets:
// groups are taken kBlockGroups at a time, staging one cache line per plane.
constexpr uint64_t kBlockGroups = 64;

void shuffleGroupsScalar(uint8_t const* in, uint8_t* out, uint64_t groups, uint32_t w)
{
    alignas(64) uint8_t stage[32][kBlockGroups];
    for (uint64_t first = 0; first < groups; first += kBlockGroups)
    {
        uint64_t const count = std::min(kBlockGroups, groups - first);
        for (uint64_t k = 0; k < count; ++k)
        {
            uint8_t const* e = in + 8ull * w * (first + k);
            for (uint32_t b = 0; b < w; ++b)
            {
                uint64_t x = 0;
                for (uint32_t j = 0; j < 8; ++j)
                {
                    x |= uint64_t(e[j * w + b]) << (8 * j);
                }
                x = transpose8x8(x);
                for (uint32_t bit = 0; bit < 8; ++bit)
                {
                    stage[8 * b + bit][k] = uint8_t(x >> (8 * bit));
                }
            }
        }
        for (uint32_t p = 0; p < 8 * w; ++p)
        {
            std::memcpy(out + uint64_t(p) * groups + first, stage[p], count);
        }
    }
}

void unshuffleGroupsScalar(uint8_t const* in, uint8_t* out, uint64_t groups, uint32_t w)
{
    alignas(64) uint8_t stage[32][kBlockGroups];
    for (uint64_t first = 0; first < groups; first += kBlockGroups)
    {
        uint64_t const count = std::min(kBlockGroups, groups - first);
        for (uint32_t p = 0; p < 8 * w; ++p)
        {
            std::memcpy(stage[p], in + uint64_t(p) * groups + first, count);
        }
        for (uint64_t k = 0; k < count; ++k)
        {
            uint8_t* e = out + 8ull * w * (first + k);
            for (uint32_t b = 0; b < w; ++b)
            {
                uint64_t x = 0;
                for (uint32_t bit = 0; bit < 8; ++bit)
                {
                    x |= uint64_t(stage[8 * b + bit][k]) << (8 * bit);
                }
                x = transpose8x8(x);
                for (uint32_t j = 0; j < 8; ++j)
                {
                    e[j * w + b] = uint8_t(x >> (8 * j));
                }
            }
        }
    }
}

#if defined(__SSE2__)
// 16-bit elements with SSE2 (baseline on x86-64), two groups (16 elements) at a time: one byte of
// each element gathered into a vector, and each bit plane's 16 bits read with movemask while the
// vector is shifted left. The inverse reads the planes of a pair of groups as one vector and
// takes each element's bits the same way. An odd last group is left to the caller.
void shuffleGroupPairs16(uint8_t const* in, uint8_t* out, uint64_t groups)
{
    __m128i const low = _mm_set1_epi16(0x00FF);
    alignas(64) uint8_t stage[16][kBlockGroups];
    for (uint64_t first = 0; first + 1 < groups; first += kBlockGroups)
    {
        uint64_t const count = std::min(kBlockGroups, groups - first) & ~uint64_t(1);
        for (uint64_t k = 0; k < count; k += 2)
        {
            __m128i const a = _mm_loadu_si128(reinterpret_cast<__m128i const*>(in + 16 * (first + k)));
            __m128i const b = _mm_loadu_si128(reinterpret_cast<__m128i const*>(in + 16 * (first + k) + 16));
            __m128i x[2] = {_mm_packus_epi16(_mm_and_si128(a, low), _mm_and_si128(b, low)),
                _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8))};
            for (uint32_t byte = 0; byte < 2; ++byte)
            {
                for (int bit = 7; bit >= 0; --bit)
                {
                    uint16_t const m = uint16_t(_mm_movemask_epi8(x[byte]));
                    std::memcpy(&stage[8 * byte + uint32_t(bit)][k], &m, 2);
                    x[byte] = _mm_add_epi8(x[byte], x[byte]);
                }
            }
        }
        for (uint32_t p = 0; p < 16; ++p)
        {
            std::memcpy(out + uint64_t(p) * groups + first, stage[p], count);
        }
    }
}

void unshuffleGroupPairs16(uint8_t const* in, uint8_t* out, uint64_t groups)
{
    __m128i const low = _mm_set1_epi16(0x00FF);
    alignas(16) uint16_t planes[kBlockGroups / 2][16]; // [pair of groups][plane]
    for (uint64_t first = 0; first + 1 < groups; first += kBlockGroups)
    {
        uint64_t const count = std::min(kBlockGroups, groups - first) & ~uint64_t(1);
        for (uint32_t p = 0; p < 16; ++p)
        {
            uint8_t const* src = in + uint64_t(p) * groups + first;
            for (uint64_t i = 0; 2 * i < count; ++i)
            {
                std::memcpy(&planes[i][p], src + 2 * i, 2);
            }
        }
        for (uint64_t k = 0; k < count; k += 2)
        {
            __m128i x[2];
            for (uint32_t byte = 0; byte < 2; ++byte)
            {
                __m128i const v = _mm_load_si128(reinterpret_cast<__m128i const*>(&planes[k / 2][8 * byte]));
                x[byte] = _mm_packus_epi16(
                    _mm_and_si128(v, low), _mm_srli_epi16(v, 8)); // bytes: planes' first, second group
            }
            uint8_t* o = out + 16 * (first + k);
            for (int j = 7; j >= 0; --j)
            {
                unsigned const m0 = unsigned(_mm_movemask_epi8(x[0]));
                unsigned const m1 = unsigned(_mm_movemask_epi8(x[1]));
                uint16_t const e0 = uint16_t((m0 & 0xFFu) | ((m1 & 0xFFu) << 8));
                uint16_t const e1 = uint16_t((m0 >> 8) | (m1 & 0xFF00u));
                std::memcpy(o + 2 * j, &e0, 2);
                std::memcpy(o + 2 * (j + 8), &e1, 2);
                x[0] = _mm_add_epi8(x[0], x[0]);
                x[1] = _mm_add_epi8(x[1], x[1]);
            }
        }
    }
}
#endif

// One chunk, shuffled (kShuffle) or unshuffled: the SSE2 pairs of groups for 16-bit elements (an
// odd last group by format.h's function), the staged scalar transposes otherwise, and the tail
// past the last whole group copied as it is.
template <bool kShuffle>
void transformChunk(uint8_t const* in, uint8_t* out, uint64_t bytes, uint32_t w)
{
    uint64_t const groups = shuffleGroups(bytes, w);
#if defined(__SSE2__)
    if (w == 2)
    {
        (kShuffle ? shuffleGroupPairs16 : unshuffleGroupPairs16)(in, out, groups);
        if (groups % 2 == 1)
        {
            (kShuffle ? shuffleGroup : unshuffleGroup)(in, out, groups, groups - 1, w);
        }
    }
    else
#endif
    {
        (kShuffle ? shuffleGroupsScalar : unshuffleGroupsScalar)(in, out, groups, w);
    }
    std::memcpy(out + groups * 8 * w, in + groups * 8 * w, bytes - groups * 8 * w);
}

void shuffleChunk(uint8_t const* in, uint8_t* out, uint64_t bytes, uint32_t w)
{
    transformChunk<true>(in, out, bytes, w);
}

void unshuffleChunk(uint8_t const* in, uint8_t* out, uint64_t bytes, uint32_t w)
{
    transformChunk<false>(in, out, bytes, w);
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

// The envelope part of a refusal reason (plain decode() names it in its error).
char const* envelopeText(uint8_t status)
{
    switch (status)
    {
    case kPageBadMagic: return "envelope check failed: bad magic";
    case kPageBadFormatVersion: return "envelope check failed: wrong format version";
    case kPageBadHeader: return "envelope check failed: bad header (header CRC or sizes)";
    case kPageDidNotFit: return "envelope check failed: the page did not fit its cold slot when encoded (a miss)";
    case kPageBadChecksum: return "envelope check failed: checksum mismatch";
    default: return "envelope check failed";
    }
}

// The compressed chunks of the pages of one decode window, decompressed together.
void writeHotPage(HotLayout::Group const& group, int32_t slot, std::vector<uint8_t> const& page)
{
    uint64_t off = 0;
    for (auto const& pool : group.pools)
    {
        std::memcpy(
            reinterpret_cast<void*>(pool.base + uint64_t(slot) * pool.slotBytes), page.data() + off, pool.slotBytes);
        off += pool.slotBytes;
    }
}

// Pages compressed together: nvCOMP's CPU gdeflate has a large fixed cost per call.
constexpr size_t kWindowPages = 1024;

std::vector<uint64_t> poolOffsets(HotLayout::Group const& group)
{
    std::vector<uint64_t> off(group.pools.size(), 0);
    for (size_t p = 1; p < group.pools.size(); ++p)
    {
        off[p] = off[p - 1] + group.pools[p - 1].slotBytes;
    }
    return off;
}

uint8_t refuse(uint8_t status, std::string* why, std::string const& reason)
{
    if (why != nullptr)
    {
        *why = reason;
    }
    return status;
}

} // namespace

struct ChunkLists
{
    std::vector<uint8_t const*> in;
    std::vector<size_t> inBytes;
    std::vector<uint8_t*> out;
    std::vector<size_t> raw;
    std::vector<uint32_t> chunk; // index in the page
    std::vector<size_t> page;    // index in the window
};

NvcompCodecCpu::NvcompCodecCpu(Params const& params)
    : NvcompCodec(params, KVCODEC_DEVICE_CPU)
{
    if (!algorithmInfo(params.algorithm).hasCpu)
    {
        throw CodecCreateError(std::string(algorithmInfo(params.algorithm).name)
            + " has no CPU implementation: nvCOMP's CPU library offers no coder of its chunk format; use "
              "device='cuda'");
    }
}

// Compresses every chunk (data[c], raw[c] bytes) into out[c]; sizes[c] = compressed size, or
// 0 when it did not shrink. gdeflate goes through nvCOMP's CPU library in one batched call
// per page (its per-call set-up dominates small chunks).
void NvcompCodecCpu::compressChunks(std::vector<uint8_t const*> const& data, std::vector<size_t> const& raw,
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

// Decompresses every listed chunk; failed[x] is 1 for each chunk that does not decode to
// exactly raw[x] bytes.
void NvcompCodecCpu::decompressChunks(ChunkLists const& l, std::vector<uint8_t>& failed) const
{
    size_t const n = l.in.size();
    failed.assign(n, 0);
    if (options_.algorithm == Algorithm::kLz4)
    {
        for (size_t c = 0; c < n; ++c)
        {
            failed[c] = lz4::decompress(l.in[c], l.inBytes[c], l.out[c], l.raw[c]) != int64_t(l.raw[c]);
        }
        return;
    }
    if (n == 0)
        return;
    std::vector<void const*> ins(l.in.begin(), l.in.end());
    std::vector<void*> outs(l.out.begin(), l.out.end());
    std::vector<size_t> got(n, 0);
    std::vector<size_t> capacity(l.raw); // the API takes a mutable array
    try
    {
        nvcomp::gdeflate::decompressCPU(ins.data(), l.inBytes.data(), n, outs.data(), capacity.data(), got.data());
    }
    catch (std::bad_alloc const&)
    {
        throw;
    }
    catch (...)
    {
        // The library throws for a chunk it cannot decode, which fails the whole batch: find
        // the chunks that do not decode one by one.
        for (size_t c = 0; c < n; ++c)
        {
            got[c] = 0;
            capacity[c] = l.raw[c];
            try
            {
                nvcomp::gdeflate::decompressCPU(&ins[c], &l.inBytes[c], 1, &outs[c], &capacity[c], &got[c]);
            }
            catch (std::bad_alloc const&)
            {
                throw;
            }
            catch (...)
            {
                got[c] = ~size_t(0);
            }
        }
    }
    for (size_t c = 0; c < n; ++c)
    {
        failed[c] = got[c] != l.raw[c];
    }
}

bool NvcompCodecCpu::submit(CodecCall const& call)
{
    auto const& group = call.group;
    auto const& plan = plans_[call.groupIndex];
    uintptr_t const blobBase = call.coldBase;
    PageIndexPair const* pairs = call.pages;
    size_t const n = call.numPages;
    bool const encode = call.encoding;
    uint8_t* const pageStatus = call.pageStatus;
    if (pageStatus != nullptr)
    {
        // A checked decode reports a bad index pair as that page's status (CodecBase checked the
        // indices of every other call).
        for (size_t i = 0; i < n; ++i)
        {
            int32_t const hot = pairs[i].dst;
            bool const hotOk = hot >= 0 && uint64_t(hot) < group.numSlots;
            pageStatus[i] = hotOk && pairs[i].src >= 0 ? kPageOk : kPageBadIndex;
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
    if (pageStatus != nullptr)
    {
        // Checked: each window's good pages are written as soon as the window is decoded; a
        // bad page's hot slot is left untouched.
        std::vector<std::vector<uint8_t>> pages;
        for (size_t first = 0; first < n; first += kWindowPages)
        {
            size_t const m = std::min(kWindowPages, n - first);
            pages.assign(m, {});
            decodeWindow(group, plan, blobBase, pairs, first, m, pages, pageStatus + first, nullptr);
            for (size_t j = 0; j < m; ++j)
            {
                if (pageStatus[first + j] == kPageOk)
                {
                    writeHotPage(group, pairs[first + j].dst, pages[j]);
                }
            }
        }
        return true;
    }
    // Every blob is checked and decoded into scratch before any hot slot is written: a bad
    // blob fails the call and leaves the hot pages untouched.
    std::vector<std::vector<uint8_t>> pages(n);
    std::vector<uint8_t> status(n, kPageOk);
    for (size_t first = 0; first < n; first += kWindowPages)
    {
        size_t const m = std::min(kWindowPages, n - first);
        std::vector<std::vector<uint8_t>> window(m);
        std::string err;
        decodeWindow(group, plan, blobBase, pairs, first, m, window, status.data() + first, &err);
        if (!err.empty())
        {
            return fail("decode(): " + err + "; no hot page was written");
        }
        for (size_t j = 0; j < m; ++j)
        {
            pages[first + j] = std::move(window[j]);
        }
    }
    for (size_t i = 0; i < n; ++i)
    {
        writeHotPage(group, pairs[i].dst, pages[i]);
    }
    return true;
}

void NvcompCodecCpu::encodeWindow(HotLayout::Group const& group, GroupPlan const& plan, uintptr_t blobBase,
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
            data[k]
                = reinterpret_cast<uint8_t const*>(pool.base + uint64_t(pairs[i].src) * pool.slotBytes + chunk.offset);
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

void NvcompCodecCpu::writeBlob(HotLayout::Group const& group, GroupPlan const& plan, uint8_t* blob,
    uint8_t const* const* data, size_t const* raw, std::vector<uint8_t> const* packed, size_t const* sizes) const
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
        env.checksum = crc32cFast(&out[32], pos - 32);
    }
    env.headerCrc = crc32cFast(&env, offsetof(ColdPageEnvelope, headerCrc));
    std::memcpy(out.data(), &env, sizeof(env));
    std::memcpy(blob, out.data(), pos);
}

// Checks and decodes pages [first, first + m) of the call into pages[0, m). status[j] holds
// each page's PageStatus on entry (kPageBadIndex pages are skipped) and its outcome on return;
// only kPageOk pages are complete. With `why` (plain decode), stops at the first bad page and
// sets *why to the reason naming it.
void NvcompCodecCpu::decodeWindow(HotLayout::Group const& group, GroupPlan const& plan, uintptr_t blobBase,
    PageIndexPair const* pairs, size_t first, size_t m, std::vector<std::vector<uint8_t>>& pages, uint8_t* status,
    std::string* why) const
{
    std::vector<std::vector<uint8_t>> scratch(options_.bitshuffle ? m : 0);
    ChunkLists lists;
    auto where = [&](size_t j) {
        return "pageIndices[" + std::to_string(first + j) + "] (cold slot " + std::to_string(pairs[first + j].src)
            + "): ";
    };
    for (size_t j = 0; j < m; ++j)
    {
        if (status[j] != kPageOk)
        {
            continue;
        }
        auto const* blob = reinterpret_cast<uint8_t const*>(blobBase + uint64_t(pairs[first + j].src) * plan.coldBytes);
        pages[j].resize(group.pageBytes);
        uint8_t* dst = pages[j].data();
        if (options_.bitshuffle)
        {
            scratch[j].resize(group.pageBytes);
            dst = scratch[j].data();
        }
        std::string reason;
        status[j] = parseBlob(group, plan, blob, dst, j, lists, why ? &reason : nullptr);
        if (status[j] != kPageOk && why != nullptr)
        {
            *why = where(j) + reason;
            return;
        }
    }
    std::vector<uint8_t> failed;
    decompressChunks(lists, failed);
    for (size_t x = 0; x < failed.size(); ++x)
    {
        size_t const j = lists.page[x];
        if (failed[x] && status[j] == kPageOk)
        {
            status[j] = kPageDecodeFailed;
            if (why != nullptr)
            {
                uint32_t const c = lists.chunk[x];
                *why = where(j) + "chunk " + std::to_string(c) + " does not decompress to "
                    + std::to_string(plan.chunks[c].bytes) + " bytes";
                return;
            }
        }
    }
    if (options_.bitshuffle)
    {
        std::vector<uint64_t> poolOffset = poolOffsets(group);
        for (size_t j = 0; j < m; ++j)
        {
            if (status[j] != kPageOk)
            {
                continue;
            }
            for (auto const& chunk : plan.chunks)
            {
                uint64_t const at = poolOffset[chunk.pool] + chunk.offset;
                unshuffleChunk(scratch[j].data() + at, pages[j].data() + at, chunk.bytes, options_.elementBytes);
            }
        }
    }
}

// Checks one blob (envelope, codec header, chunk table, then the checksum), copies its raw
// chunks to `page` and appends its compressed chunks to `lists` (as page `j` of the window).
// Returns kPageOk, or the PageStatus with the reason in *why when `why` is given; a bad blob
// appends nothing.
uint8_t NvcompCodecCpu::parseBlob(HotLayout::Group const& group, GroupPlan const& plan, uint8_t const* blob,
    uint8_t* page, size_t j, ChunkLists& lists, std::string* why) const
{
    ColdPageEnvelope env;
    std::memcpy(&env, blob, sizeof(env));
    if (env.magic != kColdPageEnvelopeMagic)
    {
        return refuse(kPageBadMagic, why, envelopeText(kPageBadMagic));
    }
    if (crc32cFast(&env, offsetof(ColdPageEnvelope, headerCrc)) != env.headerCrc)
    {
        return refuse(kPageBadHeader, why, envelopeText(kPageBadHeader));
    }
    if (env.formatVersion != kFormatVersion)
    {
        return refuse(kPageBadFormatVersion, why,
            std::string(envelopeText(kPageBadFormatVersion)) + " (" + std::to_string(env.formatVersion)
                + "; this codec reads " + std::to_string(kFormatVersion) + ")");
    }
    if (env.flags & kEnvelopeDidNotFit)
    {
        return refuse(kPageDidNotFit, why, envelopeText(kPageDidNotFit));
    }
    if (env.headerBytes < sizeof(ColdPageEnvelope) || env.headerBytes > plan.coldBytes
        || env.payloadBytes > plan.coldBytes - env.headerBytes)
    {
        return refuse(kPageBadHeader, why, envelopeText(kPageBadHeader));
    }
    uint32_t const numChunks = uint32_t(plan.chunks.size());
    if (env.rawBytes != group.pageBytes || env.headerBytes != plan.headerBytes || get32(blob + 32) != numChunks
        || get32(blob + 36) != options_.chunkBytes || blob[40] != uint8_t(options_.algorithm)
        || blob[41] != options_.elementBytes || blob[42] != (options_.bitshuffle ? 1 : 0))
    {
        return refuse(kPageBadHeader, why,
            "the blob was written with another layout or parameters (raw bytes, chunk count, chunk_bytes, "
            "algorithm, data_type or bitshuffle differ)");
    }
    uint64_t const end = uint64_t(env.headerBytes) + env.payloadBytes;
    uint64_t pos = env.headerBytes;
    for (uint32_t c = 0; c < numChunks; ++c)
    {
        uint32_t const entry = get32(blob + kChunkTableOffset + 4 * c);
        uint32_t const stored = entry & kChunkSizeMask;
        bool const compressed = (entry & kChunkCompressedBit) != 0;
        uint32_t const raw = plan.chunks[c].bytes;
        if (pos + stored > end || (compressed ? (stored == 0 || stored >= raw) : stored != raw))
        {
            return refuse(kPageBadHeader, why, "chunk " + std::to_string(c) + " table entry is invalid");
        }
        pos += roundUp(stored, kPayloadAlign);
    }
    if (pos != end)
    {
        return refuse(kPageBadHeader, why,
            "payloadBytes " + std::to_string(env.payloadBytes) + " disagrees with the chunk table");
    }
    if (crc32cFast(blob + sizeof(ColdPageEnvelope), end - sizeof(ColdPageEnvelope)) != env.checksum)
    {
        return refuse(kPageBadChecksum, why, envelopeText(kPageBadChecksum));
    }
    std::vector<uint64_t> const poolOffset = poolOffsets(group);
    pos = env.headerBytes;
    for (uint32_t c = 0; c < numChunks; ++c)
    {
        auto const& chunk = plan.chunks[c];
        uint32_t const entry = get32(blob + kChunkTableOffset + 4 * c);
        uint32_t const stored = entry & kChunkSizeMask;
        uint8_t* target = page + poolOffset[chunk.pool] + chunk.offset;
        if (entry & kChunkCompressedBit)
        {
            lists.in.push_back(blob + pos);
            lists.inBytes.push_back(stored);
            lists.out.push_back(target);
            lists.raw.push_back(chunk.bytes);
            lists.chunk.push_back(c);
            lists.page.push_back(j);
        }
        else
        {
            std::memcpy(target, blob + pos, stored);
        }
        pos += roundUp(stored, kPayloadAlign);
    }
    return kPageOk;
}

} // namespace kvcodec::nvcomp_plugin

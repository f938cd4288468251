// SPDX-License-Identifier: Apache-2.0
//
// Test hooks of kvcodec_nvcomp._ext (testing.h): host mirrors of the kernels' CRC steps, the
// workspace probe, and the Python bindings of every test and benchmark hook.
#include "testing.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <stdexcept>

#include "codec.h"
#include "kvcodec/crc32c.h"
#include "lz4_block.h"
#include "nvcomp_ops.h"

using namespace pybind11::literals;

namespace py = pybind11;

namespace kvcodec::nvcomp_plugin {
namespace {

// Host mirrors of the kernels' CRC steps, with the same pieces in the same order.
struct HostCrc
{
    uint32_t xpow[64];
    uint32_t t[4][256];
    HostCrc()
    {
        crcPowerTable(xpow);
        crcSliceTables(t);
    }

    // blockCrcEqual.
    uint32_t equal(std::vector<uint32_t> part, uint32_t log2Bytes) const
    {
        uint32_t const threads = uint32_t(part.size());
        uint32_t k = 3 + log2Bytes;
        for (uint32_t stride = 1; stride < threads; stride *= 2, ++k)
        {
            for (uint32_t i = 0; i < threads; i += 2 * stride)
            {
                part[i] = (part[i] == 0 ? 0u : crcMulMod(xpow[k], part[i])) ^ part[i + stride];
            }
        }
        return part[0];
    }

    // blockCrcJoin.
    static CrcPiece join(std::vector<CrcPiece> part)
    {
        uint32_t const threads = uint32_t(part.size());
        for (uint32_t stride = 1; stride < threads; stride *= 2)
        {
            for (uint32_t i = 0; i + stride < threads; i += 2 * stride)
            {
                part[i] = crcJoin(part[i], part[i + stride]);
            }
        }
        return part[0];
    }

    static uint32_t log2(uint64_t pow2)
    {
        uint32_t k = 0;
        while ((uint64_t(1) << k) < pow2)
            ++k;
        return k;
    }

    // blockCrcRaw.
    uint32_t blockRaw(uint8_t const* p, uint64_t bytes, uint64_t valid, uint32_t threads) const
    {
        uint64_t const seg = crcSegmentBytes(bytes, threads);
        std::vector<uint32_t> part(threads);
        for (uint32_t th = 0; th < threads; ++th)
        {
            uint64_t b0 = 0, b1 = 0;
            crcLeadingZeroSegment(bytes, seg, threads, th, b0, b1);
            uint64_t const end = std::min(b1, std::max(b0, valid));
            uint32_t c = crcUpdate(0, p + b0, end - b0, t);
            for (uint64_t b = end; b < b1; ++b)
                c = crcAdvanceByte(c, t[0]);
            part[th] = c;
        }
        return equal(part, log2(seg));
    }

    // threadRun.
    static void run(uint32_t n, uint32_t threads, uint32_t th, uint32_t& first, uint32_t& last)
    {
        uint32_t const per = (n + threads - 1) / threads;
        first = std::min(n, th * per);
        last = std::min(n, first + per);
    }
};

void requirePowerOfTwo(uint32_t threads)
{
    if (threads == 0 || (threads & (threads - 1)) != 0)
    {
        throw std::invalid_argument(
            "threads is " + std::to_string(threads) + "; a block's thread count is a power of two");
    }
}

// Runs the codecs' configure() (the same validation and chunk plans as the real codecs; no
// device: a CPU-side CodecBase) and then only plans the CUDA workspace.
class WorkspaceProbe final : public NvcompCodec
{
public:
    explicit WorkspaceProbe(Params const& params)
        : NvcompCodec(params, KVCODEC_DEVICE_CPU)
    {
    }

    WorkspacePlan workspace;

private:
    bool planBackend() override
    {
        try
        {
            auto ops = makeNvcompOps(options_.algorithm, options_.elementBytes);
            workspace = planWorkspace(options_, layout(), plans_, *ops);
            return true;
        }
        catch (std::exception const& e)
        {
            return fail(std::string("configure(): ") + e.what());
        }
    }

    PageIndexLocation pageIndexLocation(HotLayout::LifeCycle const&) const override
    {
        return PageIndexLocation::kDevice;
    }

    bool submit(CodecCall const&) override
    {
        return fail("a workspace probe neither encodes nor decodes");
    }
};

} // namespace

bool probeWorkspace(Algorithm algorithm, char const* paramsJson, std::vector<std::vector<uint64_t>> const& slotBytes,
    std::vector<uint64_t> const& numSlots, WorkspacePlan& out, std::string& error)
{
    if (slotBytes.size() != numSlots.size())
    {
        error = "slot_bytes has " + std::to_string(slotBytes.size()) + " groups but num_slots has "
            + std::to_string(numSlots.size()) + "; give one slot count per group";
        return false;
    }
    Params options;
    try
    {
        options = readParams(algorithm, paramsJson);
    }
    catch (std::exception const& e)
    {
        error = e.what();
        return false;
    }
    std::vector<std::vector<PoolDesc>> pools(slotBytes.size());
    std::vector<LifeCycleDesc> lifeCycles(slotBytes.size());
    std::vector<PoolGroupDesc> groups(slotBytes.size());
    uintptr_t base = uintptr_t(1) << 20; // Never dereferenced: only the alignment matters.
    for (size_t g = 0; g < slotBytes.size(); ++g)
    {
        for (uint64_t s : slotBytes[g])
        {
            pools[g].push_back({reinterpret_cast<void*>(base), s, numSlots[g]});
            base += roundUp(s * numSlots[g], 4096) + 4096;
        }
        lifeCycles[g] = {LifeCycleId(g), 0, nullptr};
        groups[g] = {PoolGroupIndex(g), uint32_t(pools[g].size()), pools[g].data(), 1, &lifeCycles[g]};
    }
    WorkspaceProbe probe(options);
    if (!probe.configure(groups.data(), PoolGroupIndex(groups.size())))
    {
        error = probe.lastError();
        return false;
    }
    out = probe.workspace;
    return true;
}

uint32_t segmentedCrc32c(uint8_t const* data, uint64_t bytes, uint32_t threads)
{
    requirePowerOfTwo(threads);
    HostCrc const h;
    return crcFinish(h.blockRaw(data, bytes, bytes, threads), bytes, h.xpow);
}

uint32_t pieceCrc32c(uint8_t const* region, uint64_t headerBytes, std::vector<uint32_t> const& stored,
    uint32_t chunkThreads, uint32_t pageThreads)
{
    requirePowerOfTwo(chunkThreads);
    requirePowerOfTwo(pageThreads);
    HostCrc const h;
    // Header: encodeSeal checksums 32-bit words per leading-zero segment, decodeHeader the
    // staged bytes; both must agree.
    uint64_t const seg = crcSegmentBytes(headerBytes, pageThreads);
    std::vector<uint32_t> part(pageThreads);
    for (uint32_t th = 0; th < pageThreads; ++th)
    {
        uint64_t b0 = 0, b1 = 0;
        crcLeadingZeroSegment(headerBytes, seg, pageThreads, th, b0, b1);
        uint32_t raw = 0;
        for (uint64_t j = b0 / 4; j < b1 / 4; ++j)
        {
            uint8_t const* w = region + 4 * j;
            raw = crcWord(
                raw, uint32_t(w[0]) | (uint32_t(w[1]) << 8) | (uint32_t(w[2]) << 16) | (uint32_t(w[3]) << 24), h.t);
        }
        part[th] = raw;
    }
    uint32_t const headerRaw = h.equal(part, HostCrc::log2(seg));
    if (headerRaw != h.blockRaw(region, headerBytes, headerBytes, pageThreads))
    {
        throw std::logic_error("the header's word segments and byte segments disagree");
    }
    // Chunks as encodeChunks (the source's stored bytes, the padding as zeros) and decodeChunks
    // (the padded bytes) checksum them, joined in runs per page thread (encodeSeal, decodeVerify).
    uint32_t const n = uint32_t(stored.size());
    std::vector<CrcPiece> chunk(n);
    uint64_t pos = headerBytes;
    for (uint32_t c = 0; c < n; ++c)
    {
        uint64_t const padded = roundUp(stored[c], kPayloadAlign);
        uint32_t const raw = h.blockRaw(region + pos, padded, stored[c], chunkThreads);
        if (raw != h.blockRaw(region + pos, padded, padded, chunkThreads))
        {
            throw std::logic_error("a chunk's padding is not zero");
        }
        chunk[c] = CrcPiece{raw, crcShiftOperator(padded, h.xpow)};
        pos += padded;
    }
    std::vector<CrcPiece> runs(pageThreads);
    for (uint32_t th = 0; th < pageThreads; ++th)
    {
        uint32_t first = 0, last = 0;
        HostCrc::run(n, pageThreads, th, first, last);
        CrcPiece r{0, kCrcOne};
        for (uint32_t c = first; c < last; ++c)
            r = crcJoin(r, chunk[c]);
        runs[th] = r;
    }
    CrcPiece const all = crcJoin(CrcPiece{headerRaw, crcShiftOperator(headerBytes, h.xpow)}, HostCrc::join(runs));
    return crcFinishOp(all.raw, all.op);
}

namespace {

Algorithm algorithmNamed(std::string const& name)
{
    for (Algorithm a : {Algorithm::kLz4, Algorithm::kGdeflate, Algorithm::kAns, Algorithm::kZstd})
    {
        if (name == algorithmInfo(a).name + 7) // skip "nvcomp-"
        {
            return a;
        }
    }
    throw py::value_error("unknown algorithm '" + name + "'; valid: 'lz4', 'gdeflate', 'ans', 'zstd'");
}

py::buffer_info contiguousBytes(py::buffer const& b)
{
    py::buffer_info info = b.request();
    if (info.ndim != 1 || info.itemsize != 1 || (info.ndim == 1 && info.strides[0] != 1))
    {
        throw py::value_error("expected a contiguous 1-D byte buffer");
    }
    return info;
}

} // namespace

void addTestHooks(py::module_& m)
{
    m.def(
        "segmented_crc32c",
        [](py::buffer const& data, uint32_t threads) {
            auto info = contiguousBytes(data);
            return segmentedCrc32c(static_cast<uint8_t const*>(info.ptr), uint64_t(info.size), threads);
        },
        py::arg("data"), py::arg("threads"),
        "CRC-32C computed the way the GPU kernels do (per-thread segments combined); for tests.");

    m.def(
        "piece_crc32c",
        [](py::buffer const& region, uint64_t headerBytes, std::vector<uint32_t> const& stored, uint32_t chunkThreads,
            uint32_t pageThreads) {
            auto info = contiguousBytes(region);
            uint64_t need = headerBytes;
            for (uint32_t b : stored)
                need += roundUp(b, kPayloadAlign);
            if (headerBytes % 4 != 0 || need != uint64_t(info.size) || chunkThreads == 0 || pageThreads == 0)
            {
                throw py::value_error("piece_crc32c: header_bytes " + std::to_string(headerBytes)
                    + " must be a multiple of 4, "
                      "the region ("
                    + std::to_string(info.size) + " bytes) header_bytes plus every stored size padded to 16 ("
                    + std::to_string(need) + "), and the thread counts positive");
            }
            return pieceCrc32c(static_cast<uint8_t const*>(info.ptr), headerBytes, stored, chunkThreads, pageThreads);
        },
        py::arg("region"), py::arg("header_bytes"), py::arg("stored"), py::arg("chunk_threads"),
        py::arg("page_threads"),
        "Blob checksum computed the way the GPU kernels do (header words, chunk pieces, zero padding); for tests.");

    m.def(
        "lz4_compress",
        [](py::buffer const& data) {
            auto info = contiguousBytes(data);
            std::string out(lz4::compressBound(size_t(info.size)), '\0');
            size_t n = lz4::compress(static_cast<uint8_t const*>(info.ptr), size_t(info.size),
                reinterpret_cast<uint8_t*>(out.data()), out.size());
            out.resize(n);
            return py::bytes(out);
        },
        py::arg("data"), "The CPU reference's LZ4 block encoder (raw block, no size prefix).");
    m.def(
        "lz4_decompress",
        [](py::buffer const& data, size_t capacity) -> py::object {
            auto info = contiguousBytes(data);
            std::string out(capacity, '\0');
            int64_t n = lz4::decompress(static_cast<uint8_t const*>(info.ptr), size_t(info.size),
                reinterpret_cast<uint8_t*>(out.data()), capacity);
            if (n < 0)
            {
                return py::none();
            }
            out.resize(size_t(n));
            return py::bytes(out);
        },
        py::arg("data"), py::arg("capacity"),
        "The CPU reference's LZ4 block decoder; None for a malformed block or one larger than capacity.");

    m.def(
        "workspace_plan",
        [](std::string const& algorithm, std::string const& paramsJson,
            std::vector<std::vector<uint64_t>> const& slotBytes, std::vector<uint64_t> const& numSlots) {
            WorkspacePlan w;
            std::string error;
            if (!probeWorkspace(algorithmNamed(algorithm), paramsJson.c_str(), slotBytes, numSlots, w, error))
            {
                throw py::value_error(error);
            }
            py::dict d("max_chunk_bytes"_a = w.maxChunkBytes, "max_chunks_per_batch"_a = w.maxChunks,
                "max_pages_per_batch"_a = w.maxPages, "chunk_stride"_a = w.chunkStride,
                "compressed_stride"_a = w.compStride, "max_compressed_chunk"_a = w.maxCompressedChunk,
                "blob_staging_bytes"_a = w.blobBytes, "compress_temp_bytes"_a = w.compressTempBytes,
                "decompress_temp_bytes"_a = w.decompressTempBytes, "temp_budget_bytes"_a = w.tempBudget,
                "encode_lane_bytes"_a = w.encodeLaneBytes, "decode_lane_bytes"_a = w.decodeLaneBytes,
                "device_bytes"_a = 2 * (w.encodeLaneBytes + w.decodeLaneBytes));
            return d;
        },
        py::arg("algorithm"), py::arg("params_json"), py::arg("slot_bytes"), py::arg("num_slots"),
        "The device workspace the CUDA codec of `algorithm` ('lz4', 'gdeflate', 'ans', 'zstd') would "
        "allocate at configure() for pool groups of slot sizes `slot_bytes[g]` and `num_slots[g]` "
        "slots (pools taken as 4 KiB aligned); needs no device. Raises ValueError for rejected "
        "parameters or layouts.");

    m.def(
        "compress_chunks",
        [](std::string const& algorithm, uint32_t elementBytes, uintptr_t data, std::vector<uint64_t> const& sizes,
            uint8_t inFill, uint8_t outFill, uint8_t tempFill) {
            Algorithm const a = algorithmNamed(algorithm);
            std::vector<std::string> chunks;
            {
                py::gil_scoped_release release;
                chunks = compressChunksForTest(a, elementBytes, data, sizes, inFill, outFill, tempFill);
            }
            py::list out;
            for (auto const& c : chunks)
                out.append(py::bytes(c));
            return out;
        },
        py::arg("algorithm"), py::arg("element_bytes"), py::arg("data"), py::arg("sizes"), py::arg("in_fill") = 0,
        py::arg("out_fill") = 0, py::arg("temp_fill") = 0,
        "Compresses chunks of sizes `sizes`, back to back at device address `data`, in one nvCOMP batch "
        "whose input padding, output buffers and temp memory are pre-filled with the given bytes; "
        "returns the compressed chunks. For tests of what nvCOMP's output depends on.");

    m.def(
        "direct_benchmark",
        [](std::string const& algorithm, uint32_t elementBytes, uintptr_t data, uint64_t bytes, uint64_t chunkBytes,
            int iterations, uintptr_t stream) {
            Algorithm const a = algorithmNamed(algorithm);
            DirectResult r;
            {
                py::gil_scoped_release release;
                r = directBenchmark(
                    a, elementBytes, data, bytes, chunkBytes, iterations, reinterpret_cast<cudaStream_t>(stream));
            }
            py::dict d("raw_bytes"_a = r.rawBytes, "compressed_bytes"_a = r.compressedBytes,
                "compress_ms"_a = r.compressMs, "decompress_ms"_a = r.decompressMs, "round_trip_ok"_a = r.roundTripOk);
            return d;
        },
        py::arg("algorithm"), py::arg("element_bytes"), py::arg("data"), py::arg("bytes"), py::arg("chunk_bytes"),
        py::arg("iterations"), py::arg("stream"),
        "Runs nvCOMP's batched compress + decompress directly on `bytes` of device memory cut into chunks "
        "(the benchmark's baseline); returns sizes and mean times.");
}

} // namespace kvcodec::nvcomp_plugin

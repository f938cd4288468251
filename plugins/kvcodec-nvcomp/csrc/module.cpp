// SPDX-License-Identifier: Apache-2.0
//
// kvcodec_nvcomp._ext: one factory capsule per algorithm, plus the benchmark's direct-nvCOMP
// baseline and test hooks for the format's pieces.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>

#include "codec_factories.h"
#include "lz4_block.h"
#include "nvcomp_ops.h"
#include "workspace.h"

namespace py = pybind11;
using namespace kvcodec::nvcomp_plugin;

namespace {

py::capsule capsuleOf(Algorithm a)
{
    return py::capsule(const_cast<KvcodecCodecFactory*>(codecFactory(a)), KVCODEC_FACTORY_CAPSULE_NAME);
}

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

PYBIND11_MODULE(_ext, m)
{
    m.doc() = "nvCOMP codecs for kvcodec_sdk: factory capsules and benchmark/test hooks";
    m.def("lz4_factory", [] { return capsuleOf(Algorithm::kLz4); }, "PyCapsule of the nvcomp-lz4 factory.");
    m.def("gdeflate_factory", [] { return capsuleOf(Algorithm::kGdeflate); }, "PyCapsule of the nvcomp-gdeflate factory.");
    m.def("ans_factory", [] { return capsuleOf(Algorithm::kAns); }, "PyCapsule of the nvcomp-ans factory.");
    m.def("zstd_factory", [] { return capsuleOf(Algorithm::kZstd); }, "PyCapsule of the nvcomp-zstd factory.");
    m.attr("FORMAT_VERSION") = int(kFormatVersion);

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
            for (uint32_t b : stored) need += roundUp(b, kPayloadAlign);
            if (headerBytes % 4 != 0 || need != uint64_t(info.size) || chunkThreads == 0 || pageThreads == 0)
            {
                throw py::value_error("piece_crc32c: header_bytes " + std::to_string(headerBytes) + " must be a multiple of 4, "
                    "the region (" + std::to_string(info.size) + " bytes) header_bytes plus every stored size padded to 16 ("
                    + std::to_string(need) + "), and the thread counts positive");
            }
            return pieceCrc32c(static_cast<uint8_t const*>(info.ptr), headerBytes, stored, chunkThreads, pageThreads);
        },
        py::arg("region"), py::arg("header_bytes"), py::arg("stored"), py::arg("chunk_threads"), py::arg("page_threads"),
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
        [](std::string const& algorithm, std::string const& paramsJson, std::vector<std::vector<uint64_t>> const& slotBytes,
            std::vector<uint64_t> const& numSlots) {
            WorkspacePlan w;
            std::string error;
            if (!probeWorkspace(algorithmNamed(algorithm), paramsJson.c_str(), slotBytes, numSlots, w, error))
            {
                throw py::value_error(error);
            }
            py::dict d;
            d["max_chunk_bytes"] = w.maxChunkBytes;
            d["max_chunks_per_batch"] = w.maxChunks;
            d["max_pages_per_batch"] = w.maxPages;
            d["chunk_stride"] = w.chunkStride;
            d["compressed_stride"] = w.compStride;
            d["max_compressed_chunk"] = w.maxCompressedChunk;
            d["blob_staging_bytes"] = w.blobBytes;
            d["compress_temp_bytes"] = w.compressTempBytes;
            d["decompress_temp_bytes"] = w.decompressTempBytes;
            d["temp_budget_bytes"] = w.tempBudget;
            d["encode_lane_bytes"] = w.encodeLaneBytes;
            d["decode_lane_bytes"] = w.decodeLaneBytes;
            d["device_bytes"] = 2 * (w.encodeLaneBytes + w.decodeLaneBytes);
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
            for (auto const& c : chunks) out.append(py::bytes(c));
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
                r = directBenchmark(a, elementBytes, data, bytes, chunkBytes, iterations,
                    reinterpret_cast<cudaStream_t>(stream));
            }
            py::dict d;
            d["raw_bytes"] = r.rawBytes;
            d["compressed_bytes"] = r.compressedBytes;
            d["compress_ms"] = r.compressMs;
            d["decompress_ms"] = r.decompressMs;
            d["round_trip_ok"] = r.roundTripOk;
            return d;
        },
        py::arg("algorithm"), py::arg("element_bytes"), py::arg("data"), py::arg("bytes"), py::arg("chunk_bytes"),
        py::arg("iterations"), py::arg("stream"),
        "Runs nvCOMP's batched compress + decompress directly on `bytes` of device memory cut into chunks "
        "(the benchmark's baseline); returns sizes and mean times.");
}

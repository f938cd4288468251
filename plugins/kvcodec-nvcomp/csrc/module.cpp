// SPDX-License-Identifier: Apache-2.0
//
// kvcodec_nvcomp._ext: one factory capsule per algorithm, plus the benchmark's direct-nvCOMP
// baseline and test hooks for the format's pieces.
#include <pybind11/pybind11.h>

#include <stdexcept>

#include "codec_factories.h"
#include "lz4_block.h"
#include "nvcomp_ops.h"

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

// SPDX-License-Identifier: Apache-2.0
//
// kvcodec_fp8._testing, the test hooks (not loaded by the codec): the scalar conversions of the
// blob format, the CPU kernels' building blocks (and the choice of their variant) and the blob
// plan, so the tests can check them against independent references.
//
// This module links its own copy of the codec's host side, so the CPU kernel variant
// set_cpu_simd() chooses applies to the codecs of its own factory, codec_factory() here (the
// tests register a CPU-only spec around it), not to those of kvcodec_fp8._ext. Blobs never
// depend on the variant. The CUDA kernels are not linked: their entry points below refuse, so a
// CUDA codec of this factory fails at configure() ("loading the fp8 kernel failed").
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_fp8.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "codec.h"
#include "cpu.h"
#include "format.h"
#include "kvcodec/layout.h"
#include "kvcodec/params.h"
#include "plan.h"

using namespace pybind11::literals;

namespace py = pybind11;
using namespace kvcodec::fp8;

namespace {

Format parseFormat(std::string const& name)
{
    if (name == "e4m3")
        return Format::kE4M3;
    if (name == "e5m2")
        return Format::kE5M2;
    throw py::value_error("format is '" + name + "'; valid values are 'e4m3', 'e5m2'");
}

template <typename In>
using Array = py::array_t<In, py::array::c_style | py::array::forcecast>;

template <typename In, typename Out, typename F>
py::array_t<Out> mapArray(Array<In> const& in, F&& f)
{
    py::array_t<Out> out(in.size());
    In const* src = in.data();
    Out* dst = out.mutable_data();
    for (py::ssize_t i = 0; i < in.size(); ++i)
    {
        dst[i] = f(src[i]);
    }
    return out;
}

/// A scalar conversion of the blob format under the fp8 format named `format`, over an array.
template <typename In, typename Out, Out (*Convert)(In, Format)>
py::array_t<Out> convertFp8(Array<In> const& in, std::string const& format)
{
    Format const f = parseFormat(format);
    return mapArray<In, Out>(in, [f](In v) { return Convert(v, f); });
}

/// A scalar rounding of fp32 to a hot dtype's bits, over an array.
template <uint16_t (*Round)(float)>
py::array_t<uint16_t> roundFp32(Array<float> const& x)
{
    return mapArray<float, uint16_t>(x, Round);
}

cpu::Simd parseSimd(std::string const& name)
{
    for (uint32_t s = 0; s < cpu::kNumSimd; ++s)
    {
        if (name == cpu::simdName(cpu::Simd(s)))
        {
            if (!cpu::simdSupported(cpu::Simd(s)))
            {
                throw py::value_error("CPU kernel variant '" + name + "' is not supported on this CPU or build");
            }
            return cpu::Simd(s);
        }
    }
    std::string valid;
    for (uint32_t s = 0; s < cpu::kNumSimd; ++s)
    {
        valid += (s == 0 ? "'" : ", '") + std::string(cpu::simdName(cpu::Simd(s))) + "'";
    }
    throw py::value_error("CPU kernel variant is '" + name + "'; valid values are " + valid);
}

using Bytes = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

// Element size of a quantized hot dtype (bf16, fp16, fp32).
size_t quantizedDtypeBytes(int dtype)
{
    auto const d = kvcodec::DataType(dtype);
    if (d != kvcodec::DataType::kBFloat16 && d != kvcodec::DataType::kFloat16 && d != kvcodec::DataType::kFloat32)
    {
        throw py::value_error("dtype " + std::to_string(dtype) + " is not quantized (bf16, fp16 or fp32)");
    }
    return kvcodec::dataTypeBytes(d);
}

// The blob plan of every lifecycle of a layout, as the codec makes it at configure time.
// `groups`: [(pools [(base, slot_bytes, num_slots)], lifecycles [(id, buffers [(layer, role,
// pool, dtype, byte_offset, bytes, tokens, heads, dim)])])]. Only the addresses are used: no
// memory is touched.
py::dict planLayout(py::list const& groups, std::string const& paramsJson, uint64_t tileBudget)
{
    using Buf = std::tuple<int32_t, int32_t, int32_t, int32_t, uint64_t, uint64_t, int32_t, int32_t, int32_t>;
    using Lc = std::pair<int32_t, std::vector<Buf>>;
    using Group = std::pair<std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>, std::vector<Lc>>;
    auto const in = groups.cast<std::vector<Group>>();
    std::vector<std::vector<kvcodec::PoolDesc>> pools(in.size());
    std::vector<std::vector<std::vector<kvcodec::BufferDesc>>> buffers(in.size());
    std::vector<std::vector<kvcodec::LifeCycleDesc>> lcs(in.size());
    std::vector<kvcodec::PoolGroupDesc> descs;
    for (size_t g = 0; g < in.size(); ++g)
    {
        for (auto const& [base, slotBytes, numSlots] : in[g].first)
        {
            pools[g].push_back({reinterpret_cast<void*>(uintptr_t(base)), slotBytes, numSlots});
        }
        for (auto const& [id, bufs] : in[g].second)
        {
            auto& out = buffers[g].emplace_back();
            for (auto const& [layer, role, pool, dtype, off, bytes, t, h, d] : bufs)
            {
                out.push_back(
                    {layer, kvcodec::BufferRole(role), pool, kvcodec::DataType(dtype), off, bytes, t, h, d, 0});
            }
        }
        for (size_t i = 0; i < in[g].second.size(); ++i)
        {
            lcs[g].push_back({in[g].second[i].first, uint32_t(buffers[g][i].size()), buffers[g][i].data()});
        }
        descs.push_back({kvcodec::PoolGroupIndex(g), uint32_t(pools[g].size()), pools[g].data(),
            uint32_t(lcs[g].size()), lcs[g].data()});
    }
    Fp8Params params;
    try
    {
        kvcodec::ParamReader reader("fp8", paramsJson.c_str());
        params.read(reader);
        reader.finish();
    }
    catch (kvcodec::ParamError const& e)
    {
        throw py::value_error(e.what());
    }
    kvcodec::HotLayout layout;
    std::string error = layout.load(descs.data(), kvcodec::PoolGroupIndex(descs.size()));
    if (!error.empty())
    {
        throw py::value_error(error);
    }
    py::dict result;
    for (auto const& lc : layout.lifeCycles())
    {
        LifeCyclePlan plan;
        error = planLifeCycle(layout, lc, params, plan, tileBudget);
        if (!error.empty())
        {
            throw py::value_error(error);
        }
        py::list planned;
        for (BufferPlan const& b : plan.buffers)
        {
            py::dict d("quantized"_a = b.quantized, "dtype"_a = b.dtype, "vector"_a = b.vector,
                "hot_aligned"_a = b.hotAligned, "group_lanes"_a = b.groupLanes, "rounds"_a = b.rounds,
                "pool_base"_a = b.poolBase, "slot_bytes"_a = b.slotBytes, "hot_offset"_a = b.hotOffset,
                "bytes"_a = b.bytes, "elems"_a = b.elems, "num_blocks"_a = b.numBlocks, "block_elems"_a = b.blockElems,
                "row_elems"_a = b.rowElems, "row_stride"_a = b.rowStride, "block_stride"_a = b.blockStride,
                "data_offset"_a = b.dataOffset, "scale_offset"_a = b.scaleOffset, "data_end"_a = b.dataEnd,
                "scale_end"_a = b.scaleEnd, "region_end"_a = b.regionEnd, "first_unit"_a = b.firstUnit,
                "units"_a = b.units, "warp_units"_a = b.warpUnits, "tile_blocks"_a = b.tileBlocks);
            planned.append(d);
        }
        py::dict entry("group"_a = lc.group, "cold_page_bytes"_a = plan.coldPageBytes,
            "units_per_page"_a = plan.unitsPerPage, "tile_encode_smem"_a = plan.tileEncodeSmem,
            "tile_decode_smem"_a = plan.tileDecodeSmem, "num_slots"_a = layout.groups()[lc.group].numSlots,
            "buffers"_a = planned);
        result[py::int_(lc.id)] = entry;
    }
    return result;
}

} // namespace

// The kernel entry points of kernel.h, for the host side this module links: no CUDA kernels here.
namespace kvcodec::fp8 {

cudaError_t prepareTileKernel(bool, uint64_t, uint32_t, int*) noexcept
{
    return cudaErrorNotSupported;
}

cudaError_t preloadFp8() noexcept
{
    return cudaErrorNotSupported;
}

cudaError_t launchFp8(KernelArgs const&, int, cudaStream_t) noexcept
{
    return cudaErrorNotSupported;
}

} // namespace kvcodec::fp8

PYBIND11_MODULE(_testing, m)
{
    m.doc() = "Test hooks of the kvcodec fp8 codec plugin.";
    m.attr("FORMAT_VERSION") = kFormatVersion;
    m.def(
        "codec_factory",
        [] { return py::capsule(const_cast<KvcodecCodecFactory*>(codecFactory()), KVCODEC_FACTORY_CAPSULE_NAME); },
        "PyCapsule carrying this module's copy of the fp8 codec's factory (CPU only; its codecs follow set_cpu_simd).");
    m.def("fp32_to_fp8", &convertFp8<float, uint8_t, fp32ToFp8Sat>, py::arg("x"), py::arg("format"),
        "The CPU reference's fp32 -> fp8 conversion (round to nearest even, saturating).");
    m.def(
        "fp32_to_fp8_cuda_header",
        [](py::array_t<float, py::array::c_style | py::array::forcecast> const& x, std::string const& format) {
            __nv_fp8_interpretation_t const kind = parseFormat(format) == Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
            return mapArray<float, uint8_t>(
                x, [kind](float v) { return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, kind)); });
        },
        py::arg("x"), py::arg("format"),
        "__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) as cuda_fp8.h computes it on the host.");
    m.def("fp8_to_fp32", &convertFp8<uint8_t, float, fp8ToFp32>, py::arg("codes"), py::arg("format"),
        "Exact fp32 value of fp8 codes.");
    m.def(
        "fp32_to_bf16", &roundFp32<fp32ToBf16>, "fp32 -> bf16 bits, round to nearest even (decode's output rounding).");
    m.def(
        "fp32_to_fp16", &roundFp32<fp32ToFp16>, "fp32 -> fp16 bits, round to nearest even (decode's output rounding).");
    m.def(
        "block_scale",
        [](float amax, std::string const& format) {
            BlockScale const s = blockScale(amax, parseFormat(format));
            return py::make_tuple(s.scale, s.reciprocal);
        },
        py::arg("amax"), py::arg("format"), "(scale, reciprocal) of a block with finite amax `amax`.");
    m.def(
        "cpu_simd_variants",
        [] {
            std::vector<std::string> out;
            for (uint32_t s = 0; s < cpu::kNumSimd; ++s)
            {
                if (cpu::simdSupported(cpu::Simd(s)))
                {
                    out.emplace_back(cpu::simdName(cpu::Simd(s)));
                }
            }
            return out;
        },
        "The CPU kernel variants this build and CPU can run ('portable' always).");
    m.def(
        "cpu_simd", [] { return std::string(cpu::simdName(cpu::activeSimd())); },
        "The CPU kernel variant CPU codecs use now.");
    m.def(
        "set_cpu_simd",
        [](std::optional<std::string> const& name) {
            cpu::Simd simd{};
            std::optional<std::string> const previous
                = cpu::simdOverride(&simd) ? std::optional<std::string>(cpu::simdName(simd)) : std::nullopt;
            if (name)
            {
                simd = parseSimd(*name);
            }
            cpu::overrideSimd(name ? &simd : nullptr);
            return previous;
        },
        py::arg("name"),
        "Makes CPU codecs use a kernel variant (None: the best supported one again); returns the previous "
        "setting (None: automatic). For tests and comparisons: blobs never depend on it.");
    m.def(
        "cpu_finite_amax",
        [](Bytes const& hot, int dtype, std::string const& simd) {
            size_t const esize = quantizedDtypeBytes(dtype);
            cpu::IeeeScope ieee;
            return cpu::finiteAmax(reinterpret_cast<char const*>(hot.data()), uint64_t(hot.size()) / esize,
                uint32_t(dtype), parseSimd(simd));
        },
        py::arg("hot"), py::arg("dtype"), py::arg("simd"),
        "The CPU kernels' largest finite |x| of hot elements (bytes of a bf16/fp16/fp32 DType).");
    m.def(
        "cpu_quantize",
        [](Bytes const& hot, int dtype, std::string const& format, float reciprocal, std::string const& simd) {
            size_t const esize = quantizedDtypeBytes(dtype);
            uint64_t const n = uint64_t(hot.size()) / esize;
            py::array_t<uint8_t> codes{py::ssize_t(n)};
            cpu::IeeeScope ieee;
            cpu::quantizeRow(reinterpret_cast<char const*>(hot.data()), n, uint32_t(dtype), parseFormat(format),
                reciprocal, codes.mutable_data(), parseSimd(simd));
            return codes;
        },
        py::arg("hot"), py::arg("dtype"), py::arg("format"), py::arg("reciprocal"), py::arg("simd"),
        "The CPU kernels' codes of hot elements (bytes) under a block reciprocal.");
    m.def(
        "cpu_dequantize",
        [](Bytes const& codes, int dtype, std::string const& format, float scale, std::string const& simd,
            size_t offset) {
            size_t const esize = quantizedDtypeBytes(dtype);
            py::array_t<uint8_t> hot{py::ssize_t(codes.size() * esize + offset)};
            cpu::IeeeScope ieee;
            cpu::dequantizeRow(codes.data(), uint64_t(codes.size()), uint32_t(dtype), parseFormat(format), scale,
                reinterpret_cast<char*>(hot.mutable_data()) + offset, parseSimd(simd));
            return hot;
        },
        py::arg("codes"), py::arg("dtype"), py::arg("format"), py::arg("scale"), py::arg("simd"), py::arg("offset") = 0,
        "The CPU kernels' hot bytes of codes under a block scale, written `offset` bytes into the result "
        "(whose first `offset` bytes are left unspecified).");
    m.def("plan_layout", &planLayout, py::arg("groups"), py::arg("params_json"),
        py::arg("tile_budget") = kDefaultTileBudget,
        "{lifecycle id: blob plan} of a layout given as plain tuples (see kvcodec_fp8.plan).");
    m.def("tile_budget", &tileBudget, py::arg("smem_per_sm"), py::arg("smem_optin_per_block"),
        py::arg("reserved_per_block"), "Shared memory bytes a tile may use on a device with these limits.");
    m.attr("DEFAULT_TILE_BUDGET") = kDefaultTileBudget;
    m.attr("MAX_TILE_BUDGET") = kMaxTileBudget;
    m.attr("TILE_META_BYTES") = kTileMetaBytes;
    m.attr("BLOCK_THREADS") = kBlockThreads;
    m.attr("WARPS_PER_CTA") = kWarpsPerCta;
}

// SPDX-License-Identifier: Apache-2.0
//
// kvcodec_fp8._ext: the factory capsule, plus the scalar conversions of the blob format so
// the tests can check them against independent references. Declarations only.
#include <cstdint>

#include <cuda_fp8.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "fp8_codec.h"
#include "fp8_format.h"

namespace py = pybind11;
using namespace kvcodec::fp8;

namespace {

Format parseFormat(std::string const& name)
{
    if (name == "e4m3") return Format::kE4M3;
    if (name == "e5m2") return Format::kE5M2;
    throw py::value_error("format is '" + name + "'; valid values are 'e4m3', 'e5m2'");
}

template <typename In, typename Out, typename F>
py::array_t<Out> mapArray(py::array_t<In, py::array::c_style | py::array::forcecast> const& in, F&& f)
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

} // namespace

PYBIND11_MODULE(_ext, m)
{
    m.doc() = "Native part of the kvcodec fp8 codec plugin.";
    m.attr("FORMAT_VERSION") = kFormatVersion;
    m.def(
        "codec_factory",
        [] { return py::capsule(const_cast<KvcodecCodecFactory*>(fp8CodecFactory()), KVCODEC_FACTORY_CAPSULE_NAME); },
        "PyCapsule carrying the fp8 codec's KvcodecCodecFactory.");
    m.def(
        "fp32_to_fp8",
        [](py::array_t<float, py::array::c_style | py::array::forcecast> const& x, std::string const& format) {
            Format const f = parseFormat(format);
            return mapArray<float, uint8_t>(x, [f](float v) { return fp32ToFp8Sat(v, f); });
        },
        py::arg("x"), py::arg("format"),
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
    m.def(
        "fp8_to_fp32",
        [](py::array_t<uint8_t, py::array::c_style | py::array::forcecast> const& c, std::string const& format) {
            Format const f = parseFormat(format);
            return mapArray<uint8_t, float>(c, [f](uint8_t v) { return fp8ToFp32(v, f); });
        },
        py::arg("codes"), py::arg("format"), "Exact fp32 value of fp8 codes.");
    m.def(
        "fp32_to_bf16",
        [](py::array_t<float, py::array::c_style | py::array::forcecast> const& x) {
            return mapArray<float, uint16_t>(x, [](float v) { return fp32ToBf16(v); });
        },
        "fp32 -> bf16 bits, round to nearest even (decode's output rounding).");
    m.def(
        "fp32_to_fp16",
        [](py::array_t<float, py::array::c_style | py::array::forcecast> const& x) {
            return mapArray<float, uint16_t>(x, [](float v) { return fp32ToFp16(v); });
        },
        "fp32 -> fp16 bits, round to nearest even (decode's output rounding).");
    m.def(
        "block_scale",
        [](float amax, std::string const& format) {
            BlockScale const s = blockScale(amax, parseFormat(format));
            return py::make_tuple(s.scale, s.reciprocal);
        },
        py::arg("amax"), py::arg("format"), "(scale, reciprocal) of a block with finite amax `amax`.");
}

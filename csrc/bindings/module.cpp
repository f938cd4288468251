// SPDX-License-Identifier: Apache-2.0
//
// kvcodec_sdk._native: declarations and conversions only. Logic lives in csrc/src.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "codecs/concat/concat_codec.h"
#include "kvcodec/codec.h"
#include "kvcodec/plugin.h"
#include "runtime/driver_api.h"
#include "runtime/owned_codec.h"

using namespace pybind11::literals;

namespace py = pybind11;
using namespace kvcodec;

void bindConformanceTesting(py::module_& m); // testing.cpp
void bindKvcm(py::module_& m);               // bindings/kvcm.cpp
void bindDisk(py::module_& m);               // bindings/disk.cpp
void bindLog(py::module_& m);                // bindings/log.cpp
void bindDaemon(py::module_& m);             // bindings/daemon.cpp
void bindDlpack(py::module_& m);             // bindings/dlpack.cpp
void bindRemote(py::module_& m);             // bindings/remote.cpp

namespace {

using runtime::HotLayoutStorage;

// The hot-layout descriptors of codec.h as Python classes with named fields; kvcodec_sdk/_boundary.py
// fills them from the facade's dataclasses.
void bindLayout(py::module_& m)
{
    py::class_<PoolDesc>(m, "PoolDesc", "One hot pool (kvcodec::PoolDesc).")
        .def(py::init([](uintptr_t base, uint64_t slotBytes, uint64_t numSlots) {
            return PoolDesc{reinterpret_cast<void*>(base), slotBytes, numSlots};
        }),
            py::arg("base") = 0, py::arg("slot_bytes") = 0, py::arg("num_slots") = 0)
        .def_property(
            "base", [](PoolDesc const& p) { return reinterpret_cast<uintptr_t>(p.base); },
            [](PoolDesc& p, uintptr_t v) { p.base = reinterpret_cast<void*>(v); })
        .def_readwrite("slot_bytes", &PoolDesc::slotBytes)
        .def_readwrite("num_slots", &PoolDesc::numSlots);

    py::class_<BufferDesc>(m, "BufferDesc", "One buffer inside a hot slot (kvcodec::BufferDesc).")
        .def(py::init([](int32_t layerId, int32_t role, int32_t poolIndex, int32_t dtype, uint64_t byteOffset,
                          uint64_t bytes, int32_t tokensPerPage, int32_t numHeads, int32_t headDim) {
            return BufferDesc{layerId, BufferRole(role), poolIndex, DataType(dtype), byteOffset, bytes, tokensPerPage,
                numHeads, headDim, 0};
        }),
            py::arg("layer_id") = 0, py::arg("role") = 0, py::arg("pool_index") = 0, py::arg("dtype") = 0,
            py::arg("byte_offset") = 0, py::arg("bytes") = 0, py::arg("tokens_per_page") = 0, py::arg("num_heads") = 0,
            py::arg("head_dim") = 0)
        .def_readwrite("layer_id", &BufferDesc::layerId)
        .def_property(
            "role", [](BufferDesc const& b) { return int32_t(b.role); },
            [](BufferDesc& b, int32_t v) { b.role = BufferRole(v); })
        .def_readwrite("pool_index", &BufferDesc::poolIndex)
        .def_property(
            "dtype", [](BufferDesc const& b) { return int32_t(b.dtype); },
            [](BufferDesc& b, int32_t v) { b.dtype = DataType(v); })
        .def_readwrite("byte_offset", &BufferDesc::byteOffset)
        .def_readwrite("bytes", &BufferDesc::bytes)
        .def_readwrite("tokens_per_page", &BufferDesc::tokensPerPage)
        .def_readwrite("num_heads", &BufferDesc::numHeads)
        .def_readwrite("head_dim", &BufferDesc::headDim);

    py::class_<HotLayoutStorage::LifeCycle>(m, "LifeCycleDesc", "A lifecycle and its buffers (kvcodec::LifeCycleDesc).")
        .def(py::init([](int32_t id, std::vector<BufferDesc> buffers) {
            return HotLayoutStorage::LifeCycle{id, std::move(buffers)};
        }),
            py::arg("lifecycle_id") = 0, py::arg("buffers") = std::vector<BufferDesc>())
        .def_readwrite("lifecycle_id", &HotLayoutStorage::LifeCycle::id)
        .def_readwrite("buffers", &HotLayoutStorage::LifeCycle::buffers);

    py::class_<HotLayoutStorage::Group>(m, "PoolGroupDesc", "A hot pool group (kvcodec::PoolGroupDesc).")
        .def(py::init([](std::vector<PoolDesc> pools, std::vector<HotLayoutStorage::LifeCycle> lifecycles) {
            return HotLayoutStorage::Group{std::move(pools), std::move(lifecycles)};
        }),
            py::arg("pools") = std::vector<PoolDesc>(),
            py::arg("lifecycles") = std::vector<HotLayoutStorage::LifeCycle>())
        .def_readwrite("pools", &HotLayoutStorage::Group::pools)
        .def_readwrite("lifecycles", &HotLayoutStorage::Group::lifeCycles);
}

KvcodecCodecFactory const* factoryFromCapsule(py::object const& obj)
{
    PyObject* raw = obj.ptr();
    if (!PyCapsule_CheckExact(raw))
    {
        throw py::type_error("expected a PyCapsule named '" KVCODEC_FACTORY_CAPSULE_NAME "', got "
            + std::string(py::str(py::type::of(obj))));
    }
    char const* name = PyCapsule_GetName(raw);
    if (name == nullptr || std::strcmp(name, KVCODEC_FACTORY_CAPSULE_NAME) != 0)
    {
        throw py::type_error(
            std::string("expected a PyCapsule named '" KVCODEC_FACTORY_CAPSULE_NAME "', got one named '")
            + (name ? name : "<null>") + "'");
    }
    return static_cast<KvcodecCodecFactory const*>(PyCapsule_GetPointer(raw, name));
}

// Bytes of a C-contiguous buffer; strided views are refused rather than hashed wrongly.
std::pair<void const*, size_t> contiguousBytes(py::buffer const& data, char const* what)
{
    py::buffer_info info = data.request();
    py::ssize_t expected = info.itemsize;
    for (py::ssize_t d = info.ndim - 1; d >= 0; --d)
    {
        if (info.shape[d] > 1 && info.strides[d] != expected)
        {
            throw py::value_error(std::string(what) + " must be a C-contiguous buffer (got a strided view)");
        }
        expected *= info.shape[d];
    }
    return {info.ptr, size_t(info.size) * size_t(info.itemsize)};
}

IKvCacheColdPageCodec* live(runtime::OwnedCodec const& c)
{
    if (c.get() == nullptr)
    {
        throw std::runtime_error("the native codec was released");
    }
    return c.get();
}

} // namespace

PYBIND11_MODULE(_native, m)
{
    m.doc() = "Native core of kvcodec_sdk (codec contract, plugin ABI, built-in concat codec).";
    m.attr("ABI_VERSION") = KVCODEC_PLUGIN_ABI_VERSION;
    m.attr("FACTORY_CAPSULE_NAME") = KVCODEC_FACTORY_CAPSULE_NAME;
    m.attr("DEVICE_CPU") = KVCODEC_DEVICE_CPU;

    m.def(
        "concat_factory",
        [] {
            return py::capsule(
                const_cast<KvcodecCodecFactory*>(concat::concatCodecFactory()), KVCODEC_FACTORY_CAPSULE_NAME);
        },
        "PyCapsule carrying the built-in concat codec's factory.");

    m.def(
        "factory_info",
        [](py::object const& capsule) {
            KvcodecCodecFactory const* f = factoryFromCapsule(capsule);
            runtime::checkFactoryAbi(f);
            py::dict d("name"_a = std::string(f->name), "format_version"_a = f->formatVersion,
                "abi_version"_a = f->abiVersion);
            return d;
        },
        py::arg("capsule"), "ABI-checked name and format version of a factory capsule.");

    m.def(
        "driver_info",
        [] {
            auto const& api = runtime::driverApi();
            py::dict d("driver_version"_a = api.driverVersion,
                "memcpy_batch"_a = api.memcpyBatchAsyncV13 ? "13.0" : (api.memcpyBatchAsyncV12 ? "12.8" : ""));
            int count = 0;
            if (cudaGetDeviceCount(&count) != cudaSuccess)
            {
                cudaGetLastError();
                count = 0;
            }
            d["device_count"] = count;
            d["cuda_build"] = CUDART_VERSION; // the CUDA toolkit the SDK was compiled with
            return d;
        },
        "CUDA driver version, which cuMemcpyBatchAsync signature was found, and the device count.");

    m.def(
        "crc32c",
        [](py::buffer data, uint32_t crc) {
            auto [ptr, bytes] = contiguousBytes(data, "data");
            return crc32c(ptr, bytes, crc);
        },
        py::arg("data"), py::arg("crc") = 0, "CRC-32C (Castagnoli) of a buffer, as the envelope uses it.");

    m.def(
        "check_envelope",
        [](py::buffer blob, uint16_t formatVersion) {
            auto [ptr, bytes] = contiguousBytes(blob, "blob");
            return int(checkColdPageEnvelope(ptr, bytes, formatVersion));
        },
        py::arg("blob"), py::arg("format_version"), "EnvelopeStatus of one enveloped blob in host memory.");

    py::class_<runtime::OwnedCodec>(m, "NativeCodec", "An owned native codec created through a factory.")
        .def(py::init([](py::object const& capsule, std::string const& paramsJson, int32_t device) {
            return new runtime::OwnedCodec(factoryFromCapsule(capsule), paramsJson, device);
        }),
            py::arg("factory"), py::arg("params_json"), py::arg("device"))
        .def_property_readonly("name", &runtime::OwnedCodec::name)
        .def_property_readonly("format_version", &runtime::OwnedCodec::formatVersion)
        .def_property_readonly("device", &runtime::OwnedCodec::device)
        .def_property_readonly("released", [](runtime::OwnedCodec const& c) { return c.get() == nullptr; })
        .def(
            "configure",
            [](runtime::OwnedCodec& c, std::vector<HotLayoutStorage::Group> groups) {
                HotLayoutStorage layout;
                layout.groups = std::move(groups);
                auto const& descs = layout.descs();
                return live(c)->configure(descs.empty() ? nullptr : descs.data(), PoolGroupIndex(descs.size()));
            },
            py::arg("groups"))
        .def(
            "configure_raw",
            [](runtime::OwnedCodec& c, uintptr_t descs, int64_t num) {
                return live(c)->configure(reinterpret_cast<PoolGroupDesc const*>(descs), PoolGroupIndex(num));
            },
            py::arg("descs_ptr"), py::arg("num"),
            "configure() with a raw PoolGroupDesc pointer (invalid-argument tests).")
        .def(
            "query_cold_page_bytes", [](runtime::OwnedCodec& c, int32_t id) { return live(c)->queryColdPageBytes(id); })
        .def("get_batching_layer_group_id",
            [](runtime::OwnedCodec& c, int32_t id) { return live(c)->getBatchingLayerGroupId(id); })
        .def("query_page_index_location",
            [](runtime::OwnedCodec& c, int32_t id) { return int(live(c)->queryPageIndexLocation(id)); })
        .def(
            "encode",
            [](runtime::OwnedCodec& c, int32_t id, uintptr_t dst, uintptr_t indices, size_t n, uintptr_t stream) {
                IKvCacheColdPageCodec* codec = live(c);
                py::gil_scoped_release release;
                return codec->encode(id, reinterpret_cast<void*>(dst), reinterpret_cast<PageIndexPair const*>(indices),
                    n, reinterpret_cast<cudaStream_t>(stream));
            },
            py::arg("layer_group_id"), py::arg("dst_base"), py::arg("page_indices"), py::arg("num_pages"),
            py::arg("stream"))
        .def(
            "decode",
            [](runtime::OwnedCodec& c, int32_t id, uintptr_t src, uintptr_t indices, size_t n, uintptr_t stream) {
                IKvCacheColdPageCodec* codec = live(c);
                py::gil_scoped_release release;
                return codec->decode(id, reinterpret_cast<void const*>(src),
                    reinterpret_cast<PageIndexPair const*>(indices), n, reinterpret_cast<cudaStream_t>(stream));
            },
            py::arg("layer_group_id"), py::arg("src_base"), py::arg("page_indices"), py::arg("num_pages"),
            py::arg("stream"))
        .def_property_readonly("abi_version", &runtime::OwnedCodec::abiVersion)
        .def_property_readonly("has_checked_decode",
            [](runtime::OwnedCodec& c) {
                (void)live(c);
                return c.hasCheckedDecode();
            })
        .def(
            "decode_checked",
            [](runtime::OwnedCodec& c, int32_t id, uintptr_t src, uintptr_t indices, size_t n, uintptr_t status,
                uintptr_t stream) {
                IKvCacheColdPageCodec* codec = live(c);
                if (!c.hasCheckedDecode())
                {
                    throw std::invalid_argument(std::string("codec '") + c.name()
                        + "' has no decodeChecked() (plugin ABI " + std::to_string(c.abiVersion())
                        + ", hasCheckedDecode() false)");
                }
                py::gil_scoped_release release;
                return codec->decodeChecked(id, reinterpret_cast<void const*>(src),
                    reinterpret_cast<PageIndexPair const*>(indices), n, reinterpret_cast<uint8_t*>(status),
                    reinterpret_cast<cudaStream_t>(stream));
            },
            py::arg("layer_group_id"), py::arg("src_base"), py::arg("page_indices"), py::arg("num_pages"),
            py::arg("page_status"), py::arg("stream"))
        .def("last_error", [](runtime::OwnedCodec& c) { return std::string(live(c)->lastError()); })
        .def("release", &runtime::OwnedCodec::release);

    bindLayout(m);
    bindConformanceTesting(m);
    bindDlpack(m);
    bindRemote(m);
    bindDisk(m); // before kvcm: its DiskTierConfig holds disk.FaultRule values
    bindKvcm(m);
    bindLog(m); // after kvcm: its test hook joins kvcm_testing
    bindDaemon(m);

    // The submodules import by their dotted names too (type checkers and stubtest do so).
    py::dict modules = py::module_::import("sys").attr("modules");
    for (char const* sub : {"kvcm", "kvcm_testing", "disk"})
    {
        modules[py::str(py::str(m.attr("__name__")).cast<std::string>() + "." + sub)] = m.attr(sub);
    }
}

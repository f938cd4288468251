// SPDX-License-Identifier: Apache-2.0
//
// kvcodec_sdk._native.dlpack_capsule: a DLPack capsule over memory the caller owns, so that the
// SDK's framework-neutral arrays (kvcodec_sdk.gpu.DeviceArray) can be taken by torch, CuPy, JAX
// or numpy without a copy and without any of them installed here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// The DLPack ABI (version 0.8 "dltensor" capsules, which every consumer accepts).
struct DLDevice
{
    int32_t deviceType;
    int32_t deviceId;
};
struct DLDataType
{
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
};
struct DLTensor
{
    void* data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t* shape;
    int64_t* strides;
    uint64_t byteOffset;
};
struct DLManagedTensor
{
    DLTensor tensor;
    void* managerCtx;
    void (*deleter)(DLManagedTensor*);
};

constexpr char const* kCapsuleName = "dltensor";
constexpr char const* kUsedCapsuleName = "used_dltensor";

// What the managed tensor owns: the shape/stride storage and a reference to the Python object
// that keeps the memory alive.
struct Context
{
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;
    PyObject* owner;
};

void deleteManaged(DLManagedTensor* managed)
{
    if (managed == nullptr)
        return;
    auto* ctx = static_cast<Context*>(managed->managerCtx);
    {
        // A consumer may free its tensor from any thread, with or without the GIL.
        PyGILState_STATE gil = PyGILState_Ensure();
        Py_XDECREF(ctx->owner);
        PyGILState_Release(gil);
    }
    delete ctx;
    delete managed;
}

// A capsule nobody consumed still owns its tensor.
void destroyCapsule(PyObject* capsule)
{
    if (PyCapsule_IsValid(capsule, kUsedCapsuleName))
        return;
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    if (managed == nullptr)
    {
        PyErr_Clear();
        return;
    }
    managed->deleter(managed);
}

// numpy-style type codes ("u1", "f2", "bf16", ...) to DLPack (kDLInt 0, kDLUInt 1, kDLFloat 2,
// kDLBfloat 4, kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12).
DLDataType parseDtype(std::string const& code)
{
    if (code == "bf16")
        return {4, 16, 1};
    if (code == "f8e4m3")
        return {10, 8, 1};
    if (code == "f8e5m2")
        return {12, 8, 1};
    if (code.size() == 2 && code[1] >= '1' && code[1] <= '8')
    {
        auto bits = uint8_t((code[1] - '0') * 8);
        if (code[0] == 'u')
            return {1, bits, 1};
        if (code[0] == 'i')
            return {0, bits, 1};
        if (code[0] == 'f' && bits >= 16)
            return {2, bits, 1};
    }
    throw py::value_error("dtype is '" + code + "'; use u1/u2/u4/u8, i1/i2/i4/i8, f2/f4/f8, bf16, f8e4m3 or f8e5m2");
}

py::capsule makeCapsule(uintptr_t address, std::vector<int64_t> shape, std::vector<int64_t> strides,
    std::string const& dtype, int32_t deviceType, int32_t deviceId, py::object const& owner)
{
    if (!strides.empty() && strides.size() != shape.size())
        throw py::value_error("strides has " + std::to_string(strides.size()) + " entries for "
            + std::to_string(shape.size()) + " dimensions; pass one per dimension (in elements) or none");
    for (int64_t extent : shape)
    {
        if (extent < 0)
            throw py::value_error("shape holds " + std::to_string(extent) + "; extents must be >= 0");
    }
    DLDataType type = parseDtype(dtype);
    auto ctx = std::make_unique<Context>(Context{std::move(shape), std::move(strides), owner.ptr()});
    auto managed = std::make_unique<DLManagedTensor>();
    managed->tensor.data = reinterpret_cast<void*>(address);
    managed->tensor.device = {deviceType, deviceId};
    managed->tensor.ndim = int32_t(ctx->shape.size());
    managed->tensor.dtype = type;
    managed->tensor.shape = ctx->shape.data();
    managed->tensor.strides = ctx->strides.empty() ? nullptr : ctx->strides.data();
    managed->tensor.byteOffset = 0;
    managed->deleter = deleteManaged;
    managed->managerCtx = ctx.get();
    PyObject* capsule = PyCapsule_New(managed.get(), kCapsuleName, destroyCapsule);
    if (capsule == nullptr)
        throw py::error_already_set();
    Py_INCREF(owner.ptr()); // released by deleteManaged, whoever calls it
    ctx.release();
    managed.release();
    return py::reinterpret_steal<py::capsule>(capsule);
}

} // namespace

void bindDlpack(py::module_& m)
{
    m.def("dlpack_capsule", &makeCapsule, py::arg("address"), py::arg("shape"), py::arg("strides"), py::arg("dtype"),
        py::arg("device_type"), py::arg("device_id"), py::arg("owner"),
        "A DLPack 'dltensor' capsule over memory at `address` (shape and strides in elements; empty strides: "
        "C-contiguous). The capsule holds a reference to `owner` until its consumer frees the tensor.");
}

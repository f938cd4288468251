// SPDX-License-Identifier: Apache-2.0
//
// Page handles at the boundary: kvcodec_sdk.PageHandle objects read and made straight through
// their slots, so calls given hundreds of handles, and lookups returning hundreds, do not pay for
// Python code per handle.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <structmember.h>

#include <cstdint>

#include "kvcm_types.h"

namespace kvcodec::bindings {
namespace {

/// Byte offset of the ``__slots__`` member ``name`` of ``type`` in its instances, or -1 when that
/// attribute is not a plain object slot (the class was changed: callers then take the slow path).
Py_ssize_t slotOffset(PyTypeObject* type, char const* name)
{
    py::object const d
        = py::reinterpret_steal<py::object>(PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), name));
    if (!d || !PyObject_TypeCheck(d.ptr(), &PyMemberDescr_Type))
    {
        PyErr_Clear();
        return -1;
    }
    PyMemberDef const* def = reinterpret_cast<PyMemberDescrObject*>(d.ptr())->d_member;
    return def->type == T_OBJECT_EX ? def->offset : -1;
}

/// Where a handle class (``kvcodec_sdk.PageHandle``) keeps its ``_manager`` and ``id`` slots;
/// nullptr when either is not a plain object slot. Computed once per class, which it keeps alive
/// so the offsets stay those of a live class. Called with the GIL.
struct HandleSlots
{
    PyTypeObject* type;
    Py_ssize_t managerAt;
    Py_ssize_t idAt;
};

HandleSlots const* handleSlots(py::handle handleType)
{
    static PyObject* cached = nullptr;
    static HandleSlots slots{nullptr, -1, -1};
    if (!PyType_Check(handleType.ptr()))
    {
        return nullptr;
    }
    if (handleType.ptr() != cached)
    {
        auto* type = reinterpret_cast<PyTypeObject*>(handleType.ptr());
        slots = HandleSlots{type, slotOffset(type, "_manager"), slotOffset(type, "id")};
        Py_INCREF(handleType.ptr());
        Py_XDECREF(cached);
        cached = handleType.ptr();
    }
    return slots.managerAt < 0 || slots.idAt < 0 ? nullptr : &slots;
}

PyObject*& slotAt(PyObject* object, Py_ssize_t offset)
{
    return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(object) + offset);
}

/// The page ids of a list or tuple of PageHandles of ``manager`` (``handleType``), read straight
/// from the handles' slots; None for anything else (another container, another type, another
/// manager, an id that is not a 64-bit int), which the caller then checks item by item to say what
/// is wrong. Runs with the GIL; past the output's allocation it calls no Python code, so the
/// container cannot change while it is read.
py::object handleIds(py::handle pages, py::handle manager, py::handle handleType)
{
    HandleSlots const* h = handleSlots(handleType);
    PyObject* seq = pages.ptr();
    if (h == nullptr || (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)))
    {
        return py::none();
    }
    Py_ssize_t const n = PySequence_Fast_GET_SIZE(seq);
    py::array_t<uint64_t> out(n); // Allocating may run the collector and finalizers: look again.
    if (PySequence_Fast_GET_SIZE(seq) != n)
    {
        return py::none();
    }
    PyObject** items = PySequence_Fast_ITEMS(seq);
    uint64_t* ids = out.mutable_data();
    for (Py_ssize_t i = 0; i < n; ++i)
    {
        if (Py_TYPE(items[i]) != h->type || slotAt(items[i], h->managerAt) != manager.ptr())
        {
            return py::none(); // The type first: another object's memory is not read at the offsets.
        }
        PyObject* id = slotAt(items[i], h->idAt);
        if (id == nullptr || !PyLong_CheckExact(id))
        {
            return py::none();
        }
        unsigned long long const v = PyLong_AsUnsignedLongLong(id);
        if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred())
        {
            PyErr_Clear();
            return py::none();
        }
        ids[i] = uint64_t(v);
    }
    return std::move(out);
}

/// A list with a handle of ``manager`` (``handleType``, built without ``__init__``) per nonzero page
/// id and None per 0, as a lookup returns them; None when the class's slots are not plain ones.
py::object makeHandles(py::array_t<uint64_t, py::array::c_style | py::array::forcecast> const& ids, py::handle manager,
    py::handle handleType)
{
    HandleSlots const* h = handleSlots(handleType);
    if (h == nullptr)
    {
        return py::none();
    }
    uint64_t const* id = ids.data();
    py::list out(ids.size());
    for (py::ssize_t i = 0; i < ids.size(); ++i)
    {
        if (id[i] == 0)
        {
            PyList_SET_ITEM(out.ptr(), i, py::none().release().ptr());
            continue;
        }
        py::object value = py::reinterpret_steal<py::object>(PyLong_FromUnsignedLongLong(id[i]));
        py::object handle = py::reinterpret_steal<py::object>(h->type->tp_alloc(h->type, 0));
        if (!value || !handle)
        {
            throw py::error_already_set();
        }
        Py_INCREF(manager.ptr());
        slotAt(handle.ptr(), h->managerAt) = manager.ptr();
        slotAt(handle.ptr(), h->idAt) = value.release().ptr();
        PyList_SET_ITEM(out.ptr(), i, handle.release().ptr());
    }
    return std::move(out);
}

} // namespace

void bindKvcmHandles(py::module_& k)
{
    k.def("make_handles", &makeHandles, py::arg("ids"), py::arg("manager"), py::arg("handle_type"),
        "A handle of manager per nonzero id and None per 0, in a list; None when handle_type's "
        "slots are not plain ones.");
    k.def("handle_ids", &handleIds, py::arg("pages"), py::arg("manager"), py::arg("handle_type"),
        "The ids of a list or tuple of PageHandles of manager, read from their slots in one pass; "
        "None when any item is not one (the caller then says which).");
}

} // namespace kvcodec::bindings

// SPDX-License-Identifier: Apache-2.0
//
// Conversions shared by the bindings of the remote tier's values (daemon.cpp, remote.cpp): keys,
// buffers and identity hashes, taken with the GIL held so that the calls can run without it.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/values.h"

namespace kvcodec::bindings {

namespace py = pybind11;

/// The bytes of a C-contiguous buffer (`what` names it in the error otherwise).
inline std::pair<void*, size_t> bytesOf(py::buffer const& b, bool writable, std::string const& what)
{
    py::buffer_info info = b.request(writable);
    if (!PyBuffer_IsContiguous(info.view(), 'C'))
        throw py::value_error(what + " must be a C-contiguous buffer");
    return {info.ptr, size_t(info.size) * size_t(info.itemsize)};
}

/// Views of the keys as bytes (bytes objects are read in place; other bytes-like ones converted).
/// `hold` keeps every object viewed alive while the call runs without the GIL.
struct Keys
{
    py::list hold;
    std::vector<std::string_view> views;
};

inline Keys keysOf(py::handle keys)
{
    Keys k{py::reinterpret_steal<py::list>(PySequence_List(keys.ptr())), {}};
    if (!k.hold)
        throw py::error_already_set();
    size_t const n = size_t(PyList_GET_SIZE(k.hold.ptr()));
    k.views.reserve(n);
    for (size_t i = 0; i < n; ++i)
    {
        PyObject* item = PyList_GET_ITEM(k.hold.ptr(), Py_ssize_t(i));
        if (!PyBytes_Check(item))
        {
            PyObject* b = PyBytes_FromObject(item);
            if (b == nullptr)
                throw py::type_error("keys[" + std::to_string(i) + "] is not bytes-like");
            PyList_SET_ITEM(k.hold.ptr(), Py_ssize_t(i), b); // steals b, drops the original
            item = b;
        }
        k.views.emplace_back(PyBytes_AS_STRING(item), size_t(PyBytes_GET_SIZE(item)));
    }
    return k;
}

/// Read-only views of `bufs`; a buffer that is not C-contiguous is named as field[i].
inline std::vector<std::pair<void const*, size_t>> sourcesOf(std::vector<py::buffer> const& bufs, char const* field)
{
    std::vector<std::pair<void const*, size_t>> out;
    out.reserve(bufs.size());
    for (size_t i = 0; i < bufs.size(); ++i)
        out.push_back(bytesOf(bufs[i], false, std::string(field) + "[" + std::to_string(i) + "]"));
    return out;
}

/// Writable destinations of `bufs`, named as field[i] in errors.
inline std::vector<daemon::OutBuffer> destinationsOf(std::vector<py::buffer> const& bufs, char const* field)
{
    std::vector<daemon::OutBuffer> out;
    out.reserve(bufs.size());
    for (size_t i = 0; i < bufs.size(); ++i)
    {
        auto const [p, n] = bytesOf(bufs[i], true, std::string(field) + "[" + std::to_string(i) + "]");
        out.push_back({p, n});
    }
    return out;
}

/// The 16-byte identity hash of the remote tier's values.
inline daemon::IdentityHash identityOf(py::bytes const& identity)
{
    std::string_view const s = identity;
    daemon::IdentityHash id{};
    if (s.size() != id.size())
        throw py::value_error("identity holds " + std::to_string(s.size()) + " bytes; it must be the "
            + std::to_string(id.size()) + "-byte identity hash");
    std::copy(s.begin(), s.end(), id.begin());
    return id;
}

} // namespace kvcodec::bindings

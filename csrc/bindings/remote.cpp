// SPDX-License-Identifier: Apache-2.0
//
// Bindings of the remote cold tier's native helpers (kvcodec_sdk._native.remote): declarations
// and conversions only. The Python side is kvcodec_sdk/remote/backend.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <vector>

#include "tiers/remote/stored_values.h"

namespace py = pybind11;
using namespace kvcodec::remote;

void bindRemote(py::module_& parent)
{
    py::module_ m = parent.def_submodule("remote", "The remote cold tier's native helpers.");
    m.attr("HEADER_BYTES") = kHeaderBytes;
    m.def(
        "unpack_values",
        [](std::vector<py::bytes> const& keys, std::vector<py::buffer> const& stored,
            std::vector<py::buffer> const& outs, py::bytes const& identity) {
            if (stored.size() != keys.size() || outs.size() != keys.size())
            {
                throw py::value_error("keys, stored and outs have " + std::to_string(keys.size()) + ", "
                    + std::to_string(stored.size()) + " and " + std::to_string(outs.size())
                    + " items: give one stored value and one output buffer per key");
            }
            std::string const id = identity;
            if (id.size() != kIdentityBytes)
            {
                throw py::value_error("identity holds " + std::to_string(id.size()) + " bytes; it must be the "
                    + std::to_string(kIdentityBytes) + "-byte identity hash");
            }
            Identity ident;
            std::memcpy(ident.data(), id.data(), kIdentityBytes);
            // The views stay alive (and the buffers locked) until the values are unpacked.
            std::vector<py::buffer_info> views;
            views.reserve(2 * keys.size());
            std::vector<LandedValue> values(keys.size());
            for (size_t i = 0; i < keys.size(); ++i)
            {
                char* k = nullptr;
                Py_ssize_t kn = 0;
                PyBytes_AsStringAndSize(keys[i].ptr(), &k, &kn);
                py::buffer_info const& s = views.emplace_back(stored[i].request(false));
                py::buffer_info const& o = views.emplace_back(outs[i].request(true));
                if (!PyBuffer_IsContiguous(s.view(), 'C') || !PyBuffer_IsContiguous(o.view(), 'C'))
                {
                    throw py::value_error("stored[" + std::to_string(i) + "] and outs[" + std::to_string(i)
                        + "] must be C-contiguous buffers");
                }
                values[i] = LandedValue{std::string_view(k, size_t(kn)), static_cast<unsigned char const*>(s.ptr),
                    uint64_t(s.size) * uint64_t(s.itemsize), static_cast<unsigned char*>(o.ptr),
                    uint64_t(o.size) * uint64_t(o.itemsize)};
            }
            std::vector<int64_t> results(keys.size());
            {
                py::gil_scoped_release nogil;
                unpackValues(values.data(), values.size(), ident, results.data());
            }
            return results;
        },
        py::arg("keys"), py::arg("stored"), py::arg("outs"), py::arg("identity"),
        "Checks each stored value (header and payload, as landed from the store) read under keys[i] "
        "and copies its payload into outs[i]: per key the payload's size or a GET_* code "
        "(kvcodec_sdk.remote.backend), without the GIL, large batches over several threads.");
}

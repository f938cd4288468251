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

namespace {

Identity identityOf(py::bytes const& identity)
{
    std::string const id = identity;
    if (id.size() != kIdentityBytes)
    {
        throw py::value_error("identity holds " + std::to_string(id.size()) + " bytes; it must be the "
            + std::to_string(kIdentityBytes) + "-byte identity hash");
    }
    Identity ident;
    std::memcpy(ident.data(), id.data(), kIdentityBytes);
    return ident;
}

std::string_view keyOf(py::bytes const& key)
{
    char* k = nullptr;
    Py_ssize_t n = 0;
    PyBytes_AsStringAndSize(key.ptr(), &k, &n);
    return std::string_view(k, size_t(n));
}

} // namespace

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
            Identity const ident = identityOf(identity);
            // The views stay alive (and the buffers locked) until the values are unpacked.
            std::vector<py::buffer_info> views;
            views.reserve(2 * keys.size());
            std::vector<LandedValue> values(keys.size());
            for (size_t i = 0; i < keys.size(); ++i)
            {
                py::buffer_info const& s = views.emplace_back(stored[i].request(false));
                py::buffer_info const& o = views.emplace_back(outs[i].request(true));
                if (!PyBuffer_IsContiguous(s.view(), 'C') || !PyBuffer_IsContiguous(o.view(), 'C'))
                {
                    throw py::value_error("stored[" + std::to_string(i) + "] and outs[" + std::to_string(i)
                        + "] must be C-contiguous buffers");
                }
                values[i] = LandedValue{keyOf(keys[i]), static_cast<unsigned char const*>(s.ptr),
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
    m.def(
        "pack_headers",
        [](std::vector<py::bytes> const& keys, std::vector<py::buffer> const& payloads, py::bytes const& identity) {
            if (payloads.size() != keys.size())
            {
                throw py::value_error("keys and payloads have " + std::to_string(keys.size()) + " and "
                    + std::to_string(payloads.size()) + " items: give one payload per key");
            }
            Identity const ident = identityOf(identity);
            std::vector<py::buffer_info> views;
            views.reserve(keys.size());
            std::vector<ValueToStore> values(keys.size());
            for (size_t i = 0; i < keys.size(); ++i)
            {
                py::buffer_info const& p = views.emplace_back(payloads[i].request(false));
                if (!PyBuffer_IsContiguous(p.view(), 'C'))
                {
                    throw py::value_error("payloads[" + std::to_string(i) + "] must be a C-contiguous buffer");
                }
                values[i] = ValueToStore{
                    keyOf(keys[i]), static_cast<unsigned char const*>(p.ptr), uint64_t(p.size) * uint64_t(p.itemsize)};
            }
            std::string headers(keys.size() * kHeaderBytes, '\0');
            {
                py::gil_scoped_release nogil;
                packHeaders(values.data(), values.size(), ident, reinterpret_cast<unsigned char*>(headers.data()));
            }
            return py::bytes(headers);
        },
        py::arg("keys"), py::arg("payloads"), py::arg("identity"),
        "The headers of payloads[i] stored under keys[i] (ValueHeader.for_payload(...).pack() of each, "
        "kvcodec_sdk.remote.backend), one after the other in one bytes object; the payloads' checksums "
        "without the GIL, large batches over several threads.");
}

// SPDX-License-Identifier: Apache-2.0
//
// Bindings of the remote cold tier's native helpers (kvcodec_sdk._native.remote): declarations
// and conversions only (daemon/values.h holds the logic). The Python side is
// kvcodec_sdk/remote/backend.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "buffers.h"
#include "daemon/values.h"

namespace py = pybind11;
using namespace kvcodec::bindings;
using namespace kvcodec::daemon;

void bindRemote(py::module_& parent)
{
    py::module_ m = parent.def_submodule("remote", "The remote cold tier's native helpers.");
    m.attr("HEADER_BYTES") = kValueHeaderBytes;
    m.def(
        "unpack_values",
        [](py::handle keys, std::vector<py::buffer> const& stored, std::vector<py::buffer> const& outs,
            py::bytes const& identity) {
            Keys const k = keysOf(keys);
            if (stored.size() != k.views.size() || outs.size() != k.views.size())
                throw py::value_error("keys, stored and outs have " + std::to_string(k.views.size()) + ", "
                    + std::to_string(stored.size()) + " and " + std::to_string(outs.size())
                    + " items: give one stored value and one output buffer per key");
            IdentityHash const id = identityOf(identity);
            auto const values = sourcesOf(stored, "stored");
            auto const dst = destinationsOf(outs, "outs");
            py::gil_scoped_release nogil;
            return unpackValues(k.views, values, dst, id);
        },
        py::arg("keys"), py::arg("stored"), py::arg("outs"), py::arg("identity"),
        "Checks each stored value (header and payload, as landed from the store) read under keys[i] "
        "and copies its payload into outs[i]: per key the payload's size or a GET_* code "
        "(kvcodec_sdk.remote.backend), without the GIL, large batches over several threads.");
    m.def(
        "pack_headers",
        [](py::handle keys, std::vector<py::buffer> const& payloads, py::bytes const& identity) {
            Keys const k = keysOf(keys);
            if (payloads.size() != k.views.size())
                throw py::value_error("keys and payloads have " + std::to_string(k.views.size()) + " and "
                    + std::to_string(payloads.size()) + " items: give one payload per key");
            IdentityHash const id = identityOf(identity);
            auto const sources = sourcesOf(payloads, "payloads");
            std::string headers(k.views.size() * kValueHeaderBytes, '\0');
            {
                py::gil_scoped_release nogil;
                packValueHeaders(k.views, sources, id, reinterpret_cast<uint8_t*>(headers.data()));
            }
            return py::bytes(headers);
        },
        py::arg("keys"), py::arg("payloads"), py::arg("identity"),
        "The headers of payloads[i] stored under keys[i] (ValueHeader.for_payload(...).pack() of each, "
        "kvcodec_sdk.remote.backend), one after the other in one bytes object; the payloads' checksums "
        "without the GIL, large batches over several threads.");
}

// SPDX-License-Identifier: Apache-2.0
//
// kvcodec_sdk._native: helpers of the conformance suite (kvcodec_sdk.testing).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>

#include "runtime/stream_blocker.h"

namespace py = pybind11;

void bindConformanceTesting(py::module_& m)
{
    using kvcodec::runtime::StreamBlocker;
    py::class_<StreamBlocker>(m, "StreamBlocker",
        "Holds a CUDA stream at a wait on a mapped host flag until release() (conformance suite helper). "
        "The stream must outlive the blocker; deleting the blocker releases the stream.")
        .def(py::init([](uintptr_t stream) {
            return std::make_unique<StreamBlocker>(reinterpret_cast<cudaStream_t>(stream));
        }),
            py::arg("stream"), "Blocks the stream (a raw cudaStream_t value).")
        .def("release", &StreamBlocker::release, "Lets the stream run on. Idempotent.")
        .def("release_after", &StreamBlocker::releaseAfter, py::arg("delay_ms"),
            "Lets the stream run on `delay_ms` milliseconds from now, from a native thread (a caller "
            "holding the interpreter lock while it waits for the stream cannot keep it blocked).")
        .def_property_readonly("released", &StreamBlocker::released)
        .def(
            "wait_passed",
            [](StreamBlocker const& b, int timeoutMs) {
                py::gil_scoped_release nogil;
                return b.waitPassed(timeoutMs);
            },
            py::arg("timeout_ms"), "After release(): waits until the stream passed the wait; False on timeout.")
        .def(
            "__enter__", [](StreamBlocker& b) -> StreamBlocker& { return b; }, py::return_value_policy::reference)
        .def(
            "__exit__", [](StreamBlocker& b, py::object const&, py::object const&, py::object const&) { b.release(); });
}

// SPDX-License-Identifier: Apache-2.0
//
// kvcodec_sdk._native: helpers of the conformance suite (kvcodec_sdk.testing).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>

#include "kvcodec/fp_environment.h"
#include "runtime/stream_blocker.h"

namespace py = pybind11;

void bindConformanceTesting(py::module_& m)
{
    m.def(
        "swap_fp_control",
        [](unsigned bits) {
#if KVCODEC_HAVE_MXCSR
            if ((bits & ~kvcodec::IeeeScope::kControlBits) != 0)
            {
                throw py::value_error("bits is " + std::to_string(bits)
                    + "; give a combination of 0x8000 (flush to zero), "
                    + "0x0040 (denormals are zero) and 0x6000 (rounding control)");
            }
            unsigned const csr = _mm_getcsr();
            _mm_setcsr((csr & ~kvcodec::IeeeScope::kControlBits) | bits);
            return csr & kvcodec::IeeeScope::kControlBits;
#else
            (void)bits;
            throw std::runtime_error("this platform has no MXCSR register to set");
#endif
        },
        py::arg("bits"),
        "Sets this thread's floating-point control bits (MXCSR: flush to zero 0x8000, denormals are zero 0x0040, "
        "rounding control 0x6000) to `bits`, returns the previous ones (conformance suite helper; x86-64 only).");
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

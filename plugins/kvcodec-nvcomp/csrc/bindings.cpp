// SPDX-License-Identifier: Apache-2.0
//
// kvcodec_nvcomp._ext: one factory capsule per algorithm (the capsule of KVCODEC_FACTORY_MODULE,
// kvcodec/pybind_factory.h, once per algorithm), the format version, and the test and benchmark
// hooks (testing.h).
#include <pybind11/pybind11.h>

#include "codec.h"
#include "testing.h"

namespace py = pybind11;
using namespace kvcodec::nvcomp_plugin;

namespace {

py::capsule capsuleOf(Algorithm a)
{
    return py::capsule(const_cast<KvcodecCodecFactory*>(codecFactory(a)), KVCODEC_FACTORY_CAPSULE_NAME);
}

} // namespace

PYBIND11_MODULE(_ext, m)
{
    m.doc() = "nvCOMP codecs for kvcodec_sdk: factory capsules and benchmark/test hooks";
    m.def("lz4_factory", [] { return capsuleOf(Algorithm::kLz4); }, "PyCapsule of the nvcomp-lz4 factory.");
    m.def(
        "gdeflate_factory", [] { return capsuleOf(Algorithm::kGdeflate); },
        "PyCapsule of the nvcomp-gdeflate factory.");
    m.def("ans_factory", [] { return capsuleOf(Algorithm::kAns); }, "PyCapsule of the nvcomp-ans factory.");
    m.def("zstd_factory", [] { return capsuleOf(Algorithm::kZstd); }, "PyCapsule of the nvcomp-zstd factory.");
    m.attr("FORMAT_VERSION") = int(kFormatVersion);
    addTestHooks(m);
}

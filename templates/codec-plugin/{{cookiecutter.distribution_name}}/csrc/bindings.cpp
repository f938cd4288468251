// The extension module: hands the codec's factory to kvcodec as a PyCapsule. Nothing else
// crosses into Python; kvcodec_sdk creates, configures and drives the codec.
#include <pybind11/pybind11.h>

#include "codec.h"

PYBIND11_MODULE(_ext, m)
{
    m.doc() = "Native part of {{ cookiecutter.distribution_name }}";
    m.def(
        "codec_factory",
        [] {
            auto* factory = const_cast<KvcodecCodecFactory*>({{ cookiecutter.codec_name | replace('-', '_') }}_codec::codecFactory());
            return pybind11::capsule(factory, KVCODEC_FACTORY_CAPSULE_NAME);
        },
        "PyCapsule carrying the codec's KvcodecCodecFactory.");
}

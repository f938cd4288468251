// The extension module: hands the codec's factory to kvcodec as a PyCapsule.
#include <kvcodec/pybind_factory.h>

#include "codec.h"

// (One line when it fits 120 columns, else wrapped: clang-format -i, as tests/test_style.py checks in
// this repository's plugins.)
KVCODEC_FACTORY_MODULE(_ext, "Native part of {{ cookiecutter.distribution_name }}", {{ cookiecutter.codec_name | replace('-', '_') }}_codec::codecFactory())

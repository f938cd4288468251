// The extension module: hands the codec's factory to kvcodec as a PyCapsule.
#include <kvcodec/pybind_factory.h>

#include "codec.h"

KVCODEC_FACTORY_MODULE(_ext, "Native part of kvcodec-nvfp4", nvfp4_codec::codecFactory())

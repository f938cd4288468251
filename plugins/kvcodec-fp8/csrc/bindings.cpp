// SPDX-License-Identifier: Apache-2.0
//
// kvcodec_fp8._ext, the extension module: hands the codec's factory to kvcodec as a PyCapsule.
// The test hooks (scalar conversions, CPU kernel building blocks, the blob plan) are a separate
// module, kvcodec_fp8._testing (testing.cpp).
#include <kvcodec/pybind_factory.h>

#include "codec.h"

KVCODEC_FACTORY_MODULE(_ext, "Native part of the kvcodec fp8 codec plugin.", kvcodec::fp8::codecFactory())

// SPDX-License-Identifier: Apache-2.0
//
// The extension module of a codec plugin, in one line:
//
//   #include <kvcodec/pybind_factory.h>
//   KVCODEC_FACTORY_MODULE(_ext, "Native part of my-codec", my_codec::codecFactory())
//
// defines the pybind11 module `_ext` with one function, codec_factory(), returning the
// PyCapsule (named KVCODEC_FACTORY_CAPSULE_NAME) that carries the codec's KvcodecCodecFactory.
// Nothing else crosses into Python: kvcodec_sdk creates, configures and drives the codec.
#pragma once

#include <pybind11/pybind11.h>

#include "kvcodec/plugin.h"

#define KVCODEC_FACTORY_MODULE(moduleName, moduleDoc, factoryExpr)                                                     \
    PYBIND11_MODULE(moduleName, m)                                                                                     \
    {                                                                                                                  \
        m.doc() = moduleDoc;                                                                                           \
        m.def(                                                                                                         \
            "codec_factory",                                                                                           \
            [] {                                                                                                       \
                auto* factory = const_cast<KvcodecCodecFactory*>(factoryExpr);                                         \
                return pybind11::capsule(factory, KVCODEC_FACTORY_CAPSULE_NAME);                                       \
            },                                                                                                         \
            "PyCapsule carrying the codec's KvcodecCodecFactory.");                                                    \
    }

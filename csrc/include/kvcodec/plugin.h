// SPDX-License-Identifier: Apache-2.0
//
// The versioned plugin ABI.
//
// A codec plugin is compiled separately from the SDK. It hands the SDK one KvcodecCodecFactory
// per codec, wrapped in a PyCapsule named KVCODEC_FACTORY_CAPSULE_NAME. The struct is plain C:
// no std:: type crosses the boundary. The SDK checks abiVersion and structBytes before touching
// anything else, and refuses a mismatch with an error naming both versions.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kvcodec/codec.h"

/// Bumped whenever KvcodecCodecFactory or the codec interface changes. Version 2 appended
/// hasCheckedDecode() and decodeChecked() to the codec interface; the SDK still loads plugins
/// built for version 1 (KVCODEC_PLUGIN_ABI_MIN_VERSION) and never calls those methods on them.
#define KVCODEC_PLUGIN_ABI_VERSION 2u

/// The oldest plugin ABI the SDK still loads.
#define KVCODEC_PLUGIN_ABI_MIN_VERSION 1u

/// The name of every PyCapsule that carries a `KvcodecCodecFactory const*`.
#define KVCODEC_FACTORY_CAPSULE_NAME "kvcodec.codec_factory"

/// Marks a symbol exported from a plugin's shared library.
#if defined(_WIN32)
#define KVCODEC_PLUGIN_EXPORT extern "C" __declspec(dllexport)
#else
#define KVCODEC_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))
#endif

/// Device argument of `create` selecting the CPU reference implementation.
#define KVCODEC_DEVICE_CPU (-1)

extern "C" {

/// One codec a plugin offers. Lives for the lifetime of the plugin library (a static object).
typedef struct KvcodecCodecFactory
{
    /// KVCODEC_PLUGIN_ABI_VERSION the plugin was compiled against.
    uint32_t abiVersion;
    /// sizeof(KvcodecCodecFactory) as the plugin saw it.
    uint32_t structBytes;
    /// Codec name, e.g. "concat". NUL-terminated, static storage.
    char const* name;
    /// Version of the codec's blob format; blobs of different versions are never mixed.
    uint32_t formatVersion;
    uint32_t reserved; ///< Zero.

    /// Creates a codec. `paramsJson` is a JSON object (already validated against the codec's
    /// schema by the SDK, never null); `device` is KVCODEC_DEVICE_CPU for the CPU reference
    /// implementation or a CUDA device ordinal. Returns an owned codec released with `destroy`,
    /// or null after writing a NUL-terminated reason (at most errorCapacity bytes) into
    /// errorMessage.
    kvcodec::IKvCacheColdPageCodec* (*create)(
        char const* paramsJson, int32_t device, char* errorMessage, size_t errorCapacity);

    /// Destroys a codec returned by `create` (in the plugin's own allocator).
    void (*destroy)(kvcodec::IKvCacheColdPageCodec* codec);
} KvcodecCodecFactory;

} // extern "C"

namespace kvcodec {

/// Copies `message` into a factory's error out-parameter, truncating and NUL-terminating.
inline void writeFactoryError(char* out, size_t capacity, char const* message) noexcept
{
    if (out == nullptr || capacity == 0)
    {
        return;
    }
    size_t i = 0;
    for (; message != nullptr && message[i] != '\0' && i + 1 < capacity; ++i)
    {
        out[i] = message[i];
    }
    out[i] = '\0';
}

} // namespace kvcodec

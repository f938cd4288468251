// SPDX-License-Identifier: Apache-2.0
//
// One KvcodecCodecFactory per algorithm; all share the implementation in codec_base/cpu/cuda.
#include <string>

#include "codec_factories.h"

namespace kvcodec::nvcomp_plugin {
namespace {

template <Algorithm A>
IKvCacheColdPageCodec* create(char const* paramsJson, int32_t device, char* errorMessage, size_t errorCapacity)
{
    try
    {
        CodecOptions options;
        std::string error;
        if (!parseOptions(paramsJson, A, options, error))
        {
            writeFactoryError(errorMessage, errorCapacity, error.c_str());
            return nullptr;
        }
        IKvCacheColdPageCodec* codec = nullptr;
        if (device == KVCODEC_DEVICE_CPU)
        {
            codec = createCpuCodec(options, error);
        }
        else if (device < 0)
        {
            error = "device is " + std::to_string(device) + "; use -1 for the CPU reference or a CUDA device ordinal";
        }
        else
        {
            codec = createCudaCodec(options, device, error);
        }
        if (codec == nullptr)
        {
            writeFactoryError(errorMessage, errorCapacity, error.c_str());
        }
        return codec;
    }
    catch (std::exception const& e)
    {
        writeFactoryError(errorMessage, errorCapacity, e.what());
        return nullptr;
    }
}

void destroy(IKvCacheColdPageCodec* codec)
{
    delete codec;
}

template <Algorithm A>
KvcodecCodecFactory const kFactory{KVCODEC_PLUGIN_ABI_VERSION, sizeof(KvcodecCodecFactory), algorithmInfo(A).name,
    kFormatVersion, 0, &create<A>, &destroy};

} // namespace

KvcodecCodecFactory const* codecFactory(Algorithm algorithm) noexcept
{
    switch (algorithm)
    {
    case Algorithm::kLz4: return &kFactory<Algorithm::kLz4>;
    case Algorithm::kGdeflate: return &kFactory<Algorithm::kGdeflate>;
    case Algorithm::kAns: return &kFactory<Algorithm::kAns>;
    case Algorithm::kZstd: return &kFactory<Algorithm::kZstd>;
    }
    return nullptr;
}

} // namespace kvcodec::nvcomp_plugin

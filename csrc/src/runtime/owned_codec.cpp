// SPDX-License-Identifier: Apache-2.0
#include "owned_codec.h"

#include <stdexcept>

namespace kvcodec::runtime {

void checkFactoryAbi(KvcodecCodecFactory const* factory)
{
    if (factory == nullptr)
    {
        throw std::invalid_argument("codec factory pointer is null");
    }
    // abiVersion is the first field in every ABI version, so it is safe to read before anything else.
    if (factory->abiVersion < KVCODEC_PLUGIN_ABI_MIN_VERSION || factory->abiVersion > KVCODEC_PLUGIN_ABI_VERSION)
    {
        throw std::invalid_argument("codec plugin ABI mismatch: the plugin was built for kvcodec ABI version "
            + std::to_string(factory->abiVersion) + ", this kvcodec_sdk speaks ABI version "
            + std::to_string(KVCODEC_PLUGIN_ABI_VERSION) + " (and loads versions "
            + std::to_string(KVCODEC_PLUGIN_ABI_MIN_VERSION) + ".." + std::to_string(KVCODEC_PLUGIN_ABI_VERSION)
            + "); rebuild the plugin against this SDK");
    }
    if (factory->structBytes != sizeof(KvcodecCodecFactory))
    {
        throw std::invalid_argument("codec plugin ABI mismatch: KvcodecCodecFactory is "
            + std::to_string(factory->structBytes) + " bytes in the plugin but "
            + std::to_string(sizeof(KvcodecCodecFactory)) + " bytes in this kvcodec_sdk (ABI version "
            + std::to_string(factory->abiVersion) + " has one size)");
    }
    if (factory->name == nullptr || factory->create == nullptr || factory->destroy == nullptr)
    {
        throw std::invalid_argument("codec factory is incomplete: name, create and destroy must all be set");
    }
}

std::vector<PoolGroupDesc> const& HotLayoutStorage::descs()
{
    descs_.clear();
    lifeCycleDescs_.assign(groups.size(), {});
    for (size_t g = 0; g < groups.size(); ++g)
    {
        auto& lcs = lifeCycleDescs_[g];
        for (auto const& lc : groups[g].lifeCycles)
        {
            lcs.push_back({lc.id, uint32_t(lc.buffers.size()), lc.buffers.empty() ? nullptr : lc.buffers.data()});
        }
        descs_.push_back({PoolGroupIndex(g), uint32_t(groups[g].pools.size()),
            groups[g].pools.empty() ? nullptr : groups[g].pools.data(), uint32_t(lcs.size()),
            lcs.empty() ? nullptr : lcs.data()});
    }
    return descs_;
}

OwnedCodec::OwnedCodec(KvcodecCodecFactory const* factory, std::string const& paramsJson, int32_t device)
    : factory_(factory)
    , device_(device)
{
    checkFactoryAbi(factory);
    char error[1024] = {};
    codec_ = factory->create(paramsJson.c_str(), device, error, sizeof(error));
    if (codec_ == nullptr)
    {
        throw std::invalid_argument(std::string("cannot create codec '") + factory->name + "' on "
            + (device == KVCODEC_DEVICE_CPU ? std::string("cpu") : "cuda:" + std::to_string(device)) + ": "
            + (error[0] ? error : "the factory gave no reason"));
    }
}

OwnedCodec::~OwnedCodec()
{
    release();
}

void OwnedCodec::release() noexcept
{
    if (codec_ != nullptr)
    {
        factory_->destroy(codec_);
        codec_ = nullptr;
    }
}

CodecPtr OwnedCodec::take() noexcept
{
    CodecPtr out(codec_, CodecDeleter{factory_->destroy, factory_->abiVersion});
    codec_ = nullptr;
    return out;
}

} // namespace kvcodec::runtime

// SPDX-License-Identifier: Apache-2.0
//
// A codec created through a plugin factory and owned by the SDK: checks the factory's ABI,
// keeps the factory's destroy function with the pointer, and converts the hot layout into the
// contract's POD descriptors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvcodec/codec.h"
#include "kvcodec/plugin.h"

namespace kvcodec::runtime {

/// Throws std::invalid_argument naming both versions when `factory` was built for another ABI.
void checkFactoryAbi(KvcodecCodecFactory const* factory);

/// The hot layout in owned storage; `descs()` points into it.
struct HotLayoutStorage
{
    struct LifeCycle
    {
        LifeCycleId id;
        std::vector<BufferDesc> buffers;
    };

    struct Group
    {
        std::vector<PoolDesc> pools;
        std::vector<LifeCycle> lifeCycles;
    };

    std::vector<Group> groups;

    /// Builds the contiguous PoolGroupDesc array (valid while this object is unchanged).
    std::vector<PoolGroupDesc> const& descs();

private:
    std::vector<PoolGroupDesc> descs_;
    std::vector<std::vector<LifeCycleDesc>> lifeCycleDescs_;
};

/// Destroys a codec through the allocator that created it (the plugin's destroy function), or
/// with delete for a codec created inside the core.
struct CodecDeleter
{
    void (*destroy)(IKvCacheColdPageCodec*) = nullptr;
    /// The plugin ABI the codec was built for: methods added after it are never called.
    uint32_t abiVersion = KVCODEC_PLUGIN_ABI_VERSION;

    void operator()(IKvCacheColdPageCodec* codec) const noexcept
    {
        if (destroy != nullptr)
        {
            destroy(codec);
        }
        else
        {
            delete codec;
        }
    }
};

/// An owned codec as the KV-cache manager takes it (by value).
using CodecPtr = std::unique_ptr<IKvCacheColdPageCodec, CodecDeleter>;

class OwnedCodec
{
public:
    /// Creates a codec; throws std::invalid_argument (ABI mismatch, bad parameters, device) or
    /// std::runtime_error (anything else the factory reports).
    OwnedCodec(KvcodecCodecFactory const* factory, std::string const& paramsJson, int32_t device);
    ~OwnedCodec();

    OwnedCodec(OwnedCodec const&) = delete;
    OwnedCodec& operator=(OwnedCodec const&) = delete;

    /// The codec, or null after release().
    [[nodiscard]] IKvCacheColdPageCodec* get() const noexcept
    {
        return codec_;
    }

    [[nodiscard]] int32_t device() const noexcept
    {
        return device_;
    }

    [[nodiscard]] char const* name() const noexcept
    {
        return factory_->name;
    }

    [[nodiscard]] uint32_t formatVersion() const noexcept
    {
        return factory_->formatVersion;
    }

    /// The plugin ABI version the codec's factory was built for.
    [[nodiscard]] uint32_t abiVersion() const noexcept
    {
        return factory_->abiVersion;
    }

    /// True when the codec implements decodeChecked() (plugin ABI >= 2 and hasCheckedDecode()).
    [[nodiscard]] bool hasCheckedDecode() const noexcept
    {
        return codec_ != nullptr && factory_->abiVersion >= 2 && codec_->hasCheckedDecode();
    }

    /// Destroys the codec now (idempotent).
    void release() noexcept;

    /// Moves the codec out (with its deleter); this object is released afterwards. Null when
    /// already released.
    [[nodiscard]] CodecPtr take() noexcept;

private:
    KvcodecCodecFactory const* factory_;
    IKvCacheColdPageCodec* codec_ = nullptr;
    int32_t device_;
};

} // namespace kvcodec::runtime

// Compiles every public header in a translation unit of its own and exports a factory.
#include <kvcodec/codec.h>
#include <kvcodec/device_scope.h>
#include <kvcodec/layout.h>
#include <kvcodec/params.h>
#include <kvcodec/plugin.h>

namespace {

class NullCodec final : public kvcodec::IKvCacheColdPageCodec
{
public:
    bool configure(kvcodec::PoolGroupDesc const* d, kvcodec::PoolGroupIndex n) noexcept override
    {
        return layout_.load(d, n).empty();
    }
    size_t queryColdPageBytes(kvcodec::LayerGroupId) const noexcept override
    {
        return 0;
    }
    kvcodec::PageIndexLocation queryPageIndexLocation(kvcodec::LayerGroupId) const noexcept override
    {
        return kvcodec::PageIndexLocation::kBadLocation;
    }
    bool encode(kvcodec::LayerGroupId, void*, kvcodec::PageIndexPair const*, size_t, cudaStream_t) noexcept override
    {
        return false;
    }
    bool decode(
        kvcodec::LayerGroupId, void const*, kvcodec::PageIndexPair const*, size_t, cudaStream_t) noexcept override
    {
        return false;
    }

private:
    kvcodec::HotLayout layout_;
};

kvcodec::IKvCacheColdPageCodec* create(char const* json, int32_t, char* err, size_t cap)
{
    kvcodec::CodecParams params;
    std::string error;
    if (!params.parse(json, error))
    {
        kvcodec::writeFactoryError(err, cap, error.c_str());
        return nullptr;
    }
    return new NullCodec();
}

void destroy(kvcodec::IKvCacheColdPageCodec* c)
{
    delete c;
}

KvcodecCodecFactory const kFactory{
    KVCODEC_PLUGIN_ABI_VERSION, sizeof(KvcodecCodecFactory), "null", 1, 0, &create, &destroy};

} // namespace

KVCODEC_PLUGIN_EXPORT KvcodecCodecFactory const* kvcodec_consumer_factory()
{
    return &kFactory;
}

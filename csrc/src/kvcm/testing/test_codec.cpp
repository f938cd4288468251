// SPDX-License-Identifier: Apache-2.0
#include "kvcm/testing/test_codec.h"

#include <atomic>
#include <memory>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "kvcodec/layout.h"
#include "kvcodec/params.h"

namespace kvcodec::kvcm::testing {
namespace {

std::atomic<int64_t> gFailAfter{-1};
std::mutex gCallsMutex;
std::vector<CodecCall> gCalls;

constexpr uint16_t kFormat = 1;
constexpr size_t kEnvelopeBytes = sizeof(ColdPageEnvelope);

bool parseMap(std::string const& text, std::map<int32_t, std::string>& out, std::string& error, char const* name)
{
    size_t pos = 0;
    while (pos < text.size())
    {
        size_t const comma = text.find(',', pos);
        std::string const item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        size_t const colon = item.find(':');
        try
        {
            out[std::stoi(item.substr(0, colon))] = colon == std::string::npos ? "" : item.substr(colon + 1);
        }
        catch (...)
        {
            error = std::string("kvcm-test parameter '") + name + "' has a bad item '" + item + "'";
            return false;
        }
        pos = comma == std::string::npos ? text.size() : comma + 1;
    }
    return true;
}

class TestCodec final : public IKvCacheColdPageCodec
{
public:
    std::map<int32_t, std::string> pad, batching, location, zeroSize;
    bool envelope = false;
    bool checkedDecode = false;
    bool rejectConfigure = false;
    int64_t marker = -1;

    bool configure(PoolGroupDesc const* descs, PoolGroupIndex num) noexcept override
    {
        if (configured_)
        {
            return fail("configure() was already called");
        }
        if (rejectConfigure)
        {
            return fail("kvcm-test rejects every configuration (reject_configure=true)");
        }
        std::string err = layout_.load(descs, num);
        if (!err.empty())
        {
            return fail(err);
        }
        configured_ = true;
        return true;
    }

    size_t queryColdPageBytes(LayerGroupId id) const noexcept override
    {
        auto const* lc = configured_ ? layout_.find(id) : nullptr;
        if (lc == nullptr || zeroSize.count(id))
        {
            return 0;
        }
        return (envelope ? kEnvelopeBytes : 0) + layout_.groups()[lc->group].pageBytes + padOf(id);
    }

    LayerGroupId getBatchingLayerGroupId(LayerGroupId id) const noexcept override
    {
        if (!configured_ || layout_.find(id) == nullptr)
        {
            return -1;
        }
        auto it = batching.find(id);
        return it == batching.end() ? id : std::atoi(it->second.c_str());
    }

    PageIndexLocation queryPageIndexLocation(LayerGroupId id) const noexcept override
    {
        if (!configured_ || layout_.find(id) == nullptr)
        {
            return PageIndexLocation::kBadLocation;
        }
        auto it = location.find(id);
        if (it == location.end() || it->second == "host")
        {
            return PageIndexLocation::kHost;
        }
        return it->second == "device" ? PageIndexLocation::kDevice : PageIndexLocation::kBadLocation;
    }

    bool encode(LayerGroupId id, void* dst, PageIndexPair const* pairs, size_t n, cudaStream_t) noexcept override
    {
        return transform(true, id, static_cast<unsigned char*>(dst), pairs, n);
    }

    bool decode(LayerGroupId id, void const* src, PageIndexPair const* pairs, size_t n, cudaStream_t) noexcept override
    {
        return transform(false, id, static_cast<unsigned char*>(const_cast<void*>(src)), pairs, n);
    }

    char const* lastError() const noexcept override
    {
        return error_.c_str();
    }

    bool hasCheckedDecode() const noexcept override
    {
        return checkedDecode;
    }

    // Checks each blob's envelope (when declared) and decodes the good pages only.
    bool decodeChecked(LayerGroupId id, void const* src, PageIndexPair const* pairs, size_t n, uint8_t* status,
        cudaStream_t) noexcept override
    {
        if (!checkedDecode)
        {
            return fail("kvcm-test: decodeChecked() called although hasCheckedDecode() is false");
        }
        auto const* lc = configured_ ? layout_.find(id) : nullptr;
        if (lc == nullptr)
        {
            return fail("unknown lifecycle " + std::to_string(id));
        }
        size_t const blobBytes = queryColdPageBytes(id);
        uint64_t const numSlots = layout_.groups()[lc->group].numSlots;
        auto const* cold = static_cast<unsigned char const*>(src);
        for (size_t i = 0; i < n; ++i)
        {
            uint8_t st = kPageOk;
            if (pairs[i].src < 0 || pairs[i].dst < 0 || uint64_t(pairs[i].dst) >= numSlots)
            {
                st = kPageBadIndex;
            }
            else if (envelope)
            {
                st = uint8_t(checkColdPageEnvelope(cold + uint64_t(pairs[i].src) * blobBytes, blobBytes, kFormat));
            }
            status[i] = st;
            if (st == kPageOk && !decode(id, src, pairs + i, 1, nullptr))
            {
                return false;
            }
        }
        return true;
    }

private:
    uint64_t padOf(LayerGroupId id) const
    {
        auto it = pad.find(id);
        return it == pad.end() ? 0 : std::stoull(it->second);
    }

    bool fail(std::string message) noexcept
    {
        error_ = std::move(message);
        return false;
    }

    bool transform(bool enc, LayerGroupId id, unsigned char* cold, PageIndexPair const* pairs, size_t n) noexcept
    {
        try
        {
            {
                std::lock_guard<std::mutex> lock(gCallsMutex);
                gCalls.push_back({enc, id, n, reinterpret_cast<uintptr_t>(pairs)});
            }
            int64_t left = gFailAfter.load();
            if (left == 0)
            {
                gFailAfter.store(-1);
                return fail("injected submission failure");
            }
            if (left > 0)
            {
                gFailAfter.store(left - 1);
            }
            auto const* lc = configured_ ? layout_.find(id) : nullptr;
            if (lc == nullptr)
            {
                return fail("unknown lifecycle " + std::to_string(id));
            }
            auto const& group = layout_.groups()[lc->group];
            size_t const blobBytes = queryColdPageBytes(id);
            size_t const head = envelope ? kEnvelopeBytes : 0;
            auto const key = static_cast<unsigned char>((getBatchingLayerGroupId(id) + 1) * 0x3B + 0x11);
            for (size_t i = 0; i < n; ++i)
            {
                uint64_t const hot = uint64_t(enc ? pairs[i].src : pairs[i].dst);
                uint64_t const slot = uint64_t(enc ? pairs[i].dst : pairs[i].src);
                if (hot >= group.numSlots)
                {
                    return fail("hot slot " + std::to_string(hot) + " out of range");
                }
                unsigned char* blob = cold + slot * blobBytes;
                unsigned char* payload = blob + head;
                size_t off = 0;
                for (auto const& pool : group.pools)
                {
                    auto* h = reinterpret_cast<unsigned char*>(pool.base + hot * pool.slotBytes);
                    for (size_t b = 0; b < pool.slotBytes; ++b)
                    {
                        if (enc)
                        {
                            payload[off + b] = h[b] ^ key;
                        }
                        else
                        {
                            h[b] = payload[off + b] ^ key;
                        }
                    }
                    off += pool.slotBytes;
                }
                if (enc)
                {
                    std::memset(payload + off, 0xA5, blobBytes - head - off);
                    if (envelope)
                    {
                        auto const* first = reinterpret_cast<unsigned char const*>(group.pools[0].base + hot * group.pools[0].slotBytes);
                        bool const didNotFit = marker >= 0 && *first == uint8_t(marker);
                        ColdPageEnvelope h{};
                        h.magic = kColdPageEnvelopeMagic;
                        h.formatVersion = kFormat;
                        h.flags = uint16_t(didNotFit ? kEnvelopeDidNotFit : kEnvelopeStoredRaw);
                        h.headerBytes = uint32_t(head);
                        h.payloadBytes = uint32_t(blobBytes - head);
                        h.rawBytes = group.pageBytes;
                        h.checksum = crc32c(payload, blobBytes - head);
                        h.headerCrc = crc32c(&h, offsetof(ColdPageEnvelope, headerCrc));
                        std::memcpy(blob, &h, sizeof(h));
                    }
                }
            }
            return true;
        }
        catch (std::exception const& e)
        {
            return fail(e.what());
        }
    }

    HotLayout layout_;
    bool configured_ = false;
    std::string error_;
};

IKvCacheColdPageCodec* create(char const* json, int32_t device, char* errorMessage, size_t capacity)
{
    try
    {
        if (device != KVCODEC_DEVICE_CPU)
        {
            writeFactoryError(errorMessage, capacity, "kvcm-test has only a CPU implementation");
            return nullptr;
        }
        CodecParams params;
        std::string error;
        if (!params.parse(json, error))
        {
            writeFactoryError(errorMessage, capacity, error.c_str());
            return nullptr;
        }
        auto codec = std::make_unique<TestCodec>();
        for (auto const& [key, value] : params.values())
        {
            std::map<int32_t, std::string>* target = key == "pad" ? &codec->pad
                : key == "batching"                           ? &codec->batching
                : key == "location"                           ? &codec->location
                : key == "zero_size"                          ? &codec->zeroSize
                                                              : nullptr;
            if (target != nullptr)
            {
                if (!parseMap(value.text, *target, error, key.c_str()))
                {
                    writeFactoryError(errorMessage, capacity, error.c_str());
                    return nullptr;
                }
            }
            else if (key == "envelope")
            {
                codec->envelope = value.boolean;
            }
            else if (key == "checked_decode")
            {
                codec->checkedDecode = value.boolean;
            }
            else if (key == "reject_configure")
            {
                codec->rejectConfigure = value.boolean;
            }
            else if (key == "did_not_fit_marker")
            {
                codec->marker = int64_t(value.number);
            }
            else
            {
                writeFactoryError(errorMessage, capacity, ("unknown kvcm-test parameter '" + key + "'").c_str());
                return nullptr;
            }
        }
        return codec.release();
    }
    catch (std::exception const& e)
    {
        writeFactoryError(errorMessage, capacity, e.what());
        return nullptr;
    }
}

void destroy(IKvCacheColdPageCodec* codec)
{
    delete codec;
}

KvcodecCodecFactory const kFactory{
    KVCODEC_PLUGIN_ABI_VERSION, sizeof(KvcodecCodecFactory), "kvcm-test", kFormat, 0, &create, &destroy};
// The same codec declared as built for plugin ABI 1: the SDK must never call its ABI-2 methods.
KvcodecCodecFactory const kFactoryAbi1{1, sizeof(KvcodecCodecFactory), "kvcm-test", kFormat, 0, &create, &destroy};

} // namespace

KvcodecCodecFactory const* testCodecFactory(uint32_t abiVersion) noexcept
{
    return abiVersion == 1 ? &kFactoryAbi1 : &kFactory;
}

void failCodecCallsAfter(int64_t after) noexcept
{
    gFailAfter.store(after);
}

std::vector<CodecCall> codecCalls()
{
    std::lock_guard<std::mutex> lock(gCallsMutex);
    return gCalls;
}

void clearCodecCalls()
{
    std::lock_guard<std::mutex> lock(gCallsMutex);
    gCalls.clear();
}

} // namespace kvcodec::kvcm::testing

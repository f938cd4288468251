// SPDX-License-Identifier: Apache-2.0
#include "kvcm/testing/test_codec.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

#include "kvcodec/codec_base.h"

namespace kvcodec::kvcm::testing {
namespace {

std::atomic<int64_t> gFailAfter{-1};
std::atomic<int64_t> gHoldEncodeUs{0};
std::atomic<int64_t> gHoldDecodeUs{0};
std::atomic<int> gRunning{0}; // test-codec calls in progress
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

// A CPU codec the manager's tests steer through its parameters: per-lifecycle padding, batching
// representatives, index locations and zero sizes, an optional envelope and checked decode, and
// injected failures. Payload bytes are the hot bytes XOR a per-batching-class key.
struct TestParams
{
    std::string pad, batching, location, zeroSize;
    bool envelope = false;
    bool checkedDecode = false;
    bool rejectConfigure = false;
    int64_t marker = -1;

    void read(ParamReader& r)
    {
        r.read("pad", pad);
        r.read("batching", batching);
        r.read("location", location);
        r.read("zero_size", zeroSize);
        r.read("envelope", envelope);
        r.read("checked_decode", checkedDecode);
        r.read("reject_configure", rejectConfigure);
        r.read("did_not_fit_marker", marker);
    }
};

// Its own factory Traits: a CPU-only codec.
class TestCodec final : public CodecBase
{
public:
    static constexpr char const* kName = "kvcm-test";
    static constexpr uint32_t kFormatVersion = kFormat;
    using Params = TestParams;
    using Cuda = void;

    explicit TestCodec(TestParams const& params)
        : CodecBase(KVCODEC_DEVICE_CPU)
        , params_(params)
    {
        std::string error;
        if (!parseMap(params.pad, pad_, error, "pad") || !parseMap(params.batching, batching_, error, "batching")
            || !parseMap(params.location, location_, error, "location")
            || !parseMap(params.zeroSize, zeroSize_, error, "zero_size"))
        {
            throw CodecCreateError(error);
        }
    }

    bool hasCheckedDecode() const noexcept override
    {
        return params_.checkedDecode;
    }

private:
    bool plan(HotLayout const&) override
    {
        if (params_.rejectConfigure)
        {
            return fail("kvcm-test rejects every configuration (reject_configure=true)");
        }
        return true;
    }

    uint64_t coldPageBytes(HotLayout::LifeCycle const& lc) const override
    {
        if (zeroSize_.count(lc.id))
        {
            return 0;
        }
        auto it = pad_.find(lc.id);
        uint64_t const pad = it == pad_.end() ? 0 : std::stoull(it->second);
        return (params_.envelope ? kEnvelopeBytes : 0) + layout().groups()[lc.group].pageBytes + pad;
    }

    LayerGroupId batchingLayerGroup(HotLayout::LifeCycle const& lc) const override
    {
        auto it = batching_.find(lc.id);
        return it == batching_.end() ? lc.id : std::atoi(it->second.c_str());
    }

    PageIndexLocation pageIndexLocation(HotLayout::LifeCycle const& lc) const override
    {
        auto it = location_.find(lc.id);
        if (it == location_.end() || it->second == "host")
        {
            return PageIndexLocation::kHost;
        }
        return it->second == "device" ? PageIndexLocation::kDevice : PageIndexLocation::kBadLocation;
    }

    bool submit(kvcodec::CodecCall const& call) override
    {
        if (call.pageStatus != nullptr)
        {
            return submitChecked(call);
        }
        bool const overlapped = gRunning.fetch_add(1) != 0;
        struct Leave
        {
            ~Leave()
            {
                gRunning.fetch_sub(1);
            }
        } const leave;
        {
            std::lock_guard<std::mutex> lock(gCallsMutex);
            gCalls.push_back({call.encoding, call.lifeCycle.id, call.numPages, reinterpret_cast<uintptr_t>(call.pages),
                int64_t(syscall(SYS_gettid)), overlapped});
        }
        if (int64_t const hold = (call.encoding ? gHoldEncodeUs : gHoldDecodeUs).load(); hold > 0)
        {
            std::this_thread::sleep_for(std::chrono::microseconds(hold));
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
        auto const id = call.lifeCycle.id;
        auto const& group = call.group;
        size_t const blobBytes = queryColdPageBytes(id);
        size_t const head = params_.envelope ? kEnvelopeBytes : 0;
        auto* cold = reinterpret_cast<unsigned char*>(call.coldBase);
        auto const key = static_cast<unsigned char>((getBatchingLayerGroupId(id) + 1) * 0x3B + 0x11);
        for (size_t i = 0; i < call.numPages; ++i)
        {
            uint64_t const hot = uint64_t(call.hot(i));
            uint64_t const slot = uint64_t(call.cold(i));
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
                    if (call.encoding)
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
            if (call.encoding)
            {
                std::memset(payload + off, 0xA5, blobBytes - head - off);
                if (params_.envelope)
                {
                    auto const* first
                        = reinterpret_cast<unsigned char const*>(group.pools[0].base + hot * group.pools[0].slotBytes);
                    bool const didNotFit = params_.marker >= 0 && *first == uint8_t(params_.marker);
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

    // Checks each blob's envelope (when declared) and decodes the good pages one by one.
    bool submitChecked(kvcodec::CodecCall const& call)
    {
        size_t const blobBytes = queryColdPageBytes(call.lifeCycle.id);
        auto const* cold = reinterpret_cast<unsigned char const*>(call.coldBase);
        for (size_t i = 0; i < call.numPages; ++i)
        {
            PageIndexPair const& pair = call.pages[i];
            uint8_t st = kPageOk;
            if (pair.src < 0 || pair.dst < 0 || uint64_t(pair.dst) >= call.group.numSlots)
            {
                st = kPageBadIndex;
            }
            else if (params_.envelope)
            {
                st = uint8_t(checkColdPageEnvelope(cold + uint64_t(pair.src) * blobBytes, blobBytes, kFormat));
            }
            call.pageStatus[i] = st;
            if (st == kPageOk && !decode(call.lifeCycle.id, cold, &pair, 1, nullptr))
            {
                return false;
            }
        }
        return true;
    }

    TestParams params_;
    std::map<int32_t, std::string> pad_, batching_, location_, zeroSize_;
};

KvcodecCodecFactory const kFactory = makeCodecFactory<TestCodec>();
// The same codec declared as built for plugin ABI 1: the SDK must never call its ABI-2 methods.
KvcodecCodecFactory const kFactoryAbi1{
    1, sizeof(KvcodecCodecFactory), "kvcm-test", kFormat, 0, kFactory.create, kFactory.destroy};

} // namespace

KvcodecCodecFactory const* testCodecFactory(uint32_t abiVersion) noexcept
{
    return abiVersion == 1 ? &kFactoryAbi1 : &kFactory;
}

void holdEncodes(int64_t us) noexcept
{
    gHoldEncodeUs.store(us);
}

void holdDecodes(int64_t us) noexcept
{
    gHoldDecodeUs.store(us);
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

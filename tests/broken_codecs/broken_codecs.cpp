// Deliberately broken codecs: each breaks exactly one clause of the codec contract, so the
// conformance suite can show that it catches the break and names the clause.
//
// The base codec is a correct concatenating codec (CPU reference and a CUDA implementation built
// on cudaMemcpyAsync with host indices). Blob = the page's slot in every pool, in pool order,
// each byte XOR key(lifecycle) (key 0 unless a flaw uses keys), then `trailer` spare bytes. The
// enveloped variants (CPU only) put a ColdPageEnvelope before the page and 16 zero bytes after it.
// kvcodec_broken_factory(FLAW) returns the factory of the codec named FLAW.
#include <kvcodec/layout.h>
#include <kvcodec/plugin.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace kvcodec;

enum class Flaw
{
    kNone,                    // control: conforms
    kConfigureTwice,          // configure-once: a second configure() succeeds
    kUnfixedSize,             // cold-size-fixed: the reported size grows with every call
    kInconsistentBatching,    // batching-representative: the largest member, not the smallest
    kBadLocation,             // index-location: kBadLocation for non-representative lifecycles
    kLossyClaimsLossless,     // round-trip: drops the low bit of every 16-bit element
    kDecodeIgnoresLifecycle,  // round-trip: encodes per lifecycle, decodes as the group's first
    kNondeterministic,        // deterministic: a call counter in the blob's spare byte
    kFalseBatching,           // batched-calls: encodes per call ID yet claims one class per group
    kCallSizeInBlob,          // chunked-calls: the call's page count in the blob's spare byte
    kEmptyFails,              // empty-call: a call of zero pages returns false
    kWritePastSlot,           // writes-inside-slots: encode writes one byte after each blob
    kModifiesSource,          // source-unmodified: encode flips a byte of the hot slot it read
    kLateHostReads,           // host-indices-after-return: re-reads the previous call's indices
    kAcceptsUnknownLifecycle, // bad-arguments: encode/decode of an unknown lifecycle return true
    kSyncStream,              // stream-no-wait (CUDA): synchronizes the stream before returning
    kOtherStream,             // stream-ordered (CUDA): copies on a stream of its own
    kGpuFormatDiffers,        // cpu-gpu-interchange (CUDA): the GPU writes pools in reverse order
    kUninitPadding,           // deterministic: 8 spare blob bytes that encode never writes
    kPartialConfigure,        // rejected-configure: keeps the groups validated before a bad one
    kKeepsDescriptors,        // descriptors-copied: reads pool bases from configure()'s arrays later
    kStaleCache,              // stateful-sequence: skips a page already encoded from that hot slot there
    kRetainsSources,          // data-not-retained: the next encode re-copies the previous encode's pages
    kCpuNeedsNullStream,      // cpu-synchronous: the CPU reference refuses a non-null stream
    kZeroesFp8,               // round-trip (suite's own bound): zeroes every other fp8 K/V element
    kChangesOpaque,           // round-trip (exact buffers): flips bit 0 of opaque K/V buffers
    kEnvelope,                // control of the envelope clause: a correct stored-raw envelope
    kEnvelopeRawBytes,        // envelope: rawBytes one more than the page
    kEnvelopeUncovered,       // envelope: payloadBytes one short, the page's last byte outside the CRC
    kThrowsOnEmpty,           // any clause (noexcept): throws from encode() on an empty call, null pointers
    kWrongPoolBound,          // bad-arguments: bounds hot slots by the largest pool group's slot count (CPU, CUDA)
    kCheckedSkipsChecksum,    // checked-decode: decodeChecked() reports a payload failing its CRC as kPageOk
    kFollowsCallerFp,         // fp-environment: copies bf16 elements through a float multiply in the caller's mode
};

struct Call
{
    bool valid = false;
    bool encode = true;
    LifeCycleId id = 0;
    uintptr_t base = 0;
    PageIndexPair const* pairs = nullptr;
    size_t n = 0;
};

class BrokenCodec final : public IKvCacheColdPageCodec
{
public:
    BrokenCodec(Flaw flaw, int device)
        : flaw_(flaw)
        , device_(device)
    {
    }

    ~BrokenCodec() override
    {
        if (ownStream_ != nullptr)
        {
            cudaStreamDestroy(ownStream_);
        }
    }

    bool configure(PoolGroupDesc const* d, PoolGroupIndex n) noexcept override
    {
        if (configured_ && flaw_ != Flaw::kConfigureTwice)
        {
            return fail("configure() was already called");
        }
        std::string err = layout_.load(d, n);
        if (!err.empty())
        {
            if (flaw_ == Flaw::kPartialConfigure && n > 1 && layout_.load(d, n - 1).empty())
            {
                configured_ = true; // keeps what it validated before the bad group
            }
            return fail(err);
        }
        retained_ = d;
        if (device_ >= 0 && flaw_ == Flaw::kOtherStream && ownStream_ == nullptr
            && cudaStreamCreateWithFlags(&ownStream_, cudaStreamNonBlocking) != cudaSuccess)
        {
            return fail("cudaStreamCreateWithFlags failed");
        }
        configured_ = true;
        return true;
    }

    size_t queryColdPageBytes(LayerGroupId id) const noexcept override
    {
        size_t bytes = blobBytes(id);
        return bytes != 0 && flaw_ == Flaw::kUnfixedSize ? bytes + calls_ : bytes;
    }

    LayerGroupId getBatchingLayerGroupId(LayerGroupId id) const noexcept override
    {
        auto const* lc = known(id);
        if (lc == nullptr)
        {
            return -1;
        }
        if (flaw_ == Flaw::kDecodeIgnoresLifecycle || flaw_ == Flaw::kZeroesFp8 || flaw_ == Flaw::kChangesOpaque)
        {
            return id; // its encodings differ per lifecycle: every lifecycle batches alone
        }
        if (flaw_ == Flaw::kInconsistentBatching)
        {
            LifeCycleId largest = id;
            for (LifeCycleId other : layout_.groups()[lc->group].lifeCycles)
            {
                largest = other > largest ? other : largest;
            }
            return largest;
        }
        return layout_.smallestLifeCycle(lc->group);
    }

    PageIndexLocation queryPageIndexLocation(LayerGroupId id) const noexcept override
    {
        auto const* lc = known(id);
        if (lc == nullptr)
        {
            return PageIndexLocation::kBadLocation;
        }
        if (flaw_ == Flaw::kBadLocation && id != layout_.smallestLifeCycle(lc->group))
        {
            return PageIndexLocation::kBadLocation;
        }
        return PageIndexLocation::kHost;
    }

    bool encode(LayerGroupId id, void* dst, PageIndexPair const* pairs, size_t n, cudaStream_t stream) noexcept override
    {
        if (flaw_ == Flaw::kThrowsOnEmpty && n == 0 && dst == nullptr)
        {
            raise("encode() of nothing"); // escapes a noexcept function: std::terminate
        }
        if (flaw_ == Flaw::kRetainsSources && configured_ && !previousEncode_.empty())
        {
            // Re-copies the previous encode's pages from their hot slots: its data pointers are
            // used long after that work completed.
            std::vector<PageIndexPair> again = previousEncode_;
            run(true, previousId_, previousBase_, again.data(), again.size(), stream, false);
        }
        bool ok = call(true, id, reinterpret_cast<uintptr_t>(dst), pairs, n, stream);
        if (ok && flaw_ == Flaw::kRetainsSources && n > 0 && pairs != nullptr)
        {
            previousEncode_.assign(pairs, pairs + n);
            previousId_ = id;
            previousBase_ = reinterpret_cast<uintptr_t>(dst);
        }
        return ok;
    }

    bool decode(
        LayerGroupId id, void const* src, PageIndexPair const* pairs, size_t n, cudaStream_t stream) noexcept override
    {
        return call(false, id, reinterpret_cast<uintptr_t>(src), pairs, n, stream);
    }

    char const* lastError() const noexcept override
    {
        return error_.c_str();
    }

    // The envelope control and kCheckedSkipsChecksum implement checked decode (CPU only): each
    // page's envelope is checked, and a good page is decoded alone.
    bool hasCheckedDecode() const noexcept override
    {
        return device_ < 0 && (flaw_ == Flaw::kEnvelope || flaw_ == Flaw::kCheckedSkipsChecksum);
    }

    bool decodeChecked(LayerGroupId id, void const* src, PageIndexPair const* pairs, size_t n, uint8_t* status,
        cudaStream_t stream) noexcept override
    {
        auto const* lc = known(id);
        if (!hasCheckedDecode() || lc == nullptr
            || (n > 0 && (src == nullptr || pairs == nullptr || status == nullptr)))
        {
            return fail("decodeChecked(): bad arguments");
        }
        auto const& group = layout_.groups()[lc->group];
        size_t const blob = header() + group.pageBytes + trailer();
        for (size_t i = 0; i < n; ++i)
        {
            if (pairs[i].dst < 0 || uint64_t(pairs[i].dst) >= group.numSlots || pairs[i].src < 0)
            {
                status[i] = kPageBadIndex;
                continue;
            }
            auto const* b = static_cast<uint8_t const*>(src) + uint64_t(pairs[i].src) * blob;
            auto e = checkColdPageEnvelope(b, blob, 1);
            if (flaw_ == Flaw::kCheckedSkipsChecksum && e == EnvelopeStatus::kBadChecksum)
            {
                e = EnvelopeStatus::kOk;
            }
            status[i] = uint8_t(e);
            if (e == EnvelopeStatus::kOk && !call(false, id, reinterpret_cast<uintptr_t>(src), &pairs[i], 1, stream))
            {
                status[i] = kPageDecodeFailed;
            }
        }
        return true;
    }

private:
    HotLayout::LifeCycle const* known(LifeCycleId id) const noexcept
    {
        return configured_ ? layout_.find(id) : nullptr;
    }

    size_t trailer() const noexcept
    {
        if (enveloped())
        {
            return 16;
        }
        if (flaw_ == Flaw::kUninitPadding)
        {
            return 8;
        }
        return flaw_ == Flaw::kNondeterministic || flaw_ == Flaw::kCallSizeInBlob ? 1 : 0;
    }

    bool enveloped() const noexcept
    {
        return flaw_ == Flaw::kEnvelope || flaw_ == Flaw::kEnvelopeRawBytes || flaw_ == Flaw::kEnvelopeUncovered
            || flaw_ == Flaw::kCheckedSkipsChecksum;
    }

    size_t header() const noexcept
    {
        return enveloped() ? sizeof(ColdPageEnvelope) : 0;
    }

    size_t blobBytes(LifeCycleId id) const noexcept
    {
        auto const* lc = known(id);
        return lc ? header() + layout_.groups()[lc->group].pageBytes + trailer() : 0;
    }

    [[noreturn]] static void raise(char const* what)
    {
        throw std::runtime_error(what);
    }

    /// Pool q's base of group g: the copy made at configure(), or (kKeepsDescriptors) whatever
    /// configure()'s descriptor array holds now.
    uintptr_t poolBase(PoolGroupIndex g, size_t q) const noexcept
    {
        if (flaw_ == Flaw::kKeepsDescriptors && retained_ != nullptr)
        {
            return reinterpret_cast<uintptr_t>(retained_[g].pools[q].base);
        }
        return layout_.groups()[size_t(g)].pools[q].base;
    }

    bool keyed() const noexcept
    {
        return flaw_ == Flaw::kDecodeIgnoresLifecycle || flaw_ == Flaw::kFalseBatching;
    }

    static uint8_t key(LifeCycleId id) noexcept
    {
        return uint8_t(id * 37 + 11);
    }

    bool fail(std::string message) noexcept
    {
        error_ = std::move(message);
        return false;
    }

    bool call(
        bool encode, LifeCycleId id, uintptr_t base, PageIndexPair const* pairs, size_t n, cudaStream_t stream) noexcept
    {
        if (flaw_ == Flaw::kLateHostReads && previous_.valid)
        {
            Call p = previous_; // replays the previous call through its (no longer valid) index array
            previous_.valid = false;
            run(p.encode, p.id, p.base, p.pairs, p.n, stream, false);
        }
        ++calls_;
        auto const* lc = known(id);
        if (lc == nullptr)
        {
            return flaw_ == Flaw::kAcceptsUnknownLifecycle && configured_
                ? true
                : fail(std::string(encode ? "encode" : "decode") + "(): unknown lifecycle " + std::to_string(id));
        }
        if (n == 0)
        {
            return flaw_ == Flaw::kEmptyFails ? fail("no pages") : true;
        }
        if (flaw_ == Flaw::kCpuNeedsNullStream && device_ < 0 && stream != nullptr)
        {
            return fail("a stream was given to the CPU reference");
        }
        if (base == 0 || pairs == nullptr)
        {
            return fail("null cold base or page indices");
        }
        auto const& group = layout_.groups()[lc->group];
        uint64_t bound = group.numSlots;
        if (flaw_ == Flaw::kWrongPoolBound)
        {
            for (auto const& g : layout_.groups())
            {
                bound = std::max(bound, g.numSlots);
            }
        }
        for (size_t i = 0; i < n; ++i)
        {
            int32_t hot = encode ? pairs[i].src : pairs[i].dst;
            int32_t cold = encode ? pairs[i].dst : pairs[i].src;
            if (hot < 0 || uint64_t(hot) >= bound || cold < 0)
            {
                return fail("page index " + std::to_string(i) + " out of range");
            }
        }
        if (!run(encode, id, base, pairs, n, stream, true))
        {
            return false;
        }
        if (flaw_ == Flaw::kLateHostReads)
        {
            previous_ = {true, encode, id, base, pairs, n};
        }
        return true;
    }

    bool run(bool encode, LifeCycleId id, uintptr_t base, PageIndexPair const* pairs, size_t n, cudaStream_t stream,
        bool checked) noexcept
    {
        auto const* lc = known(id);
        if (lc == nullptr)
        {
            return false;
        }
        auto const& group = layout_.groups()[lc->group];
        size_t const blob = header() + group.pageBytes + trailer();
        for (size_t i = 0; i < n; ++i)
        {
            int32_t const hotIdx = encode ? pairs[i].src : pairs[i].dst;
            int32_t const coldIdx = encode ? pairs[i].dst : pairs[i].src;
            if ((!checked || flaw_ == Flaw::kWrongPoolBound)
                && (hotIdx < 0 || uint64_t(hotIdx) >= group.numSlots || coldIdx < 0))
            {
                continue; // a replay never writes out of bounds, only to the wrong pages; nor does the
                          // wrong bound, whose flaw is returning true (writing would end the test run)
            }
            auto* cold = reinterpret_cast<uint8_t*>(base + uint64_t(coldIdx) * blob);
            if (encode && flaw_ == Flaw::kStaleCache)
            {
                // "Already there": a blob of this hot slot was written to this address before.
                if (!stale_.insert({hotIdx, reinterpret_cast<uintptr_t>(cold)}).second)
                {
                    continue;
                }
            }
            bool ok = device_ < 0 ? pageCpu(encode, id, lc->group, hotIdx, cold, i, n)
                                  : pageCuda(encode, lc->group, hotIdx, cold, stream);
            if (!ok)
            {
                return false;
            }
        }
        if (device_ >= 0 && flaw_ == Flaw::kSyncStream && cudaStreamSynchronize(stream) != cudaSuccess)
        {
            return fail("cudaStreamSynchronize failed");
        }
        return true;
    }

    bool pageCpu(bool encode, LifeCycleId id, PoolGroupIndex gi, int32_t hotIdx, uint8_t* blobStart, size_t i, size_t n)
    {
        auto const& group = layout_.groups()[size_t(gi)];
        uint8_t* const cold = blobStart + header();
        LifeCycleId const keyId = (flaw_ == Flaw::kDecodeIgnoresLifecycle && !encode)
            ? layout_.smallestLifeCycle(layout_.find(id)->group)
            : id;
        uint8_t const k = keyed() ? key(keyId) : 0;
        uint64_t off = 0;
        for (size_t q = 0; q < group.pools.size(); ++q)
        {
            auto const& pool = group.pools[q];
            auto* hot = reinterpret_cast<uint8_t*>(poolBase(gi, q) + uint64_t(hotIdx) * pool.slotBytes);
            for (uint64_t b = 0; b < pool.slotBytes; ++b)
            {
                if (encode)
                {
                    cold[off + b] = uint8_t(hot[b] ^ k);
                }
                else
                {
                    hot[b] = uint8_t(cold[off + b] ^ k);
                }
            }
            off += pool.slotBytes;
        }
        if (encode && flaw_ == Flaw::kLossyClaimsLossless)
        {
            // Truncates 16-bit K/V elements: clears the lowest mantissa bit (bit 0 of the low byte).
            for (BufferDesc const& b : layout_.find(id)->buffers)
            {
                if (b.role == BufferRole::kOther || dataTypeBytes(b.dtype) != 2)
                {
                    continue;
                }
                uint64_t poolOffset = 0;
                for (int32_t q = 0; q < b.poolIndex; ++q)
                {
                    poolOffset += group.pools[size_t(q)].slotBytes;
                }
                for (uint64_t e = 0; e < b.bytes; e += 2)
                {
                    cold[poolOffset + b.byteOffset + e] &= 0xFE;
                }
            }
        }
        if (encode && flaw_ == Flaw::kFollowsCallerFp && device_ < 0)
        {
            // Exact under IEEE's defaults (x * 1); a subnormal becomes 0 under denormals-are-zero.
            static float volatile one = 1.0f;
            for (BufferDesc const& b : layout_.find(id)->buffers)
            {
                if (b.dtype != DataType::kBFloat16)
                {
                    continue;
                }
                uint64_t at = b.byteOffset;
                for (int32_t q = 0; q < b.poolIndex; ++q)
                {
                    at += group.pools[size_t(q)].slotBytes;
                }
                for (uint64_t e = 0; e + 1 < b.bytes; e += 2)
                {
                    uint32_t bits = uint32_t(cold[at + e]) << 16 | uint32_t(cold[at + e + 1]) << 24;
                    float f;
                    std::memcpy(&f, &bits, 4);
                    f = f * one;
                    std::memcpy(&bits, &f, 4);
                    cold[at + e] = uint8_t(bits >> 16);
                    cold[at + e + 1] = uint8_t(bits >> 24);
                }
            }
        }
        if (encode && (flaw_ == Flaw::kZeroesFp8 || flaw_ == Flaw::kChangesOpaque))
        {
            for (BufferDesc const& b : layout_.find(id)->buffers)
            {
                bool const shaped = b.tokensPerPage > 0 && b.numHeads > 0 && b.headDim > 0;
                bool const fp8 = b.dtype == DataType::kFloat8E4M3 || b.dtype == DataType::kFloat8E5M2;
                if (b.role == BufferRole::kOther || (flaw_ == Flaw::kZeroesFp8 ? !(shaped && fp8) : shaped))
                {
                    continue;
                }
                uint64_t at = b.byteOffset;
                for (int32_t q = 0; q < b.poolIndex; ++q)
                {
                    at += group.pools[size_t(q)].slotBytes;
                }
                for (uint64_t e = 0; e < b.bytes; e += flaw_ == Flaw::kZeroesFp8 ? 2 : 1)
                {
                    cold[at + e] = flaw_ == Flaw::kZeroesFp8 ? 0 : uint8_t(cold[at + e] ^ 1);
                }
            }
        }
        if (encode && enveloped())
        {
            // off == pageBytes here; 16 zero bytes follow the page.
            std::memset(cold + off, 0, trailer());
            ColdPageEnvelope e{};
            e.magic = kColdPageEnvelopeMagic;
            e.formatVersion = 1;
            e.flags = kEnvelopeStoredRaw;
            e.headerBytes = uint32_t(sizeof(ColdPageEnvelope));
            e.payloadBytes = uint32_t(flaw_ == Flaw::kEnvelopeUncovered ? off - 1 : off);
            e.rawBytes = flaw_ == Flaw::kEnvelopeRawBytes ? off + 1 : off;
            e.checksum = crc32c(cold, e.payloadBytes);
            e.headerCrc = crc32c(&e, offsetof(ColdPageEnvelope, headerCrc));
            std::memcpy(blobStart, &e, sizeof(e));
        }
        if (encode)
        {
            if (flaw_ == Flaw::kNondeterministic)
            {
                cold[off] = uint8_t(calls_);
            }
            if (flaw_ == Flaw::kCallSizeInBlob)
            {
                cold[off] = uint8_t(n);
            }
            if (flaw_ == Flaw::kWritePastSlot)
            {
                cold[off] = 0x5A;
            }
            if (flaw_ == Flaw::kModifiesSource)
            {
                auto* hot
                    = reinterpret_cast<uint8_t*>(group.pools[0].base + uint64_t(hotIdx) * group.pools[0].slotBytes);
                hot[0] ^= 0xFF;
            }
        }
        (void)i;
        return true;
    }

    bool pageCuda(bool encode, PoolGroupIndex gi, int32_t hotIdx, uint8_t* cold, cudaStream_t stream)
    {
        auto const& group = layout_.groups()[size_t(gi)];
        cudaStream_t const s = flaw_ == Flaw::kOtherStream ? ownStream_ : stream;
        size_t const count = group.pools.size();
        uint64_t off = 0;
        for (size_t q = 0; q < count; ++q)
        {
            // kGpuFormatDiffers stores the pools in reverse order on the GPU only.
            size_t const pq = flaw_ == Flaw::kGpuFormatDiffers ? count - 1 - q : q;
            auto const& pool = group.pools[pq];
            auto* hot = reinterpret_cast<uint8_t*>(poolBase(gi, pq) + uint64_t(hotIdx) * pool.slotBytes);
            cudaError_t st = encode ? cudaMemcpyAsync(cold + off, hot, pool.slotBytes, cudaMemcpyDefault, s)
                                    : cudaMemcpyAsync(hot, cold + off, pool.slotBytes, cudaMemcpyDefault, s);
            if (st != cudaSuccess)
            {
                cudaGetLastError();
                return fail(std::string("cudaMemcpyAsync failed: ") + cudaGetErrorString(st));
            }
            off += pool.slotBytes;
        }
        return true;
    }

    Flaw flaw_;
    int device_;
    HotLayout layout_;
    bool configured_ = false;
    size_t calls_ = 0;
    Call previous_;
    PoolGroupDesc const* retained_ = nullptr;       // kKeepsDescriptors: configure()'s array, kept
    std::set<std::pair<int32_t, uintptr_t>> stale_; // kStaleCache: (hot slot, blob address) written
    std::vector<PageIndexPair> previousEncode_;     // kRetainsSources: the previous encode
    LifeCycleId previousId_ = 0;
    uintptr_t previousBase_ = 0;
    cudaStream_t ownStream_ = nullptr;
    std::string error_;
};

struct Entry
{
    char const* name;
    Flaw flaw;
};

Entry const kEntries[] = {
    {"none", Flaw::kNone},
    {"configure_twice", Flaw::kConfigureTwice},
    {"unfixed_size", Flaw::kUnfixedSize},
    {"inconsistent_batching", Flaw::kInconsistentBatching},
    {"bad_location", Flaw::kBadLocation},
    {"lossy_claims_lossless", Flaw::kLossyClaimsLossless},
    {"decode_ignores_lifecycle", Flaw::kDecodeIgnoresLifecycle},
    {"nondeterministic", Flaw::kNondeterministic},
    {"false_batching", Flaw::kFalseBatching},
    {"call_size_in_blob", Flaw::kCallSizeInBlob},
    {"empty_fails", Flaw::kEmptyFails},
    {"write_past_slot", Flaw::kWritePastSlot},
    {"modifies_source", Flaw::kModifiesSource},
    {"late_host_reads", Flaw::kLateHostReads},
    {"accepts_unknown_lifecycle", Flaw::kAcceptsUnknownLifecycle},
    {"sync_stream", Flaw::kSyncStream},
    {"other_stream", Flaw::kOtherStream},
    {"gpu_format_differs", Flaw::kGpuFormatDiffers},
    {"uninit_padding", Flaw::kUninitPadding},
    {"partial_configure", Flaw::kPartialConfigure},
    {"keeps_descriptors", Flaw::kKeepsDescriptors},
    {"stale_cache", Flaw::kStaleCache},
    {"retains_sources", Flaw::kRetainsSources},
    {"cpu_needs_null_stream", Flaw::kCpuNeedsNullStream},
    {"zeroes_fp8", Flaw::kZeroesFp8},
    {"changes_opaque", Flaw::kChangesOpaque},
    {"envelope", Flaw::kEnvelope},
    {"envelope_raw_bytes", Flaw::kEnvelopeRawBytes},
    {"envelope_uncovered", Flaw::kEnvelopeUncovered},
    {"throws_on_empty", Flaw::kThrowsOnEmpty},
    {"wrong_pool_bound", Flaw::kWrongPoolBound},
    {"checked_skips_checksum", Flaw::kCheckedSkipsChecksum},
    {"follows_caller_fp", Flaw::kFollowsCallerFp},
    // Correct codecs under other names (the registry wants the factory named as the codec).
    {"cuda_only", Flaw::kNone},
    {"golden_none", Flaw::kNone},
};

constexpr size_t kCount = sizeof(kEntries) / sizeof(kEntries[0]);

template <size_t I>
IKvCacheColdPageCodec* create(char const*, int32_t device, char* err, size_t cap)
{
    if (device != KVCODEC_DEVICE_CPU && device < 0)
    {
        writeFactoryError(err, cap, "bad device");
        return nullptr;
    }
    return new BrokenCodec(kEntries[I].flaw, device);
}

void destroy(IKvCacheColdPageCodec* c)
{
    delete c;
}

template <size_t... I>
struct Factories
{
    static inline KvcodecCodecFactory const table[]
        = {{KVCODEC_PLUGIN_ABI_VERSION, sizeof(KvcodecCodecFactory), kEntries[I].name, 1, 0, &create<I>, &destroy}...};
};

template <size_t... I>
constexpr auto makeFactories(std::index_sequence<I...>)
{
    return Factories<I...>{};
}

using Table = decltype(makeFactories(std::make_index_sequence<kCount>{}));

} // namespace

/// The factory of the broken codec named `flaw`, or null for an unknown name.
KVCODEC_PLUGIN_EXPORT KvcodecCodecFactory const* kvcodec_broken_factory(char const* flaw)
{
    for (size_t i = 0; i < kCount; ++i)
    {
        if (std::strcmp(Table::table[i].name, flaw) == 0)
        {
            return &Table::table[i];
        }
    }
    return nullptr;
}

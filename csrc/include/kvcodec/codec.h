// SPDX-License-Identifier: Apache-2.0
//
// The KV-cache cold-page codec contract.
//
// A hot page of one lifecycle (layer group) may span several kernel-facing pools of one hot
// pool group; a cold page is one fixed-size opaque blob. An IKvCacheColdPageCodec converts
// between the two representations. This header is the reference text of the contract: every
// clause a codec must honour is written next to the declaration it concerns.
//
// Only POD types and the abstract interface cross this boundary; nothing here needs the SDK's
// runtime library, so a plugin compiled separately includes this header and links nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "kvcodec/crc32c.h"

namespace kvcodec {

/// Stable semantic key of a page's layer group. Non-negative for real lifecycles.
using LifeCycleId = int32_t;
/// Public name of a lifecycle; layer groups map one-to-one to lifecycles.
using LayerGroupId = LifeCycleId;
/// Index of a pool group inside one storage representation. Hot and cold pool-group indices
/// are unrelated: never compare them across representations.
using PoolGroupIndex = int32_t;

/// Where the PageIndexPair array passed to encode()/decode() lives.
enum class PageIndexLocation : int
{
    kBadLocation = -1, ///< Failure or unknown lifecycle; never a valid index-array location.
    kHost,             ///< Pageable host memory, valid only until the codec call returns.
    kDevice,           ///< Device memory, valid until the work enqueued on the stream completes.
};

/// One logical page copy: destination and source slot index.
///
/// The array-of-structures layout is shared by host and device codecs: a GPU work item fetches
/// both indices with one aligned 64-bit load; a host codec iterates the same array.
/// For encode, `src` is the hot slot index (the same slot in every pool of the hot pool group)
/// and `dst` the cold slot index (blob at dstBasePtr + dst * queryColdPageBytes()). For decode,
/// `src` is the cold slot index and `dst` the hot slot index.
struct alignas(8) PageIndexPair
{
    int32_t dst;
    int32_t src;
};

static_assert(sizeof(PageIndexPair) == 8);
static_assert(std::is_trivially_copyable_v<PageIndexPair>);

/// Role of a buffer inside a hot slot.
enum class BufferRole : int32_t
{
    kKey = 0,
    kValue = 1,
    kOther = 2, ///< Anything else (indexer keys, block scales, ...): codecs must not reinterpret it.
    /// K and V side by side along the heads axis: of a shaped buffer's heads, 2h is KV head h's K
    /// and 2h + 1 its V (an even number of heads; e.g. one KV head of vLLM's FlashAttention blocks,
    /// whose tokens hold that head's K row and then its V row).
    kKeyValue = 3,
};

/// Element type of a buffer inside a hot slot.
enum class DataType : int32_t
{
    kUInt8 = 0,
    kInt8 = 1,
    kFloat16 = 2,
    kBFloat16 = 3,
    kFloat32 = 4,
    kFloat8E4M3 = 5, ///< OCP e4m3fn.
    kFloat8E5M2 = 6,
    kInt32 = 7,
};

/// One physical hot pool: `numSlots` slots of `slotBytes` bytes starting at `base`.
///
/// `base` is GPU-accessible (device memory or mapped pinned host memory with identical host and
/// device addresses) for a CUDA codec, and a host pointer for a CPU reference codec. The pool
/// memory stays valid for the codec's lifetime.
struct PoolDesc
{
    void* base;
    uint64_t slotBytes;
    uint64_t numSlots;
};

/// One buffer of one layer inside a hot slot of a lifecycle: what a quantizing codec needs to
/// interpret the bytes. A copying codec may ignore it.
///
/// The buffer occupies bytes [byteOffset, byteOffset + bytes) of slot s of pool `poolIndex`
/// (an index into the owning PoolGroupDesc::pools). When the element layout is known,
/// bytes == tokensPerPage * numHeads * headDim * sizeof(dtype) in token-major order
/// [token][head][dim]; a zero in tokensPerPage/numHeads/headDim means "opaque bytes".
struct BufferDesc
{
    int32_t layerId;
    BufferRole role;
    int32_t poolIndex;
    DataType dtype;
    uint64_t byteOffset;
    uint64_t bytes;
    int32_t tokensPerPage;
    int32_t numHeads;
    int32_t headDim;
    int32_t reserved; ///< Zero; keeps the struct size stable (48 bytes).
};

/// The buffers of one lifecycle inside the slots of its hot pool group.
struct LifeCycleDesc
{
    LifeCycleId lifeCycleId;
    uint32_t numBuffers;
    BufferDesc const* buffers;
};

/// One hot pool group: pools that are allocated together (slot s of every pool belongs to the
/// same page) and the lifecycles whose hot pages live in them. Lifecycles sharing a hot pool
/// group have identical slot layouts but may encode differently.
struct PoolGroupDesc
{
    PoolGroupIndex poolGroupIndex; ///< Equals the descriptor's position in the configure() array.
    uint32_t numPools;
    PoolDesc const* pools;
    uint32_t numLifeCycles;
    LifeCycleDesc const* lifeCycles;
};

static_assert(std::is_trivially_copyable_v<PoolDesc>);
static_assert(std::is_trivially_copyable_v<BufferDesc>);
static_assert(sizeof(BufferDesc) == 48);
static_assert(std::is_trivially_copyable_v<LifeCycleDesc>);
static_assert(std::is_trivially_copyable_v<PoolGroupDesc>);

/// Converts between hot pages spanning several pools and fixed-size cold blobs.
///
/// Contract (every implementation, CUDA or CPU reference):
///  - configure() is called exactly once, before any other method; a second call returns false.
///  - All methods are noexcept; failures are reported through return values.
///  - A CUDA codec enqueues work on the supplied stream and never synchronizes it. A bool
///    result reports synchronous validation or submission success, not completion of the
///    asynchronous work. A call must not wait for earlier work on its stream or on the device
///    either: allocate workspaces and load kernels (e.g. cudaFuncGetAttributes on each kernel)
///    in configure(), since device allocations and lazy module loading on first launch can
///    wait for queued work.
///  - A CPU reference codec takes host pointers, runs synchronously on the calling thread and
///    ignores the stream argument. Blobs of the CUDA and CPU implementations of one codec are
///    interchangeable. Its results do not depend on the calling thread's floating-point settings
///    (flush to zero, denormals are zero, rounding mode): kvcodec::IeeeScope
///    (kvcodec/fp_environment.h) sets IEEE's defaults for a call, and CodecBase holds one.
///  - Data base pointers may be used by work enqueued on the supplied stream but must not be
///    retained beyond that work.
class IKvCacheColdPageCodec
{
public:
    IKvCacheColdPageCodec() = default;
    virtual ~IKvCacheColdPageCodec() = default;

    IKvCacheColdPageCodec(IKvCacheColdPageCodec const&) = delete;
    IKvCacheColdPageCodec& operator=(IKvCacheColdPageCodec const&) = delete;

    /// Supplies every hot pool layout and base address in one call.
    ///
    /// `gpuDescs` is a contiguous array ordered by PoolGroupIndex; descriptor i has
    /// poolGroupIndex == i. The descriptor arrays are valid only during the call: copy what is
    /// needed. Called exactly once; returning false rejects the complete configuration, and a
    /// second call returns false.
    virtual bool configure(PoolGroupDesc const* gpuDescs, PoolGroupIndex numGpuDescs) noexcept = 0;

    /// Fixed cold-page payload size in bytes for a lifecycle. Variable-sized output is not
    /// supported. Zero indicates failure or an unknown lifecycle.
    [[nodiscard]] virtual size_t queryColdPageBytes(LayerGroupId layerGroupId) const noexcept = 0;

    /// The smallest lifecycle ID in the same codec-equivalence class (batching representative).
    ///
    /// Equal IDs promise identical encode/decode behaviour: algorithm, parameters, cold-page size
    /// and encoded representation. Membership in the same configured hot pool group is a
    /// necessary additional precondition. The representative maps to itself. Returns a negative
    /// ID on failure or for an unknown lifecycle. The default returns its argument, which
    /// disables cross-lifecycle batching.
    [[nodiscard]] virtual LayerGroupId getBatchingLayerGroupId(LayerGroupId layerGroupId) const noexcept
    {
        return layerGroupId;
    }

    /// Location of the PageIndexPair array for both encode() and decode() of a lifecycle.
    ///
    /// Lifecycles with the same batching ID return the same location. Returns kBadLocation on
    /// failure or for an unknown lifecycle.
    [[nodiscard]] virtual PageIndexLocation queryPageIndexLocation(LayerGroupId layerGroupId) const noexcept = 0;

    /// Encodes `numBasePages` hot pages into cold blobs.
    ///
    /// For each pair p in pageIndices[0, numBasePages): reads hot slot p.src of every pool of the
    /// lifecycle's hot pool group and writes the blob at dstBasePtr + p.dst * coldPageBytes.
    /// KVCM may concatenate index pairs of any subset of lifecycles with the same batching ID and
    /// call once with the representative ID; it does not promise every member is present.
    /// Writes stay inside the destination blobs; the source is not modified.
    ///
    /// kHost indices are valid only until the call returns: asynchronous work must not retain or
    /// dereference them. kDevice indices are valid until the work enqueued on `stream`
    /// completes, and are used only on that stream. An empty call (numBasePages == 0) succeeds
    /// and enqueues nothing.
    virtual bool encode(LayerGroupId layerGroupId, void* dstBasePtr, PageIndexPair const* pageIndices,
        size_t numBasePages, cudaStream_t stream) noexcept = 0;

    /// Decodes `numBasePages` cold blobs into hot pages: for each pair p, reads the blob at
    /// srcBasePtr + p.src * coldPageBytes and writes hot slot p.dst of every pool of the
    /// lifecycle's hot pool group. Same index, stream and batching rules as encode().
    virtual bool decode(LayerGroupId layerGroupId, void const* srcBasePtr, PageIndexPair const* pageIndices,
        size_t numBasePages, cudaStream_t stream) noexcept = 0;

    /// SDK extension: a human-readable reason for the last failed call of this codec, or an
    /// empty string. Not part of any contract clause; used only for diagnostics. The pointer is
    /// valid until the next non-const call.
    [[nodiscard]] virtual char const* lastError() const noexcept
    {
        return "";
    }

    // -----------------------------------------------------------------------------------------
    // Plugin ABI 2: decode with a per-page status. The SDK calls the two methods below only on
    // codecs whose factory declares abiVersion >= 2 (a plugin built against ABI 1 has no such
    // vtable entries); everything above is unchanged from ABI 1.
    // -----------------------------------------------------------------------------------------

    /// True when decodeChecked() is implemented. Then the KV-cache manager verifies nothing on
    /// the host before decoding: it learns each page's outcome from the status the codec writes
    /// where it reads the blob anyway. The default (false) keeps the manager's host-side
    /// envelope check for codecs that declare the envelope.
    [[nodiscard]] virtual bool hasCheckedDecode() const noexcept
    {
        return false;
    }

    /// decode() that also reports every page's outcome: for each i in [0, numBasePages), writes
    /// one PageStatus byte to pageStatus[i] (kPageOk, or why the page was not decoded). Same
    /// index, stream and batching rules as decode().
    ///
    ///  - `pageStatus` is memory the codec's work can write: device or mapped pinned host memory
    ///    for a CUDA codec (written by work enqueued on `stream`, valid once it completes), host
    ///    memory for a CPU codec (valid when the call returns). Every entry is written, kPageOk
    ///    included; the pointer is not retained beyond the submitted work.
    ///  - A page with a non-OK status must not receive another page's bytes or a partly checked
    ///    page; the contents of its hot slot are unspecified (the manager frees that slot and
    ///    reports the page dropped, never onboarded).
    ///  - Returns false only for what decode() would refuse as a whole (bad arguments, a
    ///    submission failure); a bad blob is a status, not a failed call.
    virtual bool decodeChecked(LayerGroupId layerGroupId, void const* srcBasePtr, PageIndexPair const* pageIndices,
        size_t numBasePages, uint8_t* pageStatus, cudaStream_t stream) noexcept
    {
        (void)layerGroupId, (void)srcBasePtr, (void)pageIndices, (void)numBasePages, (void)pageStatus, (void)stream;
        return false;
    }
};

/// One page's outcome of decodeChecked() (one byte per page). Values 1-5 equal EnvelopeStatus.
enum PageStatus : uint8_t
{
    kPageOk = 0,
    kPageBadMagic = 1,         ///< The blob does not start with an envelope.
    kPageBadFormatVersion = 2, ///< The envelope names another format version.
    kPageBadHeader = 3,        ///< Header CRC mismatch, sizes outside the blob or a bad codec header.
    kPageDidNotFit = 4,        ///< The page did not fit its slot: the blob holds no page.
    kPageBadChecksum = 5,      ///< The payload fails its checksum.
    kPageDecodeFailed = 6,     ///< The payload passed its checksum but did not decode.
    kPageBadIndex = 7,         ///< The page's index pair is out of range.
};

/// Number of PageStatus values (drop-reason counters are indexed by status).
inline constexpr int kNumPageStatuses = 8;

// ---------------------------------------------------------------------------------------------
// Cold-page envelope
//
// A variable-ratio codec stored in fixed slots cannot make every page fit. Such a codec starts
// each blob with this header so the host can check a blob before decoding it: a blob whose page
// did not fit, or whose checksum fails, is dropped and counted; an engine sees a miss, never
// wrong data. All fields are little-endian.
// ---------------------------------------------------------------------------------------------

/// "KVCP" read as a little-endian uint32.
inline constexpr uint32_t kColdPageEnvelopeMagic = 0x5043564Bu;

/// Envelope flags.
enum ColdPageEnvelopeFlags : uint16_t
{
    kEnvelopeStoredRaw = 1u << 0,  ///< The payload is the raw page (the codec's own raw layout).
    kEnvelopeCompressed = 1u << 1, ///< The payload is compressed.
    kEnvelopeDidNotFit = 1u << 2,  ///< The page did not fit the slot: the blob holds no page.
};

/// Header at byte 0 of every enveloped blob (32 bytes, 8-byte aligned).
struct alignas(8) ColdPageEnvelope
{
    uint32_t magic;         ///< kColdPageEnvelopeMagic.
    uint16_t formatVersion; ///< The codec's format_version.
    uint16_t flags;         ///< ColdPageEnvelopeFlags.
    uint32_t headerBytes;   ///< Bytes from blob start to payload start (>= sizeof(ColdPageEnvelope)).
    uint32_t payloadBytes;  ///< Bytes of payload following the codec's header area.
    uint64_t rawBytes;      ///< Bytes of the decoded page.
    uint32_t checksum;      ///< CRC-32C of bytes [32, headerBytes + payloadBytes): codec header area + payload.
    uint32_t headerCrc;     ///< CRC-32C of the preceding 28 bytes of this header.
};

static_assert(sizeof(ColdPageEnvelope) == 32);
static_assert(std::is_trivially_copyable_v<ColdPageEnvelope>);

/// Result of checking a blob's envelope on the host.
enum class EnvelopeStatus : int32_t
{
    kOk = 0,
    kBadMagic = 1,
    kBadFormatVersion = 2,
    kBadHeader = 3, ///< Header CRC mismatch or sizes outside the blob.
    kDidNotFit = 4,
    kBadChecksum = 5,
};

/// Checks a blob of `blobBytes` bytes in host memory (the checksum with crc32cFast). Only kOk
/// may be decoded.
inline EnvelopeStatus checkColdPageEnvelope(void const* blob, size_t blobBytes, uint16_t expectedFormatVersion) noexcept
{
    if (blob == nullptr || blobBytes < sizeof(ColdPageEnvelope))
    {
        return EnvelopeStatus::kBadHeader;
    }
    ColdPageEnvelope h{};
    auto const* src = static_cast<unsigned char const*>(blob);
    auto* dst = reinterpret_cast<unsigned char*>(&h);
    for (size_t i = 0; i < sizeof(h); ++i)
    {
        dst[i] = src[i];
    }
    if (h.magic != kColdPageEnvelopeMagic)
    {
        return EnvelopeStatus::kBadMagic;
    }
    if (crc32c(&h, offsetof(ColdPageEnvelope, headerCrc)) != h.headerCrc)
    {
        return EnvelopeStatus::kBadHeader;
    }
    if (h.formatVersion != expectedFormatVersion)
    {
        return EnvelopeStatus::kBadFormatVersion;
    }
    if (h.flags & kEnvelopeDidNotFit)
    {
        return EnvelopeStatus::kDidNotFit;
    }
    if (h.headerBytes < sizeof(ColdPageEnvelope) || h.headerBytes > blobBytes
        || h.payloadBytes > blobBytes - h.headerBytes)
    {
        return EnvelopeStatus::kBadHeader;
    }
    if (crc32cFast(src + sizeof(ColdPageEnvelope), h.headerBytes - sizeof(ColdPageEnvelope) + h.payloadBytes)
        != h.checksum)
    {
        return EnvelopeStatus::kBadChecksum;
    }
    return EnvelopeStatus::kOk;
}

} // namespace kvcodec

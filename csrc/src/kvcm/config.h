// SPDX-License-Identifier: Apache-2.0
//
// The manager's configuration as the C++ core takes it (the Python facade converts its
// dataclasses into this), and the hot slot layout derived from it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvcodec/codec.h"
#include "tiers/disk/file_io.h"

namespace kvcodec::kvcm {

class RemoteQueue;

/// Storage levels, hottest first. Pool-group indices of different levels are unrelated.
enum class CacheLevel : int32_t
{
    kHot = 0,  ///< Kernel-facing pools (GPU memory; host memory on the host backend).
    kHost = 1, ///< Pinned, GPU-mapped host memory holding cold pages.
    kDisk = 2, ///< Disk tier regions (not GPU-accessible: staged through the pinned page ring).
    /// A shared key-value store (Mooncake Store, Valkey, ...) reached through a RemoteQueue whose
    /// worker the Python layer runs; staged like the disk, never an automatic eviction target.
    kRemote = 3,
};
inline constexpr int kNumLevels = 4;

char const* levelName(CacheLevel level) noexcept;

/// One buffer of one layer inside a page of a layer group.
struct BufferConfig
{
    int32_t layer = 0;
    BufferRole role = BufferRole::kOther;
    DataType dtype = DataType::kUInt8;
    uint64_t bytes = 0; ///< Bytes per page.
    int32_t tokensPerPage = 0;
    int32_t numHeads = 0;
    int32_t headDim = 0;
};

/// A layer group (= lifecycle; its index is its LifeCycleId).
struct LayerGroupConfig
{
    std::vector<BufferConfig> buffers;
};

/// The remote tier: blobs on a shared store under their content keys. The manager tracks at
/// most `maxPages` pages there per cold pool group (logical slots; the store's own capacity,
/// eviction and TTL decide what it keeps); the store's I/O runs on the worker that serves `queue`.
struct RemoteTierConfig
{
    uint64_t maxPages = 0; ///< 0: no remote tier.
    std::shared_ptr<RemoteQueue> queue;
};

/// The disk tier: one region (directory `path`/group<g>) per cold pool group. The codec identity
/// is recorded per region, so a restart with another codec or layout invalidates the region.
struct DiskTierConfig
{
    std::string path;            ///< Empty: no disk tier.
    uint64_t maxBytes = 0;       ///< Container bytes of all regions together (split like the host tier).
    uint64_t containerBytes = 0; ///< Bytes per container file (capped at a region's share).
    int32_t ioMode = 0;          ///< disk::IoMode.
    uint32_t ioThreads = 32;
    int32_t ioBackend = 1;   ///< disk::IoBackend (1: the thread pool).
    uint32_t queueDepth = 8; ///< io_uring requests in flight per worker.
    std::string codecName;
    uint32_t formatVersion = 0;
    std::string paramHash; ///< Covers the codec parameters and the layer-group layout.
    std::string paramsJson;
    std::string layoutJson;
    /// Test-only fault rules for the region I/O.
    std::vector<disk::FaultRule> faults;
};

/// The shared host level: the host tier in the per-host daemon's L2 arena (shared_level.h).
struct SharedTierConfig
{
    std::string socketPath; ///< Empty: the host tier is this process's own pinned memory.
    /// Names the arena regions: the codec identity and layer-group layout (managers that share
    /// pages must agree on it).
    std::string identity;
    /// Slots each pool group's region asks for when this manager creates it (0: eight times the
    /// group's share of the host quota); a region that exists keeps its size.
    uint64_t regionSlots = 0;
    bool verifyCrc = true; ///< Check each shared blob's CRC-32C before decoding it.
    double timeoutS = 5.0;
    /// After the daemon went away, the manager re-attaches by itself at the start of its
    /// migrations and shared lookups, at most once per this many seconds; negative: only when
    /// reattachShared() is called.
    double reattachEveryS = -1;
};

struct KvcmConfig
{
    std::vector<LayerGroupConfig> layerGroups;
    uint64_t gpuQuotaBytes = 0; ///< Hot tier bytes.
    /// The largest hot quota a resize may set (0: gpuQuotaBytes). The hot pools are allocated for
    /// it once: the codec is configured with their addresses and never reconfigured.
    uint64_t maxGpuQuotaBytes = 0;
    uint64_t hostQuotaBytes = 0; ///< Host tier bytes; 0: no host tier (a GPU-only manager).
    /// One positive hot-tier byte weight per layer group, in layer-group order (normalized here).
    std::vector<double> poolRatio;
    /// Hot-only feasibility floors: minimum hot slots per layer group (empty: none). They may
    /// clamp the hot split; they are not projected into the cold levels.
    std::vector<uint64_t> minHotSlots;
    /// Allocation under hot pressure evicts least-recently-used unpinned pages to the next colder
    /// level (the last level drops) instead of failing.
    bool autoEvict = true;
    /// Bytes of the device index ring, allocated only when a lifecycle takes device indices.
    uint64_t indexRingBytes = 1 << 20;
    /// The codec's format version when it declares the cold-page envelope, else -1.
    int32_t envelopeFormatVersion = -1;
    DiskTierConfig disk;
    RemoteTierConfig remote;
    SharedTierConfig shared;
};

/// The hot slot layout of one lifecycle: one pool per layer (in order of first appearance in
/// the layer group's buffers); a pool's slot holds that layer's buffers back to back, in
/// configuration order.
struct HotSlotLayout
{
    std::vector<uint64_t> poolSlotBytes;
    std::vector<BufferDesc> buffers; ///< poolIndex/byteOffset filled in.
};

/// Checks the configuration; throws std::invalid_argument naming the offending field.
void validateConfig(KvcmConfig const& config);

/// Derives the hot slot layout of layer group `lifeCycle` (config already validated).
HotSlotLayout hotSlotLayout(LayerGroupConfig const& group);

} // namespace kvcodec::kvcm

// SPDX-License-Identifier: Apache-2.0
//
// The manager's configuration as the C++ core takes it (the Python facade converts its
// dataclasses into this), and the hot slot layout derived from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvcodec/codec.h"

namespace kvcodec::kvcm {

/// Storage levels, hottest first. Pool-group indices of different levels are unrelated.
enum class CacheLevel : int32_t
{
    kHot = 0,  ///< Kernel-facing pools (GPU memory; host memory on the host backend).
    kHost = 1, ///< Pinned, GPU-mapped host memory holding cold pages.
};
inline constexpr int kNumLevels = 2;

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

struct KvcmConfig
{
    std::vector<LayerGroupConfig> layerGroups;
    uint64_t gpuQuotaBytes = 0;  ///< Hot tier bytes.
    uint64_t hostQuotaBytes = 0; ///< Host tier bytes; 0: no host tier (a GPU-only manager).
    /// One positive hot-tier byte weight per layer group, in layer-group order (normalized here).
    std::vector<double> poolRatio;
    /// Bytes of the device index ring, allocated only when a lifecycle takes device indices.
    uint64_t indexRingBytes = 1 << 20;
    /// The codec's format version when it declares the cold-page envelope, else -1.
    int32_t envelopeFormatVersion = -1;
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

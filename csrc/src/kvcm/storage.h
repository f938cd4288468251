// SPDX-License-Identifier: Apache-2.0
//
// StorageManager: owns the codec, the hot pool groups, the cold levels, the level-specific
// lifecycle -> pool-group mappings and the index staging ring, and submits the transfers of
// every migration path. Construction is the seed's initialization sequence, steps 1-7.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kvcm/config.h"
#include "kvcm/disk_level.h"
#include "kvcm/levels.h"
#include "kvcm/remote_level.h"
#include "kvcm/staging.h"
#include "runtime/device_runtime.h"
#include "runtime/owned_codec.h"

namespace kvcodec::kvcm {

/// Codec calls are split so that no call carries more than 64 KiB of page indices.
inline constexpr size_t kMaxIndexBatchBytes = 64 * 1024;
inline constexpr size_t kMaxPairsPerCall = kMaxIndexBatchBytes / sizeof(PageIndexPair);

/// What the manager knows about one lifecycle after construction.
struct LifeCycleInfo
{
    HotSlotLayout layout;
    uint64_t hotPageBytes = 0;
    uint64_t coldPageBytes = 0;
    LifeCycleId batchingRepresentative = -1; ///< Batching representative (codec-equivalence class).
    PageIndexLocation location = PageIndexLocation::kBadLocation;
};

class StorageManager
{
public:
    /// Runs initialization steps 1-7. `codec` is consumed (destroyed if construction throws);
    /// null selects the default concat codec for the runtime's device. `codecDevice` is the
    /// device the supplied codec was created for. Throws std::invalid_argument for
    /// configuration and validation errors, std::runtime_error for allocation failures.
    StorageManager(KvcmConfig config, runtime::DeviceRuntime& runtime, runtime::CodecPtr codec, int32_t codecDevice);
    ~StorageManager();

    [[nodiscard]] KvcmConfig const& config() const noexcept
    {
        return config_;
    }
    [[nodiscard]] size_t numLifeCycles() const noexcept
    {
        return lifeCycles_.size();
    }
    [[nodiscard]] LifeCycleInfo const& lifeCycle(LifeCycleId id) const noexcept
    {
        return lifeCycles_[size_t(id)];
    }
    [[nodiscard]] bool hasLevel(CacheLevel level) const noexcept
    {
        return level == CacheLevel::kHot || (level == CacheLevel::kHost && host_ != nullptr)
            || (level == CacheLevel::kDisk && disk_ != nullptr) || (level == CacheLevel::kRemote && remote_ != nullptr);
    }
    /// Pool group of `lifeCycle` at `level` (the level must exist).
    [[nodiscard]] PoolGroupIndex poolGroup(CacheLevel level, LifeCycleId lifeCycle) const noexcept
    {
        return lifeCycleToPoolGroup_[size_t(level)][size_t(lifeCycle)];
    }
    [[nodiscard]] std::vector<PoolGroupIndex> const& mapping(CacheLevel level) const noexcept
    {
        return lifeCycleToPoolGroup_[size_t(level)];
    }
    [[nodiscard]] size_t numPoolGroups(CacheLevel level) const noexcept;
    SlotPool& slots(CacheLevel level, PoolGroupIndex group) noexcept;
    /// Bytes of one page of a pool group at `level` (hot: sum of pool slots; cold: blob bytes).
    [[nodiscard]] uint64_t pageBytes(CacheLevel level, PoolGroupIndex group) const noexcept;

    [[nodiscard]] std::vector<HotPoolGroup> const& hotGroups() const noexcept
    {
        return hot_;
    }
    [[nodiscard]] HotPoolGroup& hotGroup(PoolGroupIndex group) noexcept
    {
        return hot_[size_t(group)];
    }
    /// Work every cold level does between the manager's calls (ColdLevel::maintain()).
    void maintain(bool waitWrites = false)
    {
        for (ColdLevel* level :
            {host_.get(), static_cast<ColdLevel*>(disk_.get()), static_cast<ColdLevel*>(remote_.get())})
        {
            if (level != nullptr)
            {
                level->maintain(waitWrites);
            }
        }
    }

    /// Slots per pool group of `level` for a quota of `quota` bytes, with the construction's
    /// projection: the pool ratio, the hot-only floors (hot level) or the structural minimum of
    /// one slot (cold levels), unless the cold level decides its own geometry
    /// (ColdLevel::ownSlotCounts()). Throws std::invalid_argument for an infeasible quota.
    [[nodiscard]] std::vector<uint64_t> projectSlots(CacheLevel level, uint64_t quota) const;
    /// Records the level's quota after a resize (hot or host; the disk level records its own).
    void setQuota(CacheLevel level, uint64_t quota) noexcept;
    /// Why a cold level is absent, naming the configuration field that would create it.
    [[nodiscard]] static std::string missingLevelReason(CacheLevel level);
    [[nodiscard]] ColdLevel* coldLevel(CacheLevel level) const noexcept
    {
        switch (level)
        {
        case CacheLevel::kHost: return host_.get();
        case CacheLevel::kDisk: return disk_.get();
        case CacheLevel::kRemote: return remote_.get();
        default: return nullptr;
        }
    }
    /// The disk level, or null without a disk tier.
    [[nodiscard]] DiskColdLevel* diskLevel() const noexcept
    {
        return disk_.get();
    }
    /// Closes a cold level (the disk's regions are flushed and unlocked); it is gone afterwards.
    void closeLevel(CacheLevel level) noexcept;
    /// Closes the disk level (its regions are flushed and unlocked); the level is gone afterwards.
    void closeDisk() noexcept
    {
        disk_.reset();
        lifeCycleToPoolGroup_[size_t(CacheLevel::kDisk)].clear();
    }
    /// The remote level, or null without a remote tier.
    [[nodiscard]] RemoteColdLevel* remoteLevel() const noexcept
    {
        return remote_.get();
    }
    /// Closes the remote level (its queue fails what is not taken and waits for the worker's
    /// jobs); the level is gone afterwards.
    void closeRemote() noexcept
    {
        remote_.reset();
        lifeCycleToPoolGroup_[size_t(CacheLevel::kRemote)].clear();
    }
    /// The pinned page ring (staging for the disk level), or null without a disk tier.
    [[nodiscard]] StagingManager* pageRing() const noexcept
    {
        return pageRing_.get();
    }

    [[nodiscard]] IKvCacheColdPageCodec& codec() const noexcept
    {
        return *codec_;
    }
    /// The device index ring, or null while no device-index call has happened.
    [[nodiscard]] StagingManager const* indexRing() const noexcept
    {
        return indexRing_.get();
    }

    /// Encodes (hot -> cold) or decodes (cold -> hot) `count` pairs with the batching
    /// representative `rep`, staging the indices where the codec takes them. `count` is at most
    /// kMaxPairsPerCall; the ring may split it into several codec calls. A decode with
    /// `pageStatus` calls decodeChecked() (only when checkedDecode()), one status byte per pair.
    /// Codec calls are serialized (codecs need not be reentrant): on the CPU backend the
    /// manager's I/O thread encodes while a caller may decode. `calls` (if given) gets the
    /// number of codec calls made.
    bool transcode(bool encode, LifeCycleId rep, std::byte* coldBase, PageIndexPair const* pairs, size_t count,
        Stream stream, std::string& error, uint8_t* pageStatus = nullptr, uint64_t* calls = nullptr);

    /// True when the codec reports a status per decoded page (plugin ABI >= 2 and
    /// hasCheckedDecode()): blobs are then verified where the codec reads them, not on the host.
    [[nodiscard]] bool checkedDecode() const noexcept
    {
        return checkedDecode_;
    }

    /// Codec encode()/decode() calls made so far.
    [[nodiscard]] uint64_t codecCalls() const noexcept
    {
        return codecCalls_;
    }

    /// Hot -> hot per-pool copies of pages (dst slot, src slot) inside one hot pool group.
    bool copyHot(PoolGroupIndex group, PageIndexPair const* pairs, size_t count, Stream stream, std::string& error);

    /// Cold -> cold raw blob copies.
    bool copyCold(CacheLevel srcLevel, PoolGroupIndex srcGroup, CacheLevel dstLevel, PoolGroupIndex dstGroup,
        PageIndexPair const* pairs, size_t count, Stream stream, std::string& error);

private:
    void buildHotLayout();
    [[nodiscard]] std::vector<uint64_t> projectHot(uint64_t quota, char const* quotaField) const;
    [[nodiscard]] std::vector<uint64_t> projectCold(uint64_t quota) const;
    void allocateHot();
    void configureCodec();
    void queryCodec();
    void validateBatchingAndMapCold();
    void allocateCold();
    StagingManager& ensureIndexRing();

    KvcmConfig config_;
    runtime::DeviceRuntime& runtime_;
    // Declared first, destroyed last: the ring, levels and pools go before the codec that was
    // configured with their addresses (the manager synchronized every stream before).
    runtime::CodecPtr codec_;
    std::vector<LifeCycleInfo> lifeCycles_;
    std::vector<double> weights_; ///< Normalized pool ratio, per lifecycle.
    std::vector<HotPoolGroup> hot_;
    std::vector<double> coldWeight_;      ///< Cold byte weight per cold pool group.
    std::vector<uint64_t> coldPageBytes_; ///< Blob bytes per cold pool group.
    std::unique_ptr<ColdLevel> host_;
    std::array<std::vector<PoolGroupIndex>, kNumLevels> lifeCycleToPoolGroup_;
    std::unique_ptr<StagingManager> indexRing_;
    // The disk level is closed before the ring whose slices it may have been handed.
    std::unique_ptr<StagingManager> pageRing_;
    std::unique_ptr<DiskColdLevel> disk_;
    // The remote level has a ring of its own (staging slices held by its jobs never starve the
    // disk's), destroyed after the level.
    std::unique_ptr<StagingManager> remoteRing_;
    std::unique_ptr<RemoteColdLevel> remote_;
    std::atomic<uint64_t> codecCalls_{0};
    std::mutex codecMu_; ///< Held around every codec call (see transcode()).
    bool checkedDecode_ = false;
};

} // namespace kvcodec::kvcm

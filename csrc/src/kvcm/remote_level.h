// SPDX-License-Identifier: Apache-2.0
//
// The remote cold level: blobs on a shared key-value store (Mooncake Store, Valkey, ...) under
// their content keys, so another instance configured with the same codec and layout finds them.
//
// The store's clients are Python packages, so the level never calls a store itself: each staged
// read or write becomes a job of a RemoteQueue, which a worker thread that the Python layer runs
// (kvcodec_sdk.remote.level) takes, performs with its backend (each call bounded by the
// backend's timeout) and finishes. The manager's I/O thread waits for a job in awaitIo(), the
// caller's thread never does; no native thread ever needs the interpreter.
//
// Slots are logical (config.remote.maxPages per cold pool group): slot s of a group names the
// blob its page is stored under. A page with content key K and lifecycle L is stored as
// "k<L>/<K>"; a page without a key as "a<nonce>/<n>", removed from the store when the page
// leaves the level (nobody else can name it). Keyed blobs stay in the store when their page
// leaves: the store is shared, and its own eviction and TTL retire them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvcm/levels.h"
#include "kvcm/staging.h"

namespace kvcodec::kvcm {

/// What a remote job asks of the store.
enum class RemoteOp : uint8_t
{
    kPut = 0,    ///< Store buffers[i] (sizes[i] bytes) under names[i].
    kGet = 1,    ///< Read the value of names[i] into buffers[i] (sizes[i] bytes of room).
    kRemove = 2, ///< Remove names[i] (no buffers).
};

/// Per-key results of a finished job (the values of kvcodec_sdk.remote.backend).
namespace remote_result {
inline constexpr int64_t kStored = 0;    ///< put: stored.
inline constexpr int64_t kFull = 1;      ///< put: the store had no room.
inline constexpr int64_t kRefused = 2;   ///< put: the store refused the key.
inline constexpr int64_t kMiss = -1;     ///< get: no value (GET_MISS).
inline constexpr int64_t kTooSmall = -4; ///< get: the value is larger than the buffer (GET_TOO_SMALL).
inline constexpr int64_t kError = -5;    ///< get: the store failed this key (GET_ERROR).
// -2 (GET_MISMATCH, another codec identity) and -3 (GET_CORRUPT) are corrupt blobs.
} // namespace remote_result

/// One batch of store operations.
struct RemoteJob
{
    uint64_t id = 0;
    RemoteOp op = RemoteOp::kPut;
    std::vector<std::string> names;
    std::vector<std::byte*> buffers;
    std::vector<uint64_t> sizes;
    /// Per name, once finished (see remote_result); empty when the batch failed as a whole.
    std::vector<int64_t> results;
    std::string error; ///< Why the batch failed as a whole (empty: it did not).
    bool taken = false;
    bool done = false;
};

/// The hand-off between the remote level and the worker that runs its store's client. Shared by
/// the level and the worker (a Python object), so either may outlive the other.
class RemoteQueue
{
public:
    RemoteQueue() = default;
    RemoteQueue(RemoteQueue const&) = delete;
    RemoteQueue& operator=(RemoteQueue const&) = delete;

    /// Queues a job; returns its id. A closed queue finishes it at once with `error`.
    uint64_t push(
        RemoteOp op, std::vector<std::string> names, std::vector<std::byte*> buffers, std::vector<uint64_t> sizes);
    /// The worker's next job, or null after `timeoutS` seconds or once the queue is closed.
    std::shared_ptr<RemoteJob> take(double timeoutS);
    /// The worker finished job `id` (`results` one per name, or `error` for the whole batch).
    /// Returns false when the id is unknown (the job was already failed by close()).
    bool finish(uint64_t id, std::vector<int64_t> results, std::string error);
    /// Blocks until job `id` is finished; returns it and forgets it.
    std::shared_ptr<RemoteJob> collect(uint64_t id);
    /// Blocks until job `id` is finished (it stays until collect()).
    void wait(uint64_t id);
    /// Fails every job not taken yet with `why`, waits until the taken ones are finished (their
    /// buffers are in use), and fails later pushes. Idempotent.
    void close(std::string const& why);
    [[nodiscard]] bool closed() const;
    /// Jobs queued and not taken, and taken and not finished.
    [[nodiscard]] size_t queued() const;
    [[nodiscard]] size_t taken() const;

private:
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<RemoteJob>> queue_;
    std::unordered_map<uint64_t, std::shared_ptr<RemoteJob>> jobs_; ///< Every job not yet collected.
    uint64_t nextId_ = 1;
    size_t taken_ = 0;
    bool closed_ = false;
    std::string closedWhy_;
};

/// One cold pool group of the remote level: the store names of its slots.
struct RemoteLevelGroup
{
    uint64_t pageBytes;
    SlotPool slots;
    std::vector<std::string> names; ///< Store name per slot (empty: free).
};

class RemoteColdLevel final : public StagedColdLevel<RemoteLevelGroup>
{
public:
    struct GroupSpec
    {
        uint64_t pageBytes = 0;
        uint64_t slots = 0;
    };

    /// `ring` (kept by the caller, destroyed after this level) stages codec transfers;
    /// `lifeCycleGroup[l]` is lifecycle l's cold pool group.
    RemoteColdLevel(RemoteTierConfig const& config, std::vector<GroupSpec> const& groups,
        std::vector<PoolGroupIndex> lifeCycleGroup, StagingManager& ring);
    /// Closes the queue (see RemoteQueue::close()).
    ~RemoteColdLevel() override;

    [[nodiscard]] CacheLevel level() const noexcept override
    {
        return CacheLevel::kRemote;
    }
    /// The page left `slot`: an anonymous blob is removed from the store (in the background).
    void release(PoolGroupIndex group, int32_t slot) noexcept override;
    /// Raw copies are staged reads and writes (jobs): these synchronous ones are refused.
    bool copyOut(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count, Stream stream,
        std::string& error) noexcept override;
    bool copyIn(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count, Stream stream,
        std::string& error) noexcept override;

    // Staged reads and writes are jobs of the queue that the Python worker serves.
    BlobIo submitWrite(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, BlobName const* names,
        size_t count) noexcept override;
    BlobIo submitRead(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count,
        BlobStatus* status) noexcept override;
    void awaitIo(BlobIo io) noexcept override;
    bool complete(BlobIo io, std::string& error) noexcept override;

    /// Offers content keys found in the store (by the Python layer's batched existence check)
    /// with the lifecycle each was found under; claim() then takes them. Returns the offers' token
    /// for withdraw().
    uint64_t offer(std::vector<std::string> const& keys, std::vector<LifeCycleId> const& lifeCycles);
    /// Withdraws the offers of `keys` made under `token` that no claim took (a key offered again
    /// since keeps the newer offer), so that a key found once is not claimed later from a stale
    /// offer.
    void withdraw(std::vector<std::string> const& keys, uint64_t token);
    /// Offers neither claimed nor withdrawn (0 between finds).
    [[nodiscard]] size_t numOffered() const;
    /// Claims an offered key: a logical slot of its lifecycle's group names its blob. Nullopt
    /// when it was not offered or the group has no free slot.
    std::optional<ClaimedBlob> claim(std::string const& key) override;

    /// The store name of a keyed page's blob ("k<lifecycle>/<key>").
    [[nodiscard]] static std::string keyedName(std::string const& key, LifeCycleId lifeCycle);

    [[nodiscard]] std::optional<std::vector<uint64_t>> ownSlotCounts(uint64_t quota) const override;
    /// Refused: the store decides its capacity; config.remote.maxPages is fixed.
    void applyQuota(std::vector<uint64_t> const& slots, uint64_t quota) override;

    [[nodiscard]] RemoteQueue& queue() const noexcept
    {
        return *queue_;
    }

private:
    // One submitted batch: a job of the queue, until complete().
    struct Pending
    {
        uint64_t job = 0;
        PoolGroupIndex group = 0;
        bool write = false;
        std::vector<int32_t> slots;
        BlobStatus* status = nullptr;
    };

    std::shared_ptr<RemoteQueue> queue_;
    std::vector<PoolGroupIndex> lifeCycleGroup_;
    std::string nonce_;
    mutable std::mutex mu_; ///< Guards everything below and groups_' names (the I/O thread calls in).
    std::unordered_map<uint64_t, Pending> pending_; ///< By BlobIo id.
    struct Offer
    {
        LifeCycleId lifeCycle;
        uint64_t token;
    };
    std::unordered_map<std::string, Offer> offered_;
    uint64_t nextOffer_ = 1;
    uint64_t nextIo_ = 1;
    uint64_t nextAnonymous_ = 0;
};

} // namespace kvcodec::kvcm

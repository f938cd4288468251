// SPDX-License-Identifier: Apache-2.0
#include "kvcm/remote_level.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <stdexcept>

namespace kvcodec::kvcm {

namespace {

// How long closing waits for jobs the worker holds (their buffers are in use). Each of the
// worker's store calls is bounded by its backend's timeout; this bound only matters when the
// worker can no longer run (the interpreter is shutting down).
constexpr auto kCloseWait = std::chrono::seconds(60);

std::string randomNonce()
{
    std::random_device rd;
    uint64_t const value = (uint64_t(rd()) << 32) ^ uint64_t(rd());
    char text[17];
    std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
    return text;
}

} // namespace

// --- RemoteQueue ----------------------------------------------------------------------------------

uint64_t RemoteQueue::push(
    RemoteOp op, std::vector<std::string> names, std::vector<std::byte*> buffers, std::vector<uint64_t> sizes)
{
    auto job = std::make_shared<RemoteJob>();
    job->op = op;
    job->names = std::move(names);
    job->buffers = std::move(buffers);
    job->sizes = std::move(sizes);
    std::lock_guard<std::mutex> lock(mu_);
    job->id = nextId_++;
    if (closed_)
    {
        job->done = true;
        job->error = closedWhy_;
    }
    else
    {
        queue_.push_back(job);
    }
    if (op != RemoteOp::kRemove)
    {
        jobs_.emplace(job->id, job); // Removals are never collected: forgotten once finished.
    }
    cv_.notify_all();
    return job->id;
}

std::shared_ptr<RemoteJob> RemoteQueue::take(double timeoutS)
{
    std::unique_lock<std::mutex> lock(mu_);
    auto const until = std::chrono::steady_clock::now()
        + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(std::max(0.0, timeoutS)));
    cv_.wait_until(lock, until, [&] { return closed_ || !queue_.empty(); });
    if (closed_ || queue_.empty())
    {
        return nullptr;
    }
    std::shared_ptr<RemoteJob> job = std::move(queue_.front());
    queue_.pop_front();
    job->taken = true;
    ++taken_;
    return job;
}

bool RemoteQueue::finish(uint64_t id, std::vector<int64_t> results, std::string error)
{
    std::lock_guard<std::mutex> lock(mu_);
    // A removal is known only to the worker that took it: nothing to look up, nobody waits.
    auto const it = jobs_.find(id);
    if (it == jobs_.end() || it->second->done)
    {
        if (taken_ > 0 && it == jobs_.end())
        {
            --taken_; // A removal the worker took.
            cv_.notify_all();
        }
        return false;
    }
    RemoteJob& job = *it->second;
    if (error.empty() && results.size() != job.names.size())
    {
        error = "the worker returned " + std::to_string(results.size()) + " results for "
            + std::to_string(job.names.size()) + " keys";
    }
    job.results = error.empty() ? std::move(results) : std::vector<int64_t>{};
    job.error = std::move(error);
    job.done = true;
    if (job.taken)
    {
        --taken_;
    }
    cv_.notify_all();
    return true;
}

std::shared_ptr<RemoteJob> RemoteQueue::collect(uint64_t id)
{
    std::unique_lock<std::mutex> lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end())
    {
        return nullptr;
    }
    std::shared_ptr<RemoteJob> job = it->second;
    cv_.wait(lock, [&] { return job->done; });
    jobs_.erase(id);
    return job;
}

void RemoteQueue::wait(uint64_t id)
{
    std::unique_lock<std::mutex> lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end())
    {
        return;
    }
    std::shared_ptr<RemoteJob> job = it->second;
    cv_.wait(lock, [&] { return job->done; });
}

void RemoteQueue::close(std::string const& why)
{
    std::unique_lock<std::mutex> lock(mu_);
    if (!closed_)
    {
        closed_ = true;
        closedWhy_ = why;
        for (auto& job : queue_)
        {
            job->done = true;
            job->error = why;
        }
        queue_.clear();
        cv_.notify_all();
    }
    cv_.wait_for(lock, kCloseWait, [&] { return taken_ == 0; });
}

bool RemoteQueue::closed() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
}

size_t RemoteQueue::queued() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.size();
}

size_t RemoteQueue::taken() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return taken_;
}

// --- RemoteColdLevel ------------------------------------------------------------------------------

RemoteColdLevel::RemoteColdLevel(RemoteTierConfig const& config, std::vector<GroupSpec> const& groups,
    std::vector<PoolGroupIndex> lifeCycleGroup, StagingManager& ring)
    : StagedColdLevel(ring, "the remote tier's pinned page ring")
    , queue_(config.queue)
    , lifeCycleGroup_(std::move(lifeCycleGroup))
    , nonce_(randomNonce())
{
    if (!queue_)
    {
        throw std::invalid_argument("config.remote.queue is not set");
    }
    groups_.reserve(groups.size());
    for (GroupSpec const& g : groups)
    {
        groups_.push_back(RemoteLevelGroup{g.pageBytes, SlotPool(g.slots), std::vector<std::string>(size_t(g.slots))});
    }
}

RemoteColdLevel::~RemoteColdLevel()
{
    queue_->close("the remote tier was closed");
}

std::string RemoteColdLevel::keyedName(std::string const& key, LifeCycleId lifeCycle)
{
    return "k" + std::to_string(lifeCycle) + "/" + key;
}

bool RemoteColdLevel::copyOut(
    PoolGroupIndex, int32_t const*, std::byte* const*, size_t, Stream, std::string& error) noexcept
{
    error = "the remote level moves blobs only by staged reads (a migration), not by raw copies";
    return false;
}

bool RemoteColdLevel::copyIn(
    PoolGroupIndex, int32_t const*, std::byte const* const*, size_t, Stream, std::string& error) noexcept
{
    error = "the remote level moves blobs only by staged writes (a migration), not by raw copies";
    return false;
}

BlobIo RemoteColdLevel::submitRead(
    PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count, BlobStatus* status) noexcept
{
    try
    {
        std::lock_guard<std::mutex> lock(mu_);
        RemoteLevelGroup& g = groups_[size_t(group)];
        std::vector<std::string> names(count);
        for (size_t i = 0; i < count; ++i)
        {
            names[i] = g.names[size_t(slots[i])];
            status[i] = BlobStatus::kFailed; // Until complete().
        }
        uint64_t const job = queue_->push(RemoteOp::kGet, std::move(names), std::vector<std::byte*>(dsts, dsts + count),
            std::vector<uint64_t>(count, g.pageBytes));
        uint64_t const id = nextIo_++;
        pending_.emplace(id, Pending{job, group, false, std::vector<int32_t>(slots, slots + count), status});
        return BlobIo{id};
    }
    catch (std::exception const&)
    {
        return BlobIo{0}; // Out of memory: complete() of an unknown handle fails the transfer.
    }
}

BlobIo RemoteColdLevel::submitWrite(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs,
    BlobName const* names, size_t count) noexcept
{
    try
    {
        std::lock_guard<std::mutex> lock(mu_);
        RemoteLevelGroup& g = groups_[size_t(group)];
        std::vector<std::string> stored(count);
        std::vector<std::byte*> buffers(count);
        for (size_t i = 0; i < count; ++i)
        {
            std::string const* key = names[i].contentKey;
            stored[i] = key != nullptr && !key->empty() ? keyedName(*key, names[i].lifeCycle)
                                                        : "a" + nonce_ + "/" + std::to_string(nextAnonymous_++);
            g.names[size_t(slots[i])] = stored[i];
            // The worker only reads a put's buffers (its views of them are read-only).
            buffers[i] = const_cast<std::byte*>(srcs[i]);
        }
        uint64_t const job = queue_->push(
            RemoteOp::kPut, std::move(stored), std::move(buffers), std::vector<uint64_t>(count, g.pageBytes));
        uint64_t const id = nextIo_++;
        pending_.emplace(id, Pending{job, group, true, std::vector<int32_t>(slots, slots + count), nullptr});
        return BlobIo{id};
    }
    catch (std::exception const&)
    {
        return BlobIo{0};
    }
}

void RemoteColdLevel::awaitIo(BlobIo io) noexcept
{
    uint64_t job = 0;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto const it = pending_.find(io.id);
        if (it == pending_.end())
        {
            return;
        }
        job = it->second.job;
    }
    queue_->wait(job);
}

bool RemoteColdLevel::complete(BlobIo io, std::string& error) noexcept
{
    try
    {
        Pending p;
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto const it = pending_.find(io.id);
            if (it == pending_.end())
            {
                error = "the remote level has no pending batch " + std::to_string(io.id)
                    + " (submission failed: out of memory)";
                return false;
            }
            p = std::move(it->second);
            pending_.erase(it);
        }
        std::shared_ptr<RemoteJob> const job = queue_->collect(p.job);
        size_t const n = p.slots.size();
        RemoteLevelGroup& g = groups_[size_t(p.group)];
        if (p.write)
        {
            size_t failed = 0;
            size_t full = 0;
            for (size_t i = 0; i < n && job->error.empty(); ++i)
            {
                failed += job->results[i] != remote_result::kStored ? 1 : 0;
                full += job->results[i] == remote_result::kFull ? 1 : 0;
            }
            if (job->error.empty() && failed == 0)
            {
                return true;
            }
            error = !job->error.empty()
                ? "writing " + std::to_string(n) + " blobs to the remote store failed: " + job->error
                : "the remote store did not store " + std::to_string(failed) + " of " + std::to_string(n) + " blobs ("
                    + std::to_string(full) + " found it full, " + std::to_string(failed - full) + " refused)";
            // All or nothing: the slots go back to the manager; anonymous blobs that were stored
            // are removed (keyed ones are correct blobs under their keys: they may stay).
            std::vector<std::string> anonymous;
            std::lock_guard<std::mutex> lock(mu_);
            for (size_t i = 0; i < n; ++i)
            {
                std::string& name = g.names[size_t(p.slots[i])];
                bool const stored = job->error.empty() && job->results[i] == remote_result::kStored;
                if (!name.empty() && name[0] == 'a' && (stored || !job->error.empty()))
                {
                    anonymous.push_back(name);
                }
                name.clear();
            }
            if (!anonymous.empty())
            {
                queue_->push(RemoteOp::kRemove, std::move(anonymous), {}, {});
            }
            return false;
        }
        if (!job->error.empty())
        {
            error = "reading " + std::to_string(n) + " blobs from the remote store failed: " + job->error;
            return false; // Every status stays kFailed: nothing changes.
        }
        size_t failures = 0;
        for (size_t i = 0; i < n; ++i)
        {
            int64_t const r = job->results[i];
            p.status[i] = r == int64_t(g.pageBytes) ? BlobStatus::kOk
                : r == remote_result::kMiss         ? BlobStatus::kMissing
                : r == remote_result::kError        ? BlobStatus::kFailed
                                                    : BlobStatus::kCorrupt; // Other size, identity, checksum.
            failures += p.status[i] == BlobStatus::kFailed ? 1 : 0;
        }
        if (failures > 0)
        {
            error = "the remote store failed " + std::to_string(failures) + " of " + std::to_string(n) + " reads";
            return false;
        }
        return true;
    }
    catch (std::exception const& e)
    {
        error = std::string("completing a remote batch failed: ") + e.what();
        return false;
    }
}

void RemoteColdLevel::release(PoolGroupIndex group, int32_t slot) noexcept
{
    try
    {
        std::lock_guard<std::mutex> lock(mu_);
        std::string& name = groups_[size_t(group)].names[size_t(slot)];
        if (!name.empty() && name[0] == 'a')
        {
            queue_->push(RemoteOp::kRemove, {name}, {}, {});
        }
        name.clear();
    }
    catch (std::exception const&)
    {
        // Out of memory: the anonymous blob stays in the store until its eviction or TTL.
    }
}

uint64_t RemoteColdLevel::offer(std::vector<std::string> const& keys, std::vector<LifeCycleId> const& lifeCycles)
{
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t const token = nextOffer_++;
    for (size_t i = 0; i < keys.size() && i < lifeCycles.size(); ++i)
    {
        if (lifeCycles[i] >= 0 && size_t(lifeCycles[i]) < lifeCycleGroup_.size())
        {
            offered_[keys[i]] = Offer{lifeCycles[i], token};
        }
    }
    return token;
}

void RemoteColdLevel::withdraw(std::vector<std::string> const& keys, uint64_t token)
{
    std::lock_guard<std::mutex> lock(mu_);
    for (std::string const& key : keys)
    {
        auto const it = offered_.find(key);
        if (it != offered_.end() && it->second.token == token)
        {
            offered_.erase(it);
        }
    }
}

size_t RemoteColdLevel::numOffered() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return offered_.size();
}

std::optional<ClaimedBlob> RemoteColdLevel::claim(std::string const& key)
{
    std::lock_guard<std::mutex> lock(mu_);
    auto const it = offered_.find(key);
    if (it == offered_.end())
    {
        return std::nullopt;
    }
    LifeCycleId const lifeCycle = it->second.lifeCycle;
    offered_.erase(it);
    PoolGroupIndex const group = lifeCycleGroup_[size_t(lifeCycle)];
    RemoteLevelGroup& g = groups_[size_t(group)];
    if (g.slots.freeSlots() == 0)
    {
        return std::nullopt;
    }
    int32_t const slot = g.slots.take();
    g.names[size_t(slot)] = keyedName(key, lifeCycle);
    return ClaimedBlob{group, slot, lifeCycle};
}

std::optional<std::vector<uint64_t>> RemoteColdLevel::ownSlotCounts(uint64_t quota) const
{
    (void)quota;
    std::vector<uint64_t> out;
    for (RemoteLevelGroup const& g : groups_)
    {
        out.push_back(g.slots.numSlots());
    }
    return out;
}

void RemoteColdLevel::applyQuota(std::vector<uint64_t> const& slots, uint64_t quota)
{
    (void)slots;
    (void)quota;
    throw std::invalid_argument("the remote level cannot be resized: the store decides its capacity, and the pages "
                                "the manager tracks there are config.remote.max_pages per cold pool group");
}

} // namespace kvcodec::kvcm

// SPDX-License-Identifier: Apache-2.0
// The disk level's capacity: the quota, its containers, resize and defragmentation.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <unistd.h>

#include "kvcm/disk_level.h"

namespace kvcodec::kvcm {

std::vector<uint32_t> DiskColdLevel::containersFor(uint64_t quota) const
{
    uint64_t total = 0;
    for (Group const& g : groups_)
    {
        total += g.weight;
    }
    std::vector<uint32_t> out;
    for (size_t i = 0; i < groups_.size(); ++i)
    {
        Group const& g = groups_[i];
        // The configured size splits exactly as at construction; others in the same proportions.
        uint64_t const share = quota == configured_ || total == 0
            ? g.weight
            : uint64_t(double(quota) * double(g.weight) / double(total));
        uint64_t const n = std::max<uint64_t>(1, share / std::max<uint64_t>(g.containerBytes, 1));
        if (n > kMaxContainers)
        {
            throw std::invalid_argument("quota_bytes is " + std::to_string(quota) + ": cold pool group "
                + std::to_string(i) + " would get " + std::to_string(share) + " bytes = " + std::to_string(n)
                + " container files of " + std::to_string(g.containerBytes) + " bytes; at most "
                + std::to_string(kMaxContainers) + " (raise DiskTierConfig.container_bytes)");
        }
        if (g.region && n * g.region->slotsPerContainer() > uint64_t(INT32_MAX))
        {
            throw std::invalid_argument("quota_bytes is " + std::to_string(quota) + ": cold pool group "
                + std::to_string(i) + " would get more than 2^31-1 slots");
        }
        out.push_back(uint32_t(n));
    }
    return out;
}

std::vector<uint64_t> DiskColdLevel::slotsFor(uint64_t quota) const
{
    std::vector<uint32_t> const containers = containersFor(quota);
    std::vector<uint64_t> out;
    for (size_t i = 0; i < groups_.size(); ++i)
    {
        out.push_back(uint64_t(containers[i]) * groups_[i].region->slotsPerContainer());
    }
    return out;
}

void DiskColdLevel::moveSlot(PoolGroupIndex group, int32_t from, int32_t to)
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Group& g = groups_[size_t(group)];
    g.keys[size_t(to)] = std::move(g.keys[size_t(from)]);
    g.keys[size_t(from)].clear();
    g.tags[size_t(to)] = g.tags[size_t(from)];
}

std::vector<int32_t> DiskColdLevel::renumberUnclaimed(PoolGroupIndex group, uint64_t limit)
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    std::vector<int32_t> vacated;
    Group& g = groups_[size_t(group)];
    for (auto& [key, f] : found_)
    {
        if (f.group == group && uint64_t(f.slot) >= limit)
        {
            int32_t const to = g.slots.take();
            moveSlot(group, f.slot, to);
            vacated.push_back(f.slot);
            f.slot = to;
        }
    }
    return vacated;
}

size_t DiskColdLevel::numUnclaimed(PoolGroupIndex group) const noexcept
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    size_t n = 0;
    for (auto const& [key, f] : found_)
    {
        n += f.group == group ? 1 : 0;
    }
    return n;
}

size_t DiskColdLevel::dropUnclaimed(PoolGroupIndex group, size_t count)
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Group& g = groups_[size_t(group)];
    size_t n = 0;
    for (auto it = found_.begin(); it != found_.end() && n < count;)
    {
        if (it->second.group != group)
        {
            ++it;
            continue;
        }
        g.erasing.push_back(g.region->submitErase("k" + it->first));
        g.keys[size_t(it->second.slot)].clear();
        g.slots.give(it->second.slot, nullptr);
        it = found_.erase(it);
        ++n;
    }
    return n;
}

void DiskColdLevel::writeQuotaFile(uint64_t quota) const
{
    std::string const body = "{\"configured_max_bytes\":" + std::to_string(configured_)
        + ",\"quota_bytes\":" + std::to_string(quota) + "}\n";
    std::string const target = path_ + "/" + kQuotaFile;
    std::string const tmp = target + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool ok = fd >= 0 && ::write(fd, body.data(), body.size()) == ssize_t(body.size()) && ::fsync(fd) == 0;
    int err = errno;
    if (fd >= 0)
    {
        ::close(fd);
    }
    ok = ok && std::rename(tmp.c_str(), target.c_str()) == 0;
    if (!ok)
    {
        err = errno;
        ::unlink(tmp.c_str());
        throw std::runtime_error("cannot record the disk quota in " + target + ": " + std::strerror(err));
    }
    int dfd = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0)
    {
        ::fsync(dfd);
        ::close(dfd);
    }
}

void DiskColdLevel::resize(uint64_t quota)
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    std::vector<uint32_t> const target = containersFor(quota);
    std::vector<uint32_t> before;
    for (Group& g : groups_)
    {
        waitErases(g); // Released blobs give their region slots back first.
        before.push_back(g.region->numContainers());
    }
    auto rollBack = [&](size_t upTo) {
        for (size_t j = 0; j < upTo; ++j)
        {
            try
            {
                groups_[j].region->resize(before[j]);
            }
            catch (...)
            {
                // It keeps the new size; a restart resizes it to the recorded quota.
            }
        }
    };
    for (size_t i = 0; i < groups_.size(); ++i)
    {
        try
        {
            groups_[i].region->resize(target[i]);
        }
        catch (disk::ResizeError const& e)
        {
            rollBack(i);
            throw disk::ResizeError(e.code,
                "resizing the disk level to " + std::to_string(quota) + " bytes failed at cold pool group "
                    + std::to_string(i) + ": " + e.what() + "; the disk level keeps its quota of "
                    + std::to_string(quota_) + " bytes");
        }
    }
    try
    {
        writeQuotaFile(quota);
    }
    catch (std::exception const& e)
    {
        rollBack(groups_.size());
        throw disk::ResizeError(disk::StatusCode::kIoError,
            std::string(e.what()) + "; the disk level keeps its quota of " + std::to_string(quota_) + " bytes");
    }
    for (Group& g : groups_)
    {
        uint64_t const n = uint64_t(g.region->numContainers()) * g.region->slotsPerContainer();
        g.keys.resize(n);
        g.tags.resize(n, 0);
        g.slots.setNumSlots(n);
    }
    quota_ = quota;
}

void DiskColdLevel::applyQuota(std::vector<uint64_t> const& slots, uint64_t quota)
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    (void)slots; // slotsFor(quota): resize() derives the same geometry.
    resize(quota);
}

uint64_t DiskColdLevel::defragment()
{
    std::lock_guard<std::recursive_mutex> lock(mu_);
    uint64_t moved = 0;
    for (size_t i = 0; i < groups_.size(); ++i)
    {
        Group& g = groups_[i];
        waitErases(g);
        try
        {
            moved += g.region->defragment().moved;
        }
        catch (disk::ResizeError const& e)
        {
            throw disk::ResizeError(e.code,
                "defragmenting the disk level failed at cold pool group " + std::to_string(i) + ": " + e.what());
        }
    }
    return moved;
}

} // namespace kvcodec::kvcm

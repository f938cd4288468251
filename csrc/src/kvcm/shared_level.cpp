// SPDX-License-Identifier: Apache-2.0
#include "kvcm/shared_level.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <thread>

#include <sys/mman.h>

#include "kvcm/parallel_crcs.h"
#include "kvcodec/crc32c.h"
#include "runtime/log.h"

namespace kvcodec::kvcm {
namespace {

constexpr char kFixed[] = "the shared host level's slots are leased from the per-host daemon; its size is the host "
                          "quota given at construction, and it cannot be resized or defragmented";

std::string daemonKey(LifeCycleId lifeCycle, std::string const& key)
{
    std::string out;
    out.reserve(key.size() + 8); // One allocation: lookups name hundreds of keys at a time.
    out += 'L';
    out += std::to_string(lifeCycle);
    out += '/';
    out += key;
    return out;
}

std::vector<int32_t> asSlots(std::vector<uint32_t> const& in)
{
    return {in.begin(), in.end()};
}

} // namespace

SharedColdLevel::SharedColdLevel(
    runtime::DeviceRuntime& runtime, SharedTierConfig const& config, std::vector<GroupSpec> groups)
    : runtime_(runtime)
    , socketPath_(config.socketPath)
    , identity_(config.identity)
    , verifyCrc_(config.verifyCrc)
    , timeoutS_(config.timeoutS)
    , reattachEveryS_(config.reattachEveryS)
{
    try
    {
        client_ = std::make_unique<daemon::Client>(config.socketPath, config.timeoutS, 30.0);
    }
    catch (daemon::DaemonRefused const& e)
    {
        throw std::invalid_argument(
            "config.shared.socket: no cache daemon answers at '" + config.socketPath + "' (" + e.what() + ")");
    }
    arena_ = client_->arena();
    try
    {
        for (size_t gi = 0; gi < groups.size(); ++gi)
        {
            GroupSpec const& spec = groups[gi];
            SharedLevelGroup g;
            g.pageBytes = spec.pageBytes;
            g.quotaSlots = spec.slots;
            g.members = spec.members;
            uint64_t const want = config.regionSlots != 0 ? config.regionSlots : 8 * std::max<uint64_t>(spec.slots, 1);
            g.layout = openRegion(*client_, *arena_, gi, spec.pageBytes, want, registered_);
            g.spareTarget = std::clamp<uint64_t>(spec.slots / 16, 8, 256);
            uint64_t const lease = std::min<uint64_t>(spec.slots, g.layout.slots);
            std::vector<uint32_t> mine = client_->lease(g.layout, uint32_t(lease));
            if (mine.size() < spec.slots)
            {
                log::write(log::Level::kWarning,
                    "the shared host level's pool group " + std::to_string(gi) + " holds " + std::to_string(mine.size())
                        + " of the " + std::to_string(spec.slots) + " slots of its quota: the daemon's region '"
                        + regionName(gi) + "' has " + std::to_string(g.layout.slots)
                        + " slots and the others are pinned or being written by other clients");
            }
            counters_.leased += mine.size();
            resetSlots(g, g.layout.slots, asSlots(mine), {});
            refillSpares(g);
            for (LifeCycleId l : g.members)
            {
                groupOf_.resize(std::max<size_t>(groupOf_.size(), size_t(l) + 1), PoolGroupIndex(0));
                groupOf_[size_t(l)] = PoolGroupIndex(gi);
            }
            groups_.push_back(std::move(g));
        }
    }
    catch (...)
    {
        unregisterAll(registered_);
        throw;
    }
}

SharedColdLevel::~SharedColdLevel()
{
    {
        std::lock_guard lock(crcMu_);
        crcStop_ = true;
    }
    crcCv_.notify_all();
    if (crcThread_.joinable())
    {
        crcThread_.join(); // Its batches hold the arena they read; none is waited for any more.
    }
    // Transfers still reading or writing the arena were waited for by the manager's close.
    unregisterAll(registered_);
    if (client_)
    {
        client_->close(); // The daemon releases this client's pins and frees its leases.
    }
}

daemon::RegionLayout SharedColdLevel::openRegion(daemon::Client& client, daemon::Mapping& arena, size_t gi,
    uint64_t pageBytes, uint64_t want, std::vector<std::pair<void*, size_t>>& registered)
{
    std::string const name = regionName(gi);
    daemon::RegionLayout const layout
        = client.region(name, pageBytes, uint32_t(std::min<uint64_t>(want, UINT32_MAX)), true);
    if (layout.stride != pageBytes)
    {
        throw std::invalid_argument("config.shared: the daemon's region '" + name + "' puts its slots "
            + std::to_string(layout.stride) + " bytes apart, not " + std::to_string(pageBytes)
            + " (a client of another kind created it); the shared level needs a packed region");
    }
    uint64_t const bytes
        = (uint64_t(layout.slots) * layout.stride + daemon::kArenaPage - 1) / daemon::kArenaPage * daemon::kArenaPage;
    void* data = arena.data(layout, 0);
#ifdef MADV_POPULATE_WRITE
    // The region's pages are mapped now, not faulted in one by one by the first codec call that
    // writes them (what the private host tier's allocation does too). Best effort.
    (void)madvise(data, size_t(bytes), MADV_POPULATE_WRITE);
#endif
    runtime_.registerHost(data, size_t(bytes));
    registered.emplace_back(data, size_t(bytes));
    return layout;
}

void SharedColdLevel::resetSlots(
    SharedLevelGroup& g, uint32_t slots, std::vector<int32_t> const& free, std::vector<int32_t> const& used)
{
    g.slots = SlotPool(slots);
    g.slots.ownOnly(free);
    g.slots.adopt(used, false);
    g.pinned.assign(slots, 0);
    g.expected.assign(slots, daemon::Found{});
    g.digest.assign(slots, daemon::KeyDigest{});
    g.generation.assign(slots, 0);
    g.publish.clear();
    g.unpin.clear();
    g.spare.clear();
    g.givenUp = 0;
}

std::string SharedColdLevel::regionName(size_t gi) const
{
    return identity_ + "/g" + std::to_string(gi);
}

void SharedColdLevel::unregisterAll(std::vector<std::pair<void*, size_t>>& registered) noexcept
{
    for (auto const& [ptr, bytes] : registered)
    {
        runtime_.unregisterHost(ptr);
    }
    registered.clear();
}

bool SharedColdLevel::reattachDue() noexcept
{
    if (client_ || reattachEveryS_ < 0)
    {
        return false;
    }
    auto const now = std::chrono::steady_clock::now();
    if (lastReattachTry_ && std::chrono::duration<double>(now - *lastReattachTry_).count() < reattachEveryS_)
    {
        return false;
    }
    lastReattachTry_ = now;
    return true;
}

bool SharedColdLevel::reattach(std::vector<std::vector<int32_t>> const& held, std::vector<std::vector<int32_t>>& moved)
{
    if (client_)
    {
        return false;
    }
    std::unique_ptr<daemon::Client> client;
    std::vector<std::pair<void*, size_t>> registered;
    std::vector<daemon::RegionLayout> layouts;
    std::vector<std::vector<uint32_t>> leased;
    try
    {
        client = std::make_unique<daemon::Client>(socketPath_, timeoutS_, 30.0);
        std::shared_ptr<daemon::Mapping> const arena = client->arena();
        for (size_t gi = 0; gi < groups_.size(); ++gi)
        {
            SharedLevelGroup const& g = groups_[gi];
            layouts.push_back(openRegion(*client, *arena, gi, g.pageBytes, g.layout.slots, registered));
            // The pages held, and what is left of the quota free (found pages count on top of it).
            uint64_t const want = std::max<uint64_t>(g.quotaSlots, held[gi].size());
            leased.push_back(client->lease(layouts.back(), uint32_t(std::min<uint64_t>(want, layouts.back().slots))));
            if (leased.back().size() < held[gi].size())
            {
                throw std::runtime_error("its region '" + regionName(gi) + "' leased "
                    + std::to_string(leased.back().size()) + " slots for the " + std::to_string(held[gi].size())
                    + " pages this manager holds there");
            }
        }
        moved.assign(groups_.size(), {});
        for (size_t gi = 0; gi < groups_.size(); ++gi)
        {
            SharedLevelGroup& g = groups_[gi];
            std::vector<int32_t> const mine = asSlots(leased[gi]);
            moved[gi].assign(mine.begin(), mine.begin() + ptrdiff_t(held[gi].size()));
            for (size_t i = 0; i < held[gi].size(); ++i)
            {
                std::memcpy(arena->data(layouts[gi], uint32_t(moved[gi][i])),
                    arena_->data(g.layout, uint32_t(held[gi][i])), size_t(g.pageBytes));
            }
            g.layout = layouts[gi];
            resetSlots(g, g.layout.slots, std::vector<int32_t>(mine.begin() + ptrdiff_t(held[gi].size()), mine.end()),
                moved[gi]);
            counters_.leased += mine.size();
        }
        unregisterAll(registered_);
        registered_ = std::move(registered);
        arena_ = arena; // Views of the old arena keep it mapped (memoryOwner()) until they go.
        client_ = std::move(client);
    }
    catch (std::exception const& e)
    {
        unregisterAll(registered);
        if (client)
        {
            client->close(); // Its leases go back to the daemon.
        }
        if (!dynamic_cast<daemon::DaemonGone const*>(&e))
        {
            log::write(log::Level::kWarning,
                "the shared host level did not re-attach to the cache daemon at '" + socketPath_ + "': " + e.what());
        }
        return false;
    }
    ++reattached_;
    try
    {
        for (SharedLevelGroup& g : groups_)
        {
            refillSpares(g);
        }
    }
    catch (daemon::DaemonRefused const& e)
    {
        lostDaemon(e);
    }
    log::write(log::Level::kInfo, "the shared host level re-attached to the cache daemon at '" + socketPath_ + "'");
    return true;
}

std::byte* SharedColdLevel::accessibleBase(PoolGroupIndex group) const noexcept
{
    SharedLevelGroup const& g = groups_[size_t(group)];
    return reinterpret_cast<std::byte*>(arena_->data(g.layout, 0));
}

std::shared_ptr<void const> SharedColdLevel::memoryOwner(PoolGroupIndex group) const
{
    (void)group;
    return arena_;
}

std::byte const* SharedColdLevel::hostBlob(PoolGroupIndex group, int32_t slot) const noexcept
{
    return accessibleBase(group) + uint64_t(slot) * groups_[size_t(group)].pageBytes;
}

bool SharedColdLevel::copyOut(PoolGroupIndex group, int32_t const* slots, std::byte* const* dsts, size_t count,
    Stream stream, std::string& error) noexcept
{
    return copyBlobs(
        runtime_, accessibleBase(group), groups_[size_t(group)].pageBytes, slots, dsts, nullptr, count, stream, error);
}

bool SharedColdLevel::copyIn(PoolGroupIndex group, int32_t const* slots, std::byte const* const* srcs, size_t count,
    Stream stream, std::string& error) noexcept
{
    return copyBlobs(
        runtime_, accessibleBase(group), groups_[size_t(group)].pageBytes, slots, nullptr, srcs, count, stream, error);
}

void SharedColdLevel::release(PoolGroupIndex group, int32_t slot) noexcept
{
    SharedLevelGroup& g = groups_[size_t(group)];
    auto const it = std::find_if(g.publish.begin(), g.publish.end(), [slot](auto const& p) { return p.slot == slot; });
    if (it != g.publish.end())
    {
        g.publish.erase(it); // Left before it was published: the slot is still this manager's lease.
    }
    uint8_t const kind = g.pinned[size_t(slot)];
    if (kind == 0)
    {
        return;
    }
    g.pinned[size_t(slot)] = 0;
    g.slots.retireOnGive(slot); // Not this manager's to reuse: given up once its readers finished.
    if (kind != SharedLevelGroup::kPublished)
    {
        return; // A found page counted on top of the quota.
    }
    if (g.spare.empty() && client_)
    {
        try
        {
            refillSpares(g);
        }
        catch (std::exception const& e)
        {
            lostDaemon(e);
        }
    }
    if (g.spare.empty())
    {
        ++counters_.short_; // The host level holds one slot fewer until a lease comes.
        return;
    }
    g.slots.adoptOne(g.spare.back());
    g.spare.pop_back();
    ++g.givenUp;
}

void SharedColdLevel::landed(
    PoolGroupIndex group, int32_t slot, LifeCycleId lifeCycle, std::string const& key, EventPtr const& written)
{
    if (key.empty() || !client_)
    {
        return;
    }
    try
    {
        SharedLevelGroup& g = groups_[size_t(group)];
        g.publish.push_back({slot, g.generation[size_t(slot)], daemonKey(lifeCycle, key), written, nullptr, 0});
    }
    catch (std::exception const&)
    {
        // Out of memory: the page stays this manager's own (unpublished); nothing is lost.
    }
}

void SharedColdLevel::maintain(bool waitWrites)
{
    if (!client_)
    {
        return;
    }
    try
    {
        for (SharedLevelGroup& g : groups_)
        {
            publish(g, waitWrites);
            giveUp(g);
        }
    }
    catch (daemon::DaemonRefused const& e)
    {
        lostDaemon(e);
    }
}

// Releases the pins of given-up slots whose last readers finished, and leases their replacements.
void SharedColdLevel::giveUp(SharedLevelGroup& g)
{
    for (auto& r : g.slots.takeRetired())
    {
        g.unpin.push_back(std::move(r));
    }
    std::vector<uint32_t> done;
    size_t kept = 0;
    for (auto& u : g.unpin)
    {
        if (!u.second || u.second->query())
        {
            done.push_back(uint32_t(u.first));
            continue;
        }
        g.unpin[kept++] = std::move(u);
    }
    g.unpin.resize(kept);
    if (!done.empty())
    {
        client_->release(g.layout, done);
        counters_.released += done.size();
    }
    if (g.spare.size() < g.spareTarget / 2 + 1)
    {
        refillSpares(g);
    }
    g.givenUp = 0;
}

// Leases slots up to the spare target; they stay withheld in the pool until a release adopts one.
void SharedColdLevel::refillSpares(SharedLevelGroup& g)
{
    if (g.spare.size() >= g.spareTarget)
    {
        return;
    }
    // Between two maintain() calls, each refill takes as many as were given up so far (at least
    // the target): a batch of pages leaving costs a few round trips, not one per target's worth.
    uint64_t const want = std::max<uint64_t>(g.spareTarget - g.spare.size(), g.givenUp);
    std::vector<uint32_t> const got = client_->lease(g.layout, uint32_t(std::min<uint64_t>(want, g.quotaSlots)));
    g.spare.insert(g.spare.end(), got.begin(), got.end());
    counters_.leased += got.size();
}

uint64_t SharedColdLevel::prefetch(std::string const* keys, int32_t const* lifeCycles, size_t count)
{
    uint64_t queued = 0;
    if (!client_ || count == 0)
    {
        return 0;
    }
    try
    {
        for (size_t l = 0; l < groupOf_.size(); ++l)
        {
            SharedLevelGroup const& g = groups_[size_t(groupOf_[l])];
            if (std::find(g.members.begin(), g.members.end(), LifeCycleId(l)) == g.members.end())
            {
                continue;
            }
            std::vector<std::string> names;
            for (size_t i = 0; i < count; ++i)
            {
                if (lifeCycles == nullptr || lifeCycles[i] < 0 || size_t(lifeCycles[i]) == l)
                {
                    names.push_back(daemonKey(LifeCycleId(l), keys[i]));
                }
            }
            if (!names.empty())
            {
                queued += client_->prefetch(g.layout, std::vector<std::string_view>(names.begin(), names.end()));
            }
        }
    }
    catch (daemon::DaemonRefused const& e)
    {
        lostDaemon(e);
    }
    return queued;
}

std::vector<std::optional<ClaimedBlob>> SharedColdLevel::claimMany(
    std::string const* keys, int32_t const* lifeCycles, size_t count)
{
    std::vector<std::optional<ClaimedBlob>> out(count);
    if (!client_ || count == 0)
    {
        return out;
    }
    try
    {
        // One lookup per lifecycle tried, over the keys still missing.
        for (size_t l = 0; l < groupOf_.size(); ++l)
        {
            SharedLevelGroup& g = groups_[size_t(groupOf_[l])];
            if (std::find(g.members.begin(), g.members.end(), LifeCycleId(l)) == g.members.end())
            {
                continue;
            }
            // The daemon's names of the keys still missing, in one buffer (no allocation per key).
            std::string const prefix = "L" + std::to_string(l) + "/";
            std::vector<size_t> which;
            which.reserve(count);
            size_t bytes = 0;
            for (size_t i = 0; i < count; ++i)
            {
                bool const tries = lifeCycles == nullptr || lifeCycles[i] < 0 || size_t(lifeCycles[i]) == l;
                if (!out[i] && tries)
                {
                    which.push_back(i);
                    bytes += prefix.size() + keys[i].size();
                }
            }
            if (which.empty())
            {
                continue;
            }
            std::string buffer;
            buffer.reserve(bytes); // Never grows below: the views stay valid.
            std::vector<std::string_view> names(which.size());
            for (size_t j = 0; j < which.size(); ++j)
            {
                size_t const at = buffer.size();
                buffer += prefix;
                buffer += keys[which[j]];
                names[j] = std::string_view(buffer).substr(at);
            }
            std::vector<daemon::Found> const found = client_->get(g.layout, names);
            std::vector<int32_t> adopted;
            std::vector<uint32_t> bad;
            adopted.reserve(which.size());
            for (size_t j = 0; j < which.size(); ++j)
            {
                daemon::Found const& f = found[j];
                if (f.slot == daemon::Found::kMissSlot)
                {
                    ++counters_.missed;
                    continue;
                }
                // The daemon pinned the slot for this manager: nobody reuses it before it is
                // released, so its header is not read here (a page of its own, every one in
                // another 4 KiB page of the arena). verifyBlobs() checks header and CRC before the
                // decode reads the blob, so a blob a client scribbled on is dropped then.
                if (f.length != g.pageBytes)
                {
                    bad.push_back(f.slot); // Not a blob of this level's size.
                    ++counters_.rejected;
                    continue;
                }
                int32_t const slot = int32_t(f.slot);
                g.pinned[size_t(slot)] = SharedLevelGroup::kFound;
                g.expected[size_t(slot)] = f;
                g.digest[size_t(slot)] = daemon::keyDigest(names[j]);
                adopted.push_back(slot);
                out[which[j]] = ClaimedBlob{groupOf_[l], slot, LifeCycleId(l)};
                ++counters_.found;
            }
            g.slots.adopt(adopted, false);
            if (!bad.empty())
            {
                client_->release(g.layout, bad);
            }
        }
    }
    catch (daemon::DaemonRefused const& e)
    {
        lostDaemon(e);
    }
    return out;
}

void SharedColdLevel::checkHeaders(PoolGroupIndex group, int32_t const* slots, size_t count, uint8_t* ok, uint32_t* crc,
    uint32_t* length) const noexcept
{
    SharedLevelGroup const& g = groups_[size_t(group)];
    try
    {
        for (size_t i = 0; i < count; ++i)
        {
            auto const slot = size_t(slots[i]);
            // A slot leased to this manager (not pinned) is written by nobody else.
            if (g.pinned[slot] == 0)
            {
                ok[i] = 1;
                continue;
            }
            if (!daemon::headerShows(
                    arena_->readHeader(g.layout, uint32_t(slot)), g.layout, g.expected[slot], g.digest[slot]))
            {
                ok[i] = 0;
                continue;
            }
            ok[i] = verifyCrc_ ? 2 : 1;
            crc[i] = g.expected[slot].crc;
            length[i] = uint32_t(g.expected[slot].length);
        }
    }
    catch (...)
    {
        std::fill(ok, ok + count, uint8_t(0)); // Unreadable headers: every page is a miss.
    }
}

void SharedColdLevel::verifyBlobs(PoolGroupIndex group, int32_t const* slots, size_t count, uint8_t* ok) const noexcept
{
    SharedLevelGroup const& g = groups_[size_t(group)];
    std::vector<uint32_t> crc;
    std::vector<uint32_t> length;
    std::vector<size_t> todo; // Blobs whose bytes are checked too.
    try
    {
        crc.resize(count);
        length.resize(count);
        checkHeaders(group, slots, count, ok, crc.data(), length.data());
        for (size_t i = 0; i < count; ++i)
        {
            if (ok[i] == 2)
            {
                todo.push_back(i);
            }
        }
    }
    catch (...)
    {
        std::fill(ok, ok + count, uint8_t(0)); // No room to plan the checks: every page is a miss.
        return;
    }
    detail::parallelCrcs(todo.size(), todo.size() * g.pageBytes, [&](size_t j) {
        size_t const i = todo[j];
        ok[i] = crc32cFast(arena_->data(g.layout, uint32_t(slots[i])), length[i]) == crc[i] ? 1 : 0;
    });
}

char const* SharedColdLevel::fixedGeometry() const noexcept
{
    return kFixed;
}

void SharedColdLevel::applyQuota(std::vector<uint64_t> const& slots, uint64_t quota)
{
    (void)slots;
    (void)quota;
    throw std::invalid_argument(kFixed);
}

void SharedColdLevel::lostDaemon(std::exception const& e) noexcept
{
    log::write(log::Level::kWarning,
        "the cache daemon at '" + socketPath_ + "' stopped answering (" + e.what()
            + "); this manager's host level goes on with the slots it holds, unshared");
    client_.reset();
    for (SharedLevelGroup& g : groups_)
    {
        g.publish.clear();
        g.unpin.clear();
    }
}

} // namespace kvcodec::kvcm

// SPDX-License-Identifier: Apache-2.0
//
// A client of the per-host daemon: pages written into and read from the shared L2 arena in place.
//
// The client maps the arena whose descriptor the daemon passed at the handshake. Writing leases
// slots, fills them in the arena and commits them under their keys; reading asks where each key's
// slot is and reads it in place: no page byte crosses the socket. A read is accepted only when the
// slot's header still shows the version the daemon answered (a slot reused meanwhile is detected),
// the region and the key's digest, and the bytes' CRC-32C matches (bytes another client wrote
// where it should not are detected); anything else is a miss, never wrong data.
//
// Calls are serialised by a mutex (one request in flight per connection).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/l2_index.h"
#include "daemon/values.h"

namespace kvcodec::daemon {

/// The daemon refused a request; the message says why.
class DaemonRefused : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

/// The daemon is not reachable (not started, restarted, stopped answering, or the socket closed).
class DaemonGone : public DaemonRefused
{
public:
    using DaemonRefused::DaemonRefused;
};

class Client
{
public:
    /// Connects at once (DaemonGone when no daemon answers within `timeoutS`). A reply is polled
    /// for `busyPollUs` microseconds before the thread sleeps on the socket (0: sleep at once).
    Client(std::string socketPath, double timeoutS, double busyPollUs = 0);
    ~Client();
    Client(Client const&) = delete;
    Client& operator=(Client const&) = delete;

    /// Connects again (after the daemon restarted: L2 starts empty, regions are asked for anew).
    void reconnect();
    /// Disconnects (the daemon releases whatever this client still pinned). Idempotent.
    void close();

    /// The region of (identity, page bytes); a `packed` new one puts slot s at data + s * page bytes.
    RegionLayout region(std::string_view identity, uint64_t pageBytes, uint32_t slots, bool packed = false);
    /// Up to `count` slots to write (fewer when L2 has no more that nobody pinned).
    std::vector<uint32_t> lease(RegionLayout const& r, uint32_t count);
    /// Commits leased slots holding `lengths[i]` bytes under `keys[i]`; the CRC-32C of each is
    /// computed here from the arena. Per slot: 0 stored, 1 not this client's lease, 2 a bad length.
    /// With `pin`, each stored slot stays pinned for this client (release() it like a get's hit).
    /// `crcs` (one per slot), when given, are the CRC-32C the caller computed already.
    std::vector<uint8_t> commit(RegionLayout const& r, std::vector<uint32_t> const& slots,
        std::vector<std::string_view> const& keys, std::vector<uint32_t> const& lengths, bool ephemeral,
        bool pin = false, uint32_t const* crcs = nullptr);
    void abort(RegionLayout const& r, std::vector<uint32_t> const& slots);
    /// Leases, copies `pages` in and commits them: per page, true when stored.
    std::vector<bool> set(RegionLayout const& r, std::vector<std::string_view> const& keys,
        std::vector<std::pair<void const*, size_t>> const& pages, bool ephemeral);
    /// Where each key's page is (pinned until released), or a miss (slot Found::kMissSlot). Every
    /// answer lies inside the region (a reference outside it raises DaemonRefused).
    std::vector<Found> get(RegionLayout const& r, std::vector<std::string_view> const& keys);
    /// Drops one pin per slot (Found::kMissSlot entries are skipped); no reply is awaited.
    void release(RegionLayout const& r, std::vector<uint32_t> const& slots);
    /// True when the slot still holds what the daemon answered for `key` (header and, with
    /// `checkCrc`, the bytes' CRC-32C).
    bool valid(RegionLayout const& r, std::string_view key, Found const& f, bool checkCrc) const;
    /// Copies each key's page into outs[i] when it is in L2 and valid (checked after the copy, on
    /// the copied bytes); the pins are released before returning.
    std::vector<bool> getInto(
        RegionLayout const& r, std::vector<std::string_view> const& keys, std::vector<OutBuffer> const& outs);
    /// The remote tier's values (its header, then the payload) of `identity` into leased slots,
    /// each payload copied and checksummed in one pass. Per key: 0 stored, 1 no slot (every one
    /// pinned by readers or being written), 2 larger than the region's slots.
    std::vector<uint8_t> putValues(RegionLayout const& r, std::vector<std::string_view> const& keys,
        std::vector<std::pair<void const*, size_t>> const& payloads, IdentityHash const& identity);
    /// The payloads of the remote tier's values stored under `keys` into `outs`, each header
    /// checked (ValueCode otherwise), each payload copied and checksummed in one pass and the slot
    /// confirmed unchanged after the copy. Per key: payload bytes read, or a negative ValueCode.
    std::vector<int64_t> getValues(RegionLayout const& r, std::vector<std::string_view> const& keys,
        std::vector<OutBuffer> const& outs, IdentityHash const& identity);
    /// Asks the daemon to read the keys' long-tier pages into L2 in the background (keys already in
    /// L2 or without a page are skipped); returns how many were queued (0 without a long tier).
    uint32_t prefetch(RegionLayout const& r, std::vector<std::string_view> const& keys);
    /// Removes each key from L2: per key, true when it was stored.
    std::vector<bool> erase(RegionLayout const& r, std::vector<std::string_view> const& keys);
    /// The daemon's counters as a JSON object.
    std::string stats();
    /// Sends one raw request payload and returns the reply's payload (for protocol tests).
    std::string rawCall(std::string const& payload);

    [[nodiscard]] std::shared_ptr<Mapping> arena() const;
    [[nodiscard]] uint32_t clientId() const noexcept
    {
        return clientId_;
    }
    [[nodiscard]] uint64_t socketBytes() const noexcept
    {
        return socketBytes_;
    }
    [[nodiscard]] std::string const& socketPath() const noexcept
    {
        return path_;
    }

private:
    void connect();
    void disconnect() noexcept;
    void sendAll(std::string const& frame);
    std::string call(std::string const& frame); // the reply's payload after an Ok status
    std::string readFrame();
    std::vector<Found> getLocked(RegionLayout const& r, std::vector<std::string_view> const& keys);
    void releaseLocked(RegionLayout const& r, std::vector<uint32_t> const& slots);
    std::vector<uint8_t> commitLocked(RegionLayout const& r, std::vector<uint32_t> const& slots,
        std::vector<std::string_view> const& keys, std::vector<uint32_t> const& lengths, uint8_t flags,
        uint32_t const* crcs = nullptr);
    void abortLocked(RegionLayout const& r, std::vector<uint32_t> const& slots);
    std::vector<uint32_t> leaseLocked(RegionLayout const& r, uint32_t count);
    /// Checked reads (getInto, getValues): looks the keys up and calls `read(i, found)` for each
    /// key found, its slot pinned, then releases the pins; returns what the daemon answered.
    template <class Read>
    std::vector<Found> readPinned(RegionLayout const& r, std::vector<std::string_view> const& keys,
        std::vector<OutBuffer> const& outs, Read&& read);

    std::string path_;
    double timeoutS_;
    int64_t spinNs_;
    mutable std::mutex mutex_;
    int fd_ = -1;
    std::shared_ptr<Mapping> arena_;
    uint32_t clientId_ = 0;
    uint64_t socketBytes_ = 0;
    std::string in_;
};

} // namespace kvcodec::daemon

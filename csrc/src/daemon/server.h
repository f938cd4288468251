// SPDX-License-Identifier: Apache-2.0
//
// The per-host daemon's server: one thread runs an epoll loop over the listening Unix socket and
// the clients' connections and answers each request in arrival order, in microseconds (index
// work only: page bytes move through the shared arena). A client whose connection ends (closed or
// killed) has its pins released and its leases freed at once, so it leaks no slot.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "daemon/l2_index.h"
#include "daemon/long_tier.h"
#include "daemon/wire.h"

namespace kvcodec::daemon {

struct ServerConfig
{
    std::string socketPath;
    uint64_t l2Bytes = 1ULL << 30;
    bool hugepages = true;
    /// Microseconds the loop polls for the next request after a batch before it sleeps.
    double busyPollUs = 0;
    /// The long tier's directory (empty: none): pages committed without `ephemeral` are written
    /// back there, and a lookup that misses L2 reads them back into it (long_tier.h).
    std::string longTierDir;
    /// Bytes of pages at most waiting to be written back (their L2 slots stay pinned meanwhile).
    uint64_t longTierQueueBytes = 256ULL << 20;
};

class Server
{
public:
    /// Creates the arena and listens on the socket (a stale socket file is replaced). Throws
    /// std::invalid_argument for a bad configuration, std::runtime_error naming a failed call.
    explicit Server(ServerConfig config);
    ~Server();
    Server(Server const&) = delete;
    Server& operator=(Server const&) = delete;

    /// Serves until stop(), then closes every connection and removes the socket. Once.
    void serve();
    /// Ends serve() (from any thread or a signal handler; idempotent).
    void stop() noexcept;
    /// The counters as one JSON object (what `kvcodec statctl` prints); safe from any thread.
    [[nodiscard]] std::string statsJson();
    [[nodiscard]] std::shared_ptr<Mapping> const& arena() const noexcept
    {
        return arena_;
    }
    [[nodiscard]] ServerConfig const& config() const noexcept
    {
        return config_;
    }

private:
    struct Client
    {
        int fd = -1;
        uint32_t id = 0;
        uint32_t pid = 0;
        bool hello = false;
        bool writing = false; // registered for EPOLLOUT (replies wait for the socket)
        std::string in, out;
        size_t outSent = 0;
        uint64_t bytesIn = 0, bytesOut = 0;
    };

    void accept();
    void service(Client& c, uint32_t events);
    void handle(Client& c, char const* p, size_t n);
    void refuse(Client& c, std::string const& message);
    void hello(Client& c, uint32_t version, uint32_t pid);
    /// The reply to a request of a region and keys (get, erase): `answer(writer, region, key)`
    /// writes each key's part after the count.
    template <class Answer>
    void perKey(FrameReader& in, std::string& out, Answer&& answer);
    /// A lookup of `key` that missed L2: the page read from the long tier into a new L2 slot and
    /// found there (pinned for `client`), or a miss.
    Found promote(uint32_t client, uint32_t region, std::string_view key);
    /// Queues the write-back of a slot just stored (pinned until written).
    void writeBack(uint32_t region, uint32_t slot, std::string_view key, uint32_t length, uint32_t crc);
    void flush(Client& c);
    void drop(Client& c);
    void shutdown();
    [[nodiscard]] std::string statsLocked() const;

    ServerConfig config_;
    std::shared_ptr<Mapping> arena_;
    L2Index index_;
    std::mutex mutex_; // the index and the clients' counters (statsJson reads them from other threads)
    std::unordered_map<uint32_t, std::unique_ptr<Client>> clients_;
    uint32_t nextClient_ = 1;
    uint64_t closedClients_ = 0, closedBytesIn_ = 0, closedBytesOut_ = 0, refused_ = 0, setRefused_ = 0;
    int listener_ = -1, epoll_ = -1, stopFd_ = -1;
    bool served_ = false, closed_ = false;
    int64_t pollNs_;
    std::chrono::steady_clock::time_point started_;
    uint64_t promotions_ = 0;
    // Last: destroyed first, while the index it releases slots of still exists. Its writer takes
    // `mutex_` to release a written slot.
    std::unique_ptr<LongTier> long_;
};

} // namespace kvcodec::daemon

// SPDX-License-Identifier: Apache-2.0
//
// The per-host daemon's server: one thread runs an epoll loop over the listening Unix socket and
// the clients' connections and answers each request in arrival order, in microseconds (index
// work only: page bytes move through the shared arena). A client whose connection ends (closed or
// killed) has its pins released and its leases freed at once, so it leaks no slot.
//
// With a long tier, file reads never run on that thread: a lookup with keys that missed L2 but
// have a page file is parked (its connection's later requests wait behind it, other clients do
// not) while a promoter thread reads those pages into L2, then answered whole. Prefetches queue
// the same reads without a reply to wait for.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

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
        bool parked = false;  // a lookup waits for the promoter: later requests wait behind it
        std::string in, out;
        size_t outSent = 0;
        uint64_t bytesIn = 0, bytesOut = 0;
    };

    /// Pages of the long tier to read into L2: the keys of a parked lookup (answered whole once
    /// read) or of a prefetch (client 0, no reply).
    struct Promotion
    {
        uint32_t client = 0;
        uint32_t region = 0;
        std::vector<std::string> keys;
        std::vector<uint32_t> missed; ///< Indices of the keys to read.
    };

    void accept();
    void service(Client& c, uint32_t events);
    /// Handles the complete requests buffered from `c` until one parks it; false if `c` is gone.
    bool input(Client& c);
    void handle(Client& c, char const* p, size_t n);
    void refuse(Client& c, std::string const& message);
    void hello(Client& c, uint32_t version, uint32_t pid);
    /// The reply to a request of a region and keys (erase): `answer(writer, region, key)`
    /// writes each key's part after the count.
    template <class Answer>
    void perKey(FrameReader& in, std::string& out, Answer&& answer);
    /// The reply to a lookup: where each key is (pinned for `client`), or a miss.
    void answerGet(uint32_t client, uint32_t region, std::vector<std::string_view> const& keys, std::string& out);
    /// Parks `c`'s lookup when some key missed L2 and has a long-tier page; false to answer now
    /// (always without a long tier).
    bool park(Client& c, uint32_t region, std::vector<std::string_view> const& keys);
    /// Queues the long-tier pages of `keys` that L2 lacks for reading in; how many were queued.
    uint32_t prefetch(FrameReader& in);
    /// The promoter thread: reads queued pages into L2, lookups before prefetches.
    void promoter();
    /// Reads one page from the long tier into a new L2 slot, unless L2 has the key by then or an
    /// erase ran meanwhile (the file read may be older than what the erase removed).
    void promoteOne(uint32_t region, std::string const& key, bool prefetched);
    /// On the serving thread: answers the parked lookups whose pages were read.
    void promoted();
    void stopPromoter() noexcept;
    /// Queues the write-back of a slot just stored (pinned until written).
    void writeBack(uint32_t region, uint32_t slot, std::string_view key, uint32_t length, uint32_t crc);
    void flush(Client& c);
    void drop(Client& c);
    void shutdown();
    [[nodiscard]] std::string statsLocked() const;

    static constexpr uint32_t kLongTierClient = 1; // the long tier's leases and pins (clients': 2 and up)
    /// Keys at most waiting in prefetches (more are dropped, counted).
    static constexpr uint64_t kMaxPrefetchKeys = 1u << 16;

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
    uint64_t promotions_ = 0, erasures_ = 0, parkedLookups_ = 0;
    uint64_t prefetchKeys_ = 0, prefetched_ = 0, prefetchDropped_ = 0;
    // The promoter's queues (under promoteMutex_, taken after mutex_ when both are held).
    std::mutex promoteMutex_;
    std::condition_variable promoteWake_;
    std::deque<Promotion> lookups_, prefetches_;
    std::vector<Promotion> promotedLookups_;
    uint64_t prefetchQueued_ = 0; ///< Keys waiting in prefetches_.
    bool promoteStop_ = false;
    int promoteFd_ = -1; ///< Signals the serving thread that promotedLookups_ has entries.
    std::thread promoterThread_;
    // Last: destroyed first, while the index it releases slots of still exists. Its writer takes
    // `mutex_` to release a written slot.
    std::unique_ptr<LongTier> long_;
};

} // namespace kvcodec::daemon

// SPDX-License-Identifier: Apache-2.0
//
// The daemon's long tier: a directory of page files below L2, written back in the background and
// read back (promoted into L2) when a lookup misses L2. It outlives the daemon: a restarted daemon
// finds every page written back before, while L2 starts empty.
//
// One file per (region identity, page bytes, key), named by a 64-bit hash of the three under a
// folder per identity and page size. A file holds a header (magic, format, page bytes, the
// identity, the key, the page's length and CRC-32C) and the page bytes; it is written under a
// temporary name and renamed, so a crash leaves the old file or the new one, never a torn one.
// Reading checks every header field against what was asked and the bytes against the CRC: a file
// of another identity or key (a hash collision), truncated or damaged is a miss, counted, and
// removed. A write-back reads the page where it lies in L2: the server keeps its slot pinned until
// `done` runs (on the writer thread, after the write). At most a bounded number of bytes wait; a
// page that finds the queue full is not written back (counted) and stays in L2 as before.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace kvcodec::daemon {

struct LongTierCounters
{
    uint64_t queued = 0, written = 0, writtenBytes = 0, dropped = 0, failed = 0, hits = 0, hitBytes = 0, misses = 0,
             corrupt = 0, erased = 0;
};

class LongTier
{
public:
    /// Opens (creating it) the directory `dir`; at most `maxQueuedBytes` of pages wait to be
    /// written. Throws std::invalid_argument for an empty path or a zero queue, and
    /// std::runtime_error naming the directory when it cannot be created or written.
    LongTier(std::string dir, uint64_t maxQueuedBytes);
    /// Writes what is queued, then stops the writer.
    ~LongTier();
    LongTier(LongTier const&) = delete;
    LongTier& operator=(LongTier const&) = delete;

    /// Queues a page for writing back from `bytes`, which stay valid until `done` runs (on the
    /// writer thread, whether the write succeeded, failed or was cancelled by erase()); false
    /// (counted as dropped, `done` not called) when the queue is full.
    bool put(std::string_view identity, uint64_t pageBytes, std::string_view key, void const* bytes, uint32_t length,
        uint32_t crc, std::function<void()> done);
    /// Reads a page written back before into `dst` (room for `pageBytes`); false on a miss or a
    /// damaged file. `length` and `crc` are the page's.
    bool get(std::string_view identity, uint64_t pageBytes, std::string_view key, void* dst, uint32_t& length,
        uint32_t& crc);
    /// True when a page may be read back: queued for writing, or its file exists (a stat, no read).
    /// With `countMiss`, false counts a miss (a lookup the long tier cannot answer).
    [[nodiscard]] bool mayHave(std::string_view identity, uint64_t pageBytes, std::string_view key, bool countMiss);
    /// Removes a page's file; queued writes of it are cancelled.
    void erase(std::string_view identity, uint64_t pageBytes, std::string_view key);

    [[nodiscard]] LongTierCounters counters() const;
    [[nodiscard]] uint64_t queuedBytes() const;
    [[nodiscard]] std::string const& dir() const noexcept
    {
        return dir_;
    }

private:
    struct Job
    {
        std::string path, identity, key;
        uint64_t pageBytes = 0;
        uint32_t crc = 0;
        char const* bytes = nullptr;
        uint32_t length = 0;
        bool cancelled = false;
        std::function<void()> done;
    };

    [[nodiscard]] std::string pathOf(std::string_view identity, uint64_t pageBytes, std::string_view key) const;
    void writer();
    bool write(Job const& job);

    std::string dir_;
    uint64_t maxQueued_;
    mutable std::mutex mutex_;
    std::condition_variable wake_, idle_;
    std::deque<Job> queue_;
    uint64_t queuedBytes_ = 0;
    bool writing_ = false, stop_ = false;
    LongTierCounters counters_;
    std::thread thread_;
};

} // namespace kvcodec::daemon

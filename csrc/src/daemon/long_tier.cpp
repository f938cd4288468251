// SPDX-License-Identifier: Apache-2.0
#include "daemon/long_tier.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/wire.h"
#include "kvcodec/crc32c.h"

namespace kvcodec::daemon {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'L', 'T'};
constexpr uint32_t kFormat = 1;
constexpr size_t kHeaderBytes = 32; // magic, format, page bytes, identity and key lengths, length, crc

uint64_t fnv1a(uint64_t h, void const* data, size_t n) noexcept
{
    auto const* p = static_cast<unsigned char const*>(data);
    for (size_t i = 0; i < n; ++i)
    {
        h = (h ^ p[i]) * 0x100000001B3ULL;
    }
    return h;
}

std::string hex16(uint64_t v)
{
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

// Moves all n bytes with `io` (::read or ::write), resuming after a signal; false on an error
// or an early end of file.
template <class Io, class Ptr>
bool allBytes(Io io, int fd, Ptr p, size_t n) noexcept
{
    while (n > 0)
    {
        ssize_t const r = io(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        p += r;
        n -= size_t(r);
    }
    return true;
}

bool writeAll(int fd, char const* p, size_t n) noexcept
{
    return allBytes(::write, fd, p, n);
}

bool readAll(int fd, char* p, size_t n) noexcept
{
    return allBytes(::read, fd, p, n);
}

bool makeDir(std::string const& path) noexcept
{
    return ::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST;
}

} // namespace

LongTier::LongTier(std::string dir, uint64_t maxQueuedBytes)
    : dir_(std::move(dir))
    , maxQueued_(maxQueuedBytes)
{
    if (dir_.empty())
        throw std::invalid_argument("the long tier's directory is empty");
    if (maxQueued_ == 0)
        throw std::invalid_argument("the long tier's write-back queue must hold some bytes");
    if (!makeDir(dir_) || ::access(dir_.c_str(), W_OK | X_OK) != 0)
        throw std::runtime_error(
            "the long tier's directory " + dir_ + " cannot be created or written: " + std::strerror(errno));
    thread_ = std::thread([this] { writer(); });
}

LongTier::~LongTier()
{
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
}

std::string LongTier::pathOf(std::string_view identity, uint64_t pageBytes, std::string_view key) const
{
    uint64_t const folder = fnv1a(fnv1a(0xCBF29CE484222325ULL, identity.data(), identity.size()), &pageBytes, 8);
    uint64_t const file = fnv1a(fnv1a(folder, "/", 1), key.data(), key.size());
    return dir_ + "/" + hex16(folder) + "/" + hex16(file) + ".page";
}

bool LongTier::put(std::string_view identity, uint64_t pageBytes, std::string_view key, void const* bytes,
    uint32_t length, uint32_t crc, std::function<void()> done)
{
    std::unique_lock lock(mutex_);
    if (queuedBytes_ + length > maxQueued_)
    {
        counters_.dropped += 1;
        return false;
    }
    Job job;
    job.path = pathOf(identity, pageBytes, key);
    job.identity = std::string(identity);
    job.key = std::string(key);
    job.pageBytes = pageBytes;
    job.crc = crc;
    job.bytes = static_cast<char const*>(bytes);
    job.length = length;
    job.done = std::move(done);
    queuedBytes_ += length;
    counters_.queued += 1;
    queue_.push_back(std::move(job));
    lock.unlock();
    wake_.notify_one();
    return true;
}

void LongTier::writer()
{
    std::unique_lock lock(mutex_);
    for (;;)
    {
        wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty())
            return; // stopping, everything written
        Job job = std::move(queue_.front());
        queue_.pop_front();
        writing_ = !job.cancelled;
        lock.unlock();
        bool const ok = !job.cancelled && write(job);
        lock.lock();
        writing_ = false;
        idle_.notify_all();
        lock.unlock();
        if (job.done)
            job.done(); // the server's lock, never this one's: erase() waits on this one under it
        lock.lock();
        // Counted (written, failed) and no longer queued only once done() has run: a write-back
        // counted in the stats no longer pins its L2 slot, and write_back_queue_bytes of 0 says
        // every such pin is released.
        counters_.written += ok ? 1 : 0;
        counters_.writtenBytes += ok ? job.length : 0;
        counters_.failed += ok || job.cancelled ? 0 : 1;
        queuedBytes_ -= job.length;
    }
}

bool LongTier::write(Job const& job)
{
    std::string const folder = job.path.substr(0, job.path.rfind('/'));
    if (!makeDir(folder))
        return false;
    std::vector<char> head(kHeaderBytes + job.identity.size() + job.key.size());
    std::memcpy(head.data(), kMagic, 4);
    storeAt(head.data(), 4, kFormat);
    storeAt(head.data(), 8, job.pageBytes);
    storeAt(head.data(), 16, uint32_t(job.identity.size()));
    storeAt(head.data(), 20, uint32_t(job.key.size()));
    storeAt(head.data(), 24, job.length);
    storeAt(head.data(), 28, job.crc);
    std::memcpy(head.data() + kHeaderBytes, job.identity.data(), job.identity.size());
    std::memcpy(head.data() + kHeaderBytes + job.identity.size(), job.key.data(), job.key.size());
    std::string const tmp = job.path + ".tmp";
    int const fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return false;
    bool ok = writeAll(fd, head.data(), head.size()) && writeAll(fd, job.bytes, job.length);
    ok = ::close(fd) == 0 && ok;
    ok = ok && ::rename(tmp.c_str(), job.path.c_str()) == 0;
    if (!ok)
        ::unlink(tmp.c_str());
    return ok;
}

bool LongTier::get(
    std::string_view identity, uint64_t pageBytes, std::string_view key, void* dst, uint32_t& length, uint32_t& crc)
{
    std::string const path = pathOf(identity, pageBytes, key);
    {
        // A page still waiting to be written is read from its queued copy (the newest one).
        std::lock_guard lock(mutex_);
        for (auto it = queue_.rbegin(); it != queue_.rend(); ++it)
        {
            if (!it->cancelled && it->path == path && it->identity == identity && it->key == key
                && it->pageBytes == pageBytes)
            {
                length = it->length;
                crc = it->crc;
                std::memcpy(dst, it->bytes, length);
                counters_.hits += 1;
                counters_.hitBytes += length;
                return true;
            }
        }
    }
    int const fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
    {
        std::lock_guard lock(mutex_);
        counters_.misses += 1;
        return false;
    }
    char head[kHeaderBytes];
    struct stat st{};
    bool ok = ::fstat(fd, &st) == 0 && readAll(fd, head, kHeaderBytes) && std::memcmp(head, kMagic, 4) == 0
        && loadAt<uint32_t>(head, 4) == kFormat && loadAt<uint64_t>(head, 8) == pageBytes
        && loadAt<uint32_t>(head, 16) == identity.size() && loadAt<uint32_t>(head, 20) == key.size()
        && loadAt<uint32_t>(head, 24) <= pageBytes
        && uint64_t(st.st_size) == kHeaderBytes + identity.size() + key.size() + loadAt<uint32_t>(head, 24);
    if (ok)
    {
        std::string names(identity.size() + key.size(), '\0');
        ok = readAll(fd, names.data(), names.size()) && names.compare(0, identity.size(), identity) == 0
            && names.compare(identity.size(), key.size(), key) == 0;
        length = loadAt<uint32_t>(head, 24);
        crc = loadAt<uint32_t>(head, 28);
        ok = ok && readAll(fd, static_cast<char*>(dst), length) && crc32cFast(dst, length) == crc;
    }
    ::close(fd);
    std::lock_guard lock(mutex_);
    if (!ok)
    {
        // Another page's file (a hash collision), truncated or damaged: never served.
        counters_.corrupt += 1;
        counters_.misses += 1;
        ::unlink(path.c_str());
        return false;
    }
    counters_.hits += 1;
    counters_.hitBytes += length;
    return true;
}

bool LongTier::mayHave(std::string_view identity, uint64_t pageBytes, std::string_view key, bool countMiss)
{
    std::string const path = pathOf(identity, pageBytes, key);
    {
        std::lock_guard lock(mutex_);
        for (Job const& job : queue_)
        {
            if (!job.cancelled && job.path == path)
                return true;
        }
    }
    if (::access(path.c_str(), F_OK) == 0)
        return true;
    if (countMiss)
    {
        std::lock_guard lock(mutex_);
        counters_.misses += 1;
    }
    return false;
}

void LongTier::erase(std::string_view identity, uint64_t pageBytes, std::string_view key)
{
    std::string const path = pathOf(identity, pageBytes, key);
    std::unique_lock lock(mutex_);
    for (Job& job : queue_)
    {
        job.cancelled = job.cancelled || job.path == path; // still released by the writer
    }
    // A write in progress lands first, so the unlink below removes it.
    idle_.wait(lock, [this] { return !writing_; });
    if (::unlink(path.c_str()) == 0)
        counters_.erased += 1;
}

LongTierCounters LongTier::counters() const
{
    std::lock_guard lock(mutex_);
    return counters_;
}

uint64_t LongTier::queuedBytes() const
{
    std::lock_guard lock(mutex_);
    return queuedBytes_;
}

} // namespace kvcodec::daemon

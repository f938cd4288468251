// SPDX-License-Identifier: Apache-2.0
#include "tiers/disk/file_io.h"

#include <cerrno>
#include <chrono>
#include <fcntl.h>
#include <thread>
#include <unistd.h>

namespace kvcodec::disk {
namespace {

template <typename F>
auto retryEintr(F f)
{
    for (;;)
    {
        auto r = f();
        if (r >= 0)
        {
            return r;
        }
        if (errno != EINTR)
        {
            return decltype(r)(-errno);
        }
    }
}

class PosixFileIo : public FileIo
{
public:
    int open(std::string const& path, int flags, mode_t mode) override
    {
        return retryEintr([&] { return ::open(path.c_str(), flags | O_CLOEXEC, mode); });
    }

    int close(int fd) override
    {
        return ::close(fd) == 0 ? 0 : -errno;
    }

    ssize_t pwrite(int fd, void const* buf, size_t bytes, off_t offset) override
    {
        return retryEintr([&] { return ::pwrite(fd, buf, bytes, offset); });
    }

    ssize_t pread(int fd, void* buf, size_t bytes, off_t offset) override
    {
        return retryEintr([&] { return ::pread(fd, buf, bytes, offset); });
    }

    int fdatasync(int fd) override
    {
        return retryEintr([&] { return ::fdatasync(fd); });
    }

    int fallocate(int fd, off_t offset, off_t bytes) override
    {
        return retryEintr([&] { return ::fallocate(fd, 0, offset, bytes); });
    }

    int ftruncate(int fd, off_t bytes) override
    {
        return retryEintr([&] { return ::ftruncate(fd, bytes); });
    }

    bool vectored() const override
    {
        return true;
    }

    ssize_t pwritev(int fd, iovec const* iov, int count, off_t offset) override
    {
        return retryEintr([&] { return ::pwritev(fd, iov, count, offset); });
    }

    ssize_t preadv(int fd, iovec const* iov, int count, off_t offset) override
    {
        return retryEintr([&] { return ::preadv(fd, iov, count, offset); });
    }
};

class FaultyFileIo : public FileIo
{
public:
    explicit FaultyFileIo(std::vector<FaultRule> rules)
        : rules_(std::move(rules))
        , seen_(rules_.size(), 0)
        , fired_(rules_.size(), 0)
    {
    }

    int open(std::string const& path, int flags, mode_t mode) override
    {
        int fd = posix_.open(path, flags, mode);
        if (fd >= 0)
        {
            std::lock_guard<std::mutex> lock(mu_);
            paths_[fd] = path;
        }
        return fd;
    }

    int close(int fd) override
    {
        {
            std::lock_guard<std::mutex> lock(mu_);
            paths_.erase(fd);
        }
        return posix_.close(fd);
    }

    ssize_t pwrite(int fd, void const* buf, size_t bytes, off_t offset) override
    {
        FaultRule const* rule = match("pwrite", fd);
        if (rule == nullptr || !fails(*rule))
        {
            return posix_.pwrite(fd, buf, bytes, offset);
        }
        if (rule->torn && bytes > 1)
        {
            // A torn write: part of the data reaches the file before the failure. Keep the size a
            // multiple of 4 KiB when the buffer is, so O_DIRECT accepts it.
            size_t part = bytes / 2;
            if (bytes % 4096 == 0)
            {
                part = (part / 4096) * 4096;
            }
            if (part > 0)
            {
                posix_.pwrite(fd, buf, part, offset);
            }
        }
        return -rule->error;
    }

    ssize_t pread(int fd, void* buf, size_t bytes, off_t offset) override
    {
        if (FaultRule const* rule = match("pread", fd); rule != nullptr && fails(*rule))
        {
            return -rule->error;
        }
        return posix_.pread(fd, buf, bytes, offset);
    }

    int fdatasync(int fd) override
    {
        if (FaultRule const* rule = match("fdatasync", fd); rule != nullptr && fails(*rule))
        {
            return -rule->error;
        }
        return posix_.fdatasync(fd);
    }

    int fallocate(int fd, off_t offset, off_t bytes) override
    {
        if (FaultRule const* rule = match("fallocate", fd); rule != nullptr && fails(*rule))
        {
            return -rule->error;
        }
        return posix_.fallocate(fd, offset, bytes);
    }

    int ftruncate(int fd, off_t bytes) override
    {
        return posix_.ftruncate(fd, bytes);
    }

private:
    // Applies a matched rule's delay; true when the operation must then fail.
    static bool fails(FaultRule const& r)
    {
        if (r.delayUs != 0)
        {
            std::this_thread::sleep_for(std::chrono::microseconds(r.delayUs));
        }
        return r.error != 0;
    }

    FaultRule const* match(char const* op, int fd)
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = paths_.find(fd);
        std::string const& path = it == paths_.end() ? empty_ : it->second;
        for (size_t i = 0; i < rules_.size(); ++i)
        {
            FaultRule const& r = rules_[i];
            if ((r.op != "any" && r.op != op) || path.find(r.pathContains) == std::string::npos)
            {
                continue;
            }
            if (seen_[i]++ < r.afterOps)
            {
                continue;
            }
            if (r.count != 0 && fired_[i] >= r.count)
            {
                continue;
            }
            ++fired_[i];
            return &r;
        }
        return nullptr;
    }

    PosixFileIo posix_;
    std::vector<FaultRule> rules_;
    std::vector<uint64_t> seen_;
    std::vector<uint64_t> fired_;
    std::mutex mu_;
    std::unordered_map<int, std::string> paths_;
    std::string const empty_;
};

} // namespace

std::shared_ptr<FileIo> posixFileIo()
{
    static std::shared_ptr<FileIo> const instance = std::make_shared<PosixFileIo>();
    return instance;
}

std::shared_ptr<FileIo> faultyFileIo(std::vector<FaultRule> rules)
{
    return std::make_shared<FaultyFileIo>(std::move(rules));
}

namespace {
/// Calls `op(p, bytes, offset)` (pwrite or pread) until all bytes moved: 0, or -errno (-EIO when
/// a call moves nothing).
template <class Byte, class Op>
int transferFully(Byte* p, size_t bytes, off_t offset, Op&& op)
{
    while (bytes > 0)
    {
        ssize_t n = op(p, bytes, offset);
        if (n < 0)
        {
            return int(n);
        }
        if (n == 0)
        {
            return -EIO;
        }
        p += n;
        bytes -= size_t(n);
        offset += n;
    }
    return 0;
}
} // namespace

int writeFully(FileIo& io, int fd, void const* buf, size_t bytes, off_t offset)
{
    return transferFully(static_cast<char const*>(buf), bytes, offset,
        [&](char const* p, size_t n, off_t off) { return io.pwrite(fd, p, n, off); });
}

int readFully(FileIo& io, int fd, void* buf, size_t bytes, off_t offset)
{
    return transferFully(
        static_cast<char*>(buf), bytes, offset, [&](char* p, size_t n, off_t off) { return io.pread(fd, p, n, off); });
}

} // namespace kvcodec::disk

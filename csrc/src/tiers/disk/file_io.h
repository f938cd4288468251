// SPDX-License-Identifier: Apache-2.0
//
// The disk tier's I/O seam: every pwrite/pread/fdatasync/fallocate of the store goes through a
// FileIo, so tests can substitute a faulty implementation (ENOSPC or EIO after N operations, torn
// writes) without touching the store's logic. Calls return -errno on failure, like raw syscalls
// with errno folded in.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cerrno>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvcodec::disk {

class FileIo
{
public:
    virtual ~FileIo() = default;
    /// Returns a file descriptor or -errno.
    virtual int open(std::string const& path, int flags, mode_t mode) = 0;
    virtual int close(int fd) = 0;
    /// Bytes written (possibly short) or -errno.
    virtual ssize_t pwrite(int fd, void const* buf, size_t bytes, off_t offset) = 0;
    /// Bytes read (possibly short) or -errno.
    virtual ssize_t pread(int fd, void* buf, size_t bytes, off_t offset) = 0;
    virtual int fdatasync(int fd) = 0;
    /// Reserves [offset, offset + bytes); -EOPNOTSUPP where the file system cannot.
    virtual int fallocate(int fd, off_t offset, off_t bytes) = 0;
    virtual int ftruncate(int fd, off_t bytes) = 0;
    /// True when pwritev/preadv move several buffers in one call (the store then merges writes or
    /// reads of adjacent slots). Test implementations keep one call per slot, so fault rules
    /// count slots.
    virtual bool vectored() const
    {
        return false;
    }
    /// Bytes written (possibly short) or -errno; only called when vectored().
    virtual ssize_t pwritev(int /*fd*/, iovec const* /*iov*/, int /*count*/, off_t /*offset*/)
    {
        return -EOPNOTSUPP;
    }
    /// Bytes read (possibly short) or -errno; only called when vectored().
    virtual ssize_t preadv(int /*fd*/, iovec const* /*iov*/, int /*count*/, off_t /*offset*/)
    {
        return -EOPNOTSUPP;
    }
};

/// Plain POSIX calls (retrying EINTR).
std::shared_ptr<FileIo> posixFileIo();

/// One injected fault: the `afterOps`-th and later matching operations fail (up to `count` times,
/// 0 = forever). A matching operation is `op` ("pwrite", "pread", "fdatasync", "fallocate" or
/// "any") on a file whose path contains `pathContains` (empty = every file).
struct FaultRule
{
    std::string op;
    std::string pathContains;
    uint64_t afterOps = 0;
    int error = 5;     ///< errno to report (EIO = 5, ENOSPC = 28); 0: none (a delay only).
    bool torn = false; ///< pwrite only: write the first half of the buffer, then report `error`.
    uint64_t count = 0;
    uint32_t delayUs = 0; ///< Sleep this long first; with `error` 0 the operation then runs normally.
};

/// A FileIo over POSIX that applies `rules` (test use only).
std::shared_ptr<FileIo> faultyFileIo(std::vector<FaultRule> rules);

/// Writes all bytes (looping over short writes). Returns 0 or -errno.
int writeFully(FileIo& io, int fd, void const* buf, size_t bytes, off_t offset);
/// Reads exactly `bytes` bytes; a short file reads as -EIO. Returns 0 or -errno.
int readFully(FileIo& io, int fd, void* buf, size_t bytes, off_t offset);

} // namespace kvcodec::disk

// SPDX-License-Identifier: Apache-2.0
//
// Batched file I/O: a worker hands a whole batch of reads and writes to an IoQueue and gets every
// result back at once. The io_uring queue submits the batch with one system call and reaps the
// completions with the same call, so a worker keeps `depth` requests in flight with one thread and
// no system call per page.
//
// The io_uring queue talks to the kernel interface (<linux/io_uring.h>, io_uring_setup/enter)
// directly: it needs no library at build or run time, so every build has it, and where the kernel
// or a sandbox refuses io_uring the store falls back to its thread pool (IoBackend::kAuto).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kvcodec::disk {

/// One request of a batch: a vectored read or write at `offset` of `fd`.
struct IoRequest
{
    int fd = -1;
    bool write = false;
    iovec const* iov = nullptr;
    int iovCount = 0;
    off_t offset = 0;
    ssize_t result = 0; ///< Filled by run(): bytes moved (possibly short) or -errno.
};

class IoQueue
{
public:
    virtual ~IoQueue() = default;
    /// Requests one run() takes at most.
    [[nodiscard]] virtual unsigned depth() const noexcept = 0;
    /// Runs `count` (<= depth()) requests and returns when every one has its result.
    virtual void run(IoRequest* requests, size_t count) noexcept = 0;
};

/// An io_uring queue of `depth` entries (1..4096), or null with `why` set (e.g. "io_uring_setup:
/// Operation not permitted" where a sandbox refuses it, or a kernel without the feature).
std::unique_ptr<IoQueue> makeUringQueue(unsigned depth, std::string& why);

} // namespace kvcodec::disk

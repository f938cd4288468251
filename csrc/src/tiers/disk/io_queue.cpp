// SPDX-License-Identifier: Apache-2.0
#include "tiers/disk/io_queue.h"

#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvcodec::disk {
namespace {

int uringSetup(unsigned entries, io_uring_params* p)
{
    return int(::syscall(__NR_io_uring_setup, entries, p));
}

int uringEnter(int fd, unsigned toSubmit, unsigned minComplete, unsigned flags)
{
    return int(::syscall(__NR_io_uring_enter, fd, toSubmit, minComplete, flags, nullptr, 0));
}

template <typename T>
T loadAcquire(T const* p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

template <typename T>
void storeRelease(T* p, T v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

// One ring, used by one thread at a time (each I/O worker owns its queue). Without SQPOLL the
// kernel reads the submission ring only inside io_uring_enter, so the queue may rewind its tail
// over entries the kernel refused.
class UringQueue final : public IoQueue
{
public:
    UringQueue() = default;
    UringQueue(UringQueue const&) = delete;
    UringQueue& operator=(UringQueue const&) = delete;

    ~UringQueue() override
    {
        if (sqes_ != nullptr)
            ::munmap(sqes_, sqesBytes_);
        if (cqRing_ != nullptr && cqRing_ != sqRing_)
            ::munmap(cqRing_, cqRingBytes_);
        if (sqRing_ != nullptr)
            ::munmap(sqRing_, sqRingBytes_);
        if (fd_ >= 0)
            ::close(fd_);
    }

    bool open(unsigned depth, std::string& why)
    {
        io_uring_params p;
        std::memset(&p, 0, sizeof(p));
        fd_ = uringSetup(depth, &p);
        if (fd_ < 0)
        {
            why = std::string("io_uring_setup: ") + std::strerror(errno);
            return false;
        }
        depth_ = depth;
        sqRingBytes_ = p.sq_off.array + p.sq_entries * sizeof(unsigned);
        cqRingBytes_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
        bool const single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
        if (single)
            sqRingBytes_ = cqRingBytes_ = std::max(sqRingBytes_, cqRingBytes_);
        sqRing_ = map(sqRingBytes_, IORING_OFF_SQ_RING, why);
        if (sqRing_ == nullptr)
            return false;
        cqRing_ = single ? sqRing_ : map(cqRingBytes_, IORING_OFF_CQ_RING, why);
        if (cqRing_ == nullptr)
            return false;
        sqesBytes_ = p.sq_entries * sizeof(io_uring_sqe);
        sqes_ = static_cast<io_uring_sqe*>(map(sqesBytes_, IORING_OFF_SQES, why));
        if (sqes_ == nullptr)
            return false;
        auto* sq = static_cast<char*>(sqRing_);
        auto* cq = static_cast<char*>(cqRing_);
        sqHead_ = reinterpret_cast<unsigned*>(sq + p.sq_off.head);
        sqTail_ = reinterpret_cast<unsigned*>(sq + p.sq_off.tail);
        sqMask_ = *reinterpret_cast<unsigned*>(sq + p.sq_off.ring_mask);
        sqArray_ = reinterpret_cast<unsigned*>(sq + p.sq_off.array);
        cqHead_ = reinterpret_cast<unsigned*>(cq + p.cq_off.head);
        cqTail_ = reinterpret_cast<unsigned*>(cq + p.cq_off.tail);
        cqMask_ = *reinterpret_cast<unsigned*>(cq + p.cq_off.ring_mask);
        cqes_ = reinterpret_cast<io_uring_cqe*>(cq + p.cq_off.cqes);
        return true;
    }

    [[nodiscard]] unsigned depth() const noexcept override
    {
        return depth_;
    }

    void run(IoRequest* requests, size_t count) noexcept override
    {
        if (count == 0)
            return;
        unsigned tail = *sqTail_;
        for (size_t i = 0; i < count; ++i)
        {
            IoRequest& r = requests[i];
            r.result = -EINPROGRESS;
            unsigned const index = tail & sqMask_;
            io_uring_sqe* sqe = &sqes_[index];
            std::memset(sqe, 0, sizeof(*sqe));
            sqe->opcode = r.write ? IORING_OP_WRITEV : IORING_OP_READV;
            sqe->fd = r.fd;
            sqe->off = uint64_t(r.offset);
            sqe->addr = reinterpret_cast<uint64_t>(r.iov);
            sqe->len = unsigned(r.iovCount);
            sqe->user_data = uint64_t(i);
            sqArray_[index] = index;
            ++tail;
        }
        storeRelease(sqTail_, tail);

        size_t submitted = 0;
        size_t completed = 0;
        while (completed < count)
        {
            unsigned const toSubmit = unsigned(count - submitted);
            int const rc = uringEnter(fd_, toSubmit, 1, IORING_ENTER_GETEVENTS);
            if (rc < 0)
            {
                int const err = errno;
                if (err == EINTR || err == EAGAIN || err == EBUSY)
                {
                    reap(requests, completed);
                    continue;
                }
                if (toSubmit > 0)
                {
                    // The kernel refused the rest: take those entries back and fail them.
                    storeRelease(sqTail_, loadAcquire(sqHead_));
                    for (size_t i = submitted; i < count; ++i)
                        requests[i].result = -err;
                    completed += count - submitted;
                    submitted = count;
                    continue;
                }
                // Waiting itself failed: the submitted requests still own their buffers, so keep
                // waiting for them rather than returning early.
                continue;
            }
            submitted += size_t(rc);
            reap(requests, completed);
        }
    }

private:
    void* map(size_t bytes, off_t what, std::string& why)
    {
        void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, what);
        if (p == MAP_FAILED)
        {
            why = std::string("io_uring mmap: ") + std::strerror(errno);
            return nullptr;
        }
        return p;
    }

    void reap(IoRequest* requests, size_t& completed) noexcept
    {
        unsigned head = *cqHead_;
        unsigned const tail = loadAcquire(cqTail_);
        for (; head != tail; ++head)
        {
            io_uring_cqe const& cqe = cqes_[head & cqMask_];
            requests[cqe.user_data].result = cqe.res;
            ++completed;
        }
        storeRelease(cqHead_, head);
    }

    int fd_ = -1;
    unsigned depth_ = 0;
    void* sqRing_ = nullptr;
    void* cqRing_ = nullptr;
    size_t sqRingBytes_ = 0;
    size_t cqRingBytes_ = 0;
    io_uring_sqe* sqes_ = nullptr;
    size_t sqesBytes_ = 0;
    unsigned* sqHead_ = nullptr;
    unsigned* sqTail_ = nullptr;
    unsigned sqMask_ = 0;
    unsigned* sqArray_ = nullptr;
    unsigned* cqHead_ = nullptr;
    unsigned* cqTail_ = nullptr;
    unsigned cqMask_ = 0;
    io_uring_cqe* cqes_ = nullptr;
};

} // namespace

std::unique_ptr<IoQueue> makeUringQueue(unsigned depth, std::string& why)
{
    if (depth == 0 || depth > 4096)
    {
        why = "queue_depth is " + std::to_string(depth) + "; valid: 1..4096";
        return nullptr;
    }
    auto q = std::make_unique<UringQueue>();
    if (!q->open(depth, why))
        return nullptr;
    return q;
}

} // namespace kvcodec::disk

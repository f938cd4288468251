// SPDX-License-Identifier: Apache-2.0
//
// Test helper of the conformance suite: holds a CUDA stream at a wait on a mapped host flag, so a
// test can check that a codec call returns without waiting for earlier work on its stream and
// that nothing it enqueued runs before the stream is released.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <thread>

namespace kvcodec::runtime {

class StreamBlocker
{
public:
    /// Enqueues on `stream` a wait until a mapped pinned host flag becomes 1 (cuStreamWaitValue32).
    /// Throws std::runtime_error naming the failing CUDA call and its error. The stream must stay
    /// alive until the blocker is released.
    explicit StreamBlocker(cudaStream_t stream);

    /// Releases the stream (if still blocked), waits until it has passed the wait and returns the
    /// flag to the pool. Never waits for work enqueued after the wait, and never frees pinned
    /// memory: cudaFreeHost synchronizes the whole device, so a blocker destroyed while another
    /// blocker holds a stream would wait for it forever.
    ~StreamBlocker();

    StreamBlocker(StreamBlocker const&) = delete;
    StreamBlocker& operator=(StreamBlocker const&) = delete;

    /// Writes the flag: work enqueued after the wait may start. Idempotent, from any thread.
    void release() noexcept;

    /// Releases the stream `delayMs` milliseconds from now, from a thread of the blocker's own
    /// (no Python thread, so a caller that waits for the stream while holding the interpreter
    /// lock cannot keep it blocked). At most one per blocker; the destructor joins it.
    void releaseAfter(int delayMs);

    [[nodiscard]] bool released() const noexcept
    {
        return released_.load(std::memory_order_acquire);
    }

    /// Waits (at most `timeoutMs` milliseconds) until the stream has passed the wait; false on
    /// timeout. Only meaningful after release().
    bool waitPassed(int timeoutMs) const;

private:
    cudaStream_t stream_;
    uint32_t* flag_ = nullptr;     // mapped pinned host memory, from a process-wide pool
    cudaEvent_t passed_ = nullptr; // recorded right after the wait
    std::atomic<bool> released_{false};
    std::thread releaser_; // releaseAfter()'s timer
};

} // namespace kvcodec::runtime

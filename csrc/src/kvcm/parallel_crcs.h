// SPDX-License-Identifier: Apache-2.0
//
// CRC-32C passes over many blobs, split over threads (the shared host level's checks and
// publications).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace kvcodec::kvcm::detail {

// crc(i) for i in [0, count), split over one thread per 2^bytesShift bytes of `bytes` (4 MiB by
// default; up to 8 threads, the calling thread one of them); threads that cannot start leave their
// share to the calling thread.
template <class Crc>
void parallelCrcs(size_t count, uint64_t bytes, Crc&& crc, unsigned bytesShift = 22) noexcept
{
    // hardware_concurrency() reads a sysfs file on every call (about 3 us): once per process.
    static unsigned const cpus = std::max(1u, std::thread::hardware_concurrency());
    size_t const threads
        = std::min<size_t>({8, size_t(cpus), std::max<uint64_t>(1, bytes >> bytesShift), std::max<size_t>(count, 1)});
    auto share = [&](size_t first) {
        for (size_t i = first; i < count; i += threads)
        {
            crc(i);
        }
    };
    std::vector<std::thread> helpers;
    size_t started = 0;
    try
    {
        helpers.reserve(threads);
        for (; started + 1 < threads; ++started)
        {
            helpers.emplace_back(share, started + 1);
        }
    }
    catch (...)
    {
        // Fewer threads.
    }
    share(0);
    for (size_t t = started + 1; t < threads; ++t)
    {
        share(t);
    }
    for (std::thread& h : helpers)
    {
        h.join();
    }
}

} // namespace kvcodec::kvcm::detail

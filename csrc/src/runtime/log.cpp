// SPDX-License-Identifier: Apache-2.0
#include "runtime/log.h"

#include <cstdio>
#include <memory>
#include <mutex>

namespace kvcodec::log {
namespace {

std::mutex& sinkMutex()
{
    static std::mutex mu;
    return mu;
}

std::shared_ptr<Sink const>& sinkSlot()
{
    static std::shared_ptr<Sink const> sink;
    return sink;
}

} // namespace

void setSink(Sink sink)
{
    auto next = sink ? std::make_shared<Sink const>(std::move(sink)) : nullptr;
    std::lock_guard<std::mutex> lock(sinkMutex());
    sinkSlot().swap(next);
}

void writeStderr(Level level, std::string const& message) noexcept
{
    char const* prefix = level >= Level::kError ? "error: " : level >= Level::kWarning ? "warning: " : "";
    std::fprintf(stderr, "kvcodec: %s%s\n", prefix, message.c_str());
}

void write(Level level, std::string const& message) noexcept
{
    std::shared_ptr<Sink const> sink;
    {
        std::lock_guard<std::mutex> lock(sinkMutex());
        sink = sinkSlot();
    }
    if (sink)
    {
        try
        {
            (*sink)(level, message);
            return;
        }
        catch (...)
        {
            // Fall through: the message is not lost.
        }
    }
    writeStderr(level, message);
}

} // namespace kvcodec::log

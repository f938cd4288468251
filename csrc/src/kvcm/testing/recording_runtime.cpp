// SPDX-License-Identifier: Apache-2.0
#include "kvcm/testing/recording_runtime.h"

namespace kvcodec::kvcm::testing {
namespace {

class RecordingEvent final : public runtime::Event
{
public:
    RecordingEvent(int64_t id, runtime::Stream stream, std::shared_ptr<std::vector<RuntimeOp>> log)
        : id_(id)
        , stream_(stream)
        , log_(std::move(log))
    {
    }

    void synchronize() override
    {
        log_->push_back({"sync_event", id_, reinterpret_cast<uintptr_t>(stream_)});
    }

    void waitOn(runtime::Stream stream) override
    {
        log_->push_back({"wait", id_, reinterpret_cast<uintptr_t>(stream)});
    }

    [[nodiscard]] runtime::Stream stream() const noexcept override
    {
        return stream_;
    }

    int64_t id_;

private:
    runtime::Stream stream_;
    std::shared_ptr<std::vector<RuntimeOp>> log_;
};

} // namespace

runtime::EventPtr RecordingRuntime::record(runtime::Stream stream)
{
    int64_t const id = next_++;
    log->push_back({"record", id, reinterpret_cast<uintptr_t>(stream)});
    return std::make_shared<RecordingEvent>(id, stream, log);
}

void RecordingRuntime::synchronize(runtime::Stream stream)
{
    log->push_back({"sync_stream", 0, reinterpret_cast<uintptr_t>(stream)});
}

int64_t eventId(runtime::Event const* event) noexcept
{
    auto const* e = dynamic_cast<RecordingEvent const*>(event);
    return e ? e->id_ : 0;
}

} // namespace kvcodec::kvcm::testing

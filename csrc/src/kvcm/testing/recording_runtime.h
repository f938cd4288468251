// SPDX-License-Identifier: Apache-2.0
//
// A host runtime whose streams are plain numbers and whose events are real objects that log
// every operation on them: record, host synchronize, stream wait. Staging tests check the
// ownership transitions and event inheritance against this log.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/host_runtime.h"

namespace kvcodec::kvcm::testing {

struct RuntimeOp
{
    std::string op;   ///< "record", "sync_event", "wait", "sync_stream"
    int64_t event;    ///< Event id (0 for sync_stream)
    uintptr_t stream; ///< Stream involved (the recording stream for record/sync_event)
};

/// The id of a RecordingRuntime event (0 for anything else).
int64_t eventId(runtime::Event const* event) noexcept;

class RecordingRuntime final : public runtime::HostRuntime
{
public:
    runtime::EventPtr record(runtime::Stream stream) override;
    void synchronize(runtime::Stream stream) override;

    std::shared_ptr<std::vector<RuntimeOp>> log = std::make_shared<std::vector<RuntimeOp>>();

private:
    int64_t next_ = 1;
};

} // namespace kvcodec::kvcm::testing

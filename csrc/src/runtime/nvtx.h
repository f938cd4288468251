// SPDX-License-Identifier: Apache-2.0
//
// NVTX ranges of the core, in the "kvcodec" domain, for Nsight Systems (nsys profile -t nvtx):
// "kvcodec migrate" around each migrate() call, "kvcodec <src>-><dst>" around each transfer and
// "kvcodec encode" / "kvcodec decode" around each codec call; the payload is the page count.
// Header-only NVTX3: without a tool attached every call returns at once (no strings are built).
#pragma once

#include <nvtx3/nvToolsExt.h>

#include <cstdint>

namespace kvcodec::nvtx {

inline nvtxDomainHandle_t domain() noexcept
{
    static nvtxDomainHandle_t const d = nvtxDomainCreateA("kvcodec");
    return d;
}

/// One range on the calling thread, from construction to destruction.
class Range
{
public:
    Range(char const* name, uint64_t pages) noexcept
    {
        nvtxEventAttributes_t a{};
        a.version = NVTX_VERSION;
        a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
        a.messageType = NVTX_MESSAGE_TYPE_ASCII;
        a.message.ascii = name;
        a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
        a.payload.ullValue = pages;
        nvtxDomainRangePushEx(domain(), &a);
    }
    ~Range()
    {
        nvtxDomainRangePop(domain());
    }
    Range(Range const&) = delete;
    Range& operator=(Range const&) = delete;
};

} // namespace kvcodec::nvtx

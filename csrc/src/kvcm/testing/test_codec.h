// SPDX-License-Identifier: Apache-2.0
//
// A CPU codec with knobs, for the manager's tests: per-lifecycle cold-page padding, batching
// representatives and page-index locations, an optional cold-page envelope, deliberately wrong
// answers for each construction-time validation, and injected submission failures. Blobs are
// the concatenated hot slots XORed with a key derived from the batching class, so a decode
// under the wrong lifecycle interpretation cannot pass a byte-exact check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvcodec/plugin.h"

namespace kvcodec::kvcm::testing {

/// Factory of the test codec ("kvcm-test", format 1, CPU only). Parameters (flat JSON):
///   pad          "lc:bytes,..."   extra cold bytes per lifecycle (default 0)
///   batching     "lc:rep,..."     batching representative overrides (default: itself)
///   location     "lc:host|device|bad,..."
///   zero_size    "lc,..."         queryColdPageBytes returns 0
///   envelope     bool             blobs start with the cold-page envelope
///   did_not_fit_marker  int       pages whose first byte equals it encode as did-not-fit (-1: off)
///   reject_configure    bool
///   checked_decode      bool      implements decodeChecked() (envelope and index checks per page)
/// `abiVersion` 1 gives the same codec under a factory that declares plugin ABI 1.
KvcodecCodecFactory const* testCodecFactory(uint32_t abiVersion = KVCODEC_PLUGIN_ABI_VERSION) noexcept;

/// The next `after` encode/decode calls (of any test codec) succeed, the following one fails;
/// -1 disables injection.
void failCodecCallsAfter(int64_t after) noexcept;

/// Every later encode call (of any test codec) sleeps `us` microseconds first; 0 disables.
void holdEncodes(int64_t us) noexcept;

/// Every later decode call (of any test codec) sleeps `us` microseconds first; 0 disables.
void holdDecodes(int64_t us) noexcept;

struct CodecCall
{
    bool encode;
    int32_t lifeCycle;
    uint64_t pages;
    uintptr_t indices;
    int64_t thread;  ///< The OS thread id of the thread that made the call.
    bool overlapped; ///< Another test-codec call was running when this one began.
};

/// Every encode/decode call made so far (cleared by clearCodecCalls()).
std::vector<CodecCall> codecCalls();
void clearCodecCalls();

} // namespace kvcodec::kvcm::testing

// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>

#include "kvcodec/codec.h"
#include "kvcodec/plugin.h"

namespace kvcodec::concat {

/// Blob format version of the concat codec (pinned by tests/vectors).
inline constexpr uint32_t kConcatFormatVersion = 1;

/// The built-in concat codec's factory, registered like any plugin's.
KvcodecCodecFactory const* concatCodecFactory() noexcept;

/// The default lossless codec for `device` (KVCODEC_DEVICE_CPU or a CUDA ordinal). Throws
/// std::runtime_error with the reason on failure.
std::unique_ptr<IKvCacheColdPageCodec> createDefaultKvCacheColdPageCodec(int32_t device);

} // namespace kvcodec::concat

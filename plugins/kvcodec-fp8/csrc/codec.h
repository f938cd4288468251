// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "kvcodec/plugin.h"

namespace kvcodec::fp8 {

/// The fp8 codec's factory (ABI KVCODEC_PLUGIN_ABI_VERSION, format kFormatVersion).
KvcodecCodecFactory const* fp8CodecFactory() noexcept;

} // namespace kvcodec::fp8

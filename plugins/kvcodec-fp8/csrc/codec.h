// SPDX-License-Identifier: Apache-2.0
//
// The fp8 codec: its parameters and its factory. Blob format 1 and the scalar arithmetic both
// implementations share are in format.h, the per-lifecycle blob plan in plan.h, the CUDA
// kernels in kernel.h, the CPU kernels in cpu.h.
#pragma once

#include <cstdint>
#include <set>

#include <kvcodec/params.h>
#include <kvcodec/plugin.h>
#include <kvcodec/quantization.h>

#include "format.h"
#include "kernel.h"

namespace kvcodec::fp8 {

/// The codec parameters. Types, defaults, choices and documentation have one source: the
/// Python spec (kvcodec_fp8/plugin.py), which validates user input and sends every parameter.
struct Fp8Params : LosslessPolicy
{
    Format format = Format::kE4M3;
    Granularity granularity = Granularity::kPageHead;
    // Tuning knobs of the CUDA kernel: they never change a blob byte.
    bool autoKernel = true;             ///< kernel=auto: per call, `kernel` or the tile variant (docs/fp8.md).
    uint32_t kernel = kAutoBaseVariant; ///< Index into kKernelVariants (auto: its non-tile kernel).
    bool deepSmallBlocks = true;        ///< small_blocks=deep: several rounds of small blocks per warp unit.
    bool blockFinite = true;            ///< finite_check=block.

    /// Reads the values plugin.py validated (a native caller gets the same refusals: every
    /// message names the parameter, its value and what is valid).
    void read(ParamReader& r);
};

/// The fp8 codec's factory (ABI KVCODEC_PLUGIN_ABI_VERSION, format kFormatVersion).
KvcodecCodecFactory const* codecFactory() noexcept;

} // namespace kvcodec::fp8

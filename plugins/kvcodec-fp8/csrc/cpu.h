// SPDX-License-Identifier: Apache-2.0
//
// The CPU implementation of blob format 1 (format.h). It performs the same IEEE operations
// as the scalar functions of format.h, element for element, written so that the compiler
// vectorizes them: every element computes both ranges of a conversion and selects one instead
// of branching. Each kernel is compiled for the build's baseline instruction set (SSE2 on
// x86-64, or whatever the target's baseline is) and, on x86-64, for AVX2 and for AVX-512 (F, BW,
// VL, DQ; 512-bit vectors); the best variant the CPU has is picked at run time. All write the
// same bytes (IEEE arithmetic on every path; built with -ffp-contract=off, so no FMA contraction).
#pragma once

#include <cstdint>

#include "format.h"
#include "kernel.h"
#include "kvcodec/fp_environment.h"

namespace kvcodec::fp8::cpu {

/// Instruction sets the CPU kernels are compiled for.
enum class Simd : uint32_t
{
    kPortable = 0, ///< The build's baseline (SSE2 on x86-64); runs everywhere.
    kAvx2 = 1,     ///< x86-64 with AVX2 (dispatched at run time).
    kAvx512 = 2,   ///< x86-64 with AVX-512 F, BW, VL and DQ (dispatched at run time).
};
inline constexpr uint32_t kNumSimd = 3;

char const* simdName(Simd simd) noexcept;

/// True when this build has the variant and this CPU can run it.
bool simdSupported(Simd simd) noexcept;

/// The variant CPU codecs use: the best supported one, unless overridden.
Simd activeSimd() noexcept;

/// Makes CPU codecs use `simd` (when supported; returns false otherwise), or the best supported
/// variant again with nullptr. For tests and comparisons: the blobs never depend on it.
bool overrideSimd(Simd const* simd) noexcept;

/// True while overrideSimd() holds a variant; `*simd` receives it.
bool simdOverride(Simd* simd) noexcept;

/// The scope the CPU path's IEEE arithmetic needs (kvcodec/fp_environment.h): the codec's calls
/// run inside one (CodecBase), the test hooks hold their own.
using IeeeScope = kvcodec::IeeeScope;

/// One buffer of one page, hot -> blob (`cold` is the blob's start) and back. Callers hold an
/// IeeeScope.
void encodeBuffer(BufferPlan const& b, char const* hot, char* cold, Format f, Simd simd) noexcept;
void decodeBuffer(BufferPlan const& b, char* hot, char const* cold, Format f, Simd simd) noexcept;

// The kernels' building blocks on `n` contiguous elements of a quantized dtype (bf16, fp16,
// fp32), for tests. Callers hold an IeeeScope; the hot bytes may have any alignment.

/// Largest |x| over the finite elements (0 if none), as fp32.
float finiteAmax(char const* hot, uint64_t n, uint32_t dtype, Simd simd) noexcept;

/// codes[i] = the code of hot element i under a block reciprocal `reciprocal` (> 0).
void quantizeRow(
    char const* hot, uint64_t n, uint32_t dtype, Format f, float reciprocal, uint8_t* codes, Simd simd) noexcept;

/// Hot element i = the decoded value of codes[i] under the block scale `scale`.
void dequantizeRow(
    uint8_t const* codes, uint64_t n, uint32_t dtype, Format f, float scale, char* hot, Simd simd) noexcept;

} // namespace kvcodec::fp8::cpu

// SPDX-License-Identifier: Apache-2.0
//
// LZ4 block compression and bounds-checked decompression for the CPU reference, through the LZ4
// reference library (lz4_block.cpp). The block format is the standard one (sequences of token,
// literals, 16-bit offset, match length), the same that nvCOMP's batched LZ4 API produces and
// consumes, so chunks cross between the two.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcodec::nvcomp_plugin::lz4 {

/// Largest block `compress` may produce for `bytes` of input.
constexpr size_t compressBound(size_t bytes) noexcept
{
    return bytes + bytes / 255 + 16;
}

/// Compresses `src` into `dst` (capacity `cap`). Returns the block size, or 0 when it does not
/// fit `cap`.
size_t compress(uint8_t const* src, size_t bytes, uint8_t* dst, size_t cap) noexcept;

/// Decodes a block of `bytes` into `dst` (capacity `cap`). Returns the decoded size, or -1 for a
/// malformed block or one that decodes to more than `cap` bytes. Never reads or writes out of
/// bounds.
int64_t decompress(uint8_t const* src, size_t bytes, uint8_t* dst, size_t cap) noexcept;

} // namespace kvcodec::nvcomp_plugin::lz4

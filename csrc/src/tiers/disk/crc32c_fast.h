// SPDX-License-Identifier: Apache-2.0
//
// Fast CRC-32C for the disk tier's per-slot checksums. Same function as kvcodec::crc32c in
// codec.h (Castagnoli, reflected, initial and final XOR 0xFFFFFFFF, chainable through `crc`),
// which is a bitwise reference far too slow for GB/s of slot traffic.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcodec::disk {

/// CRC-32C with the SSE4.2 instruction when the CPU has it (checked once at run time), else
/// slicing-by-8 tables.
uint32_t crc32cFast(void const* data, size_t bytes, uint32_t crc = 0) noexcept;

/// Portable slicing-by-8 implementation (always available; tested against the reference).
uint32_t crc32cSlicing8(void const* data, size_t bytes, uint32_t crc = 0) noexcept;

/// SSE4.2 implementation; only valid when crc32cHardwareAvailable() is true.
uint32_t crc32cHardware(void const* data, size_t bytes, uint32_t crc = 0) noexcept;

/// True when this CPU executes the SSE4.2 crc32 instruction.
bool crc32cHardwareAvailable() noexcept;

} // namespace kvcodec::disk

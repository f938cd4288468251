// SPDX-License-Identifier: Apache-2.0
//
// The remote tier's value header, read and written natively: for the daemon backend's batches, and
// for every other backend's through unpackValues() and packValueHeaders()
// (kvcodec_sdk/remote/backend.py defines the format and documents it; the two must agree, and
// the remote tier's contract tests read values each side wrote with the other).
//
//   offset size field
//    0      4   magic            "KVRB"
//    4      2   format version   1
//    6      2   header bytes     48
//    8      4   flags            0
//   12      4   key CRC-32C      of the content key the value was stored under
//   16      8   payload length
//   24      4   payload CRC-32C
//   28     16   identity hash    of the codec identity
//   44      4   header CRC-32C   of bytes 0..43
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace kvcodec::daemon {

inline constexpr size_t kValueHeaderBytes = 48;
using IdentityHash = std::array<uint8_t, 16>;

/// Per-key codes of a value read (the remote tier's GET_* codes); a non-negative code is the
/// payload bytes read.
enum ValueCode : int64_t
{
    kValueMiss = -1,
    kValueMismatch = -2,
    kValueCorrupt = -3,
    kValueTooSmall = -4,
};

/// Writes the header of a payload of `payloadBytes` whose CRC-32C is `payloadCrc`, stored under
/// `key` by `identity`, at `out` (kValueHeaderBytes bytes).
void packValueHeader(uint8_t* out, std::string_view key, uint64_t payloadBytes, uint32_t payloadCrc,
    IdentityHash const& identity) noexcept;

/// Checks the header of a stored value of `storedBytes` read under `key`: the payload's length
/// (and its CRC-32C into `payloadCrc`), or kValueCorrupt (bad magic, version, size, checksum or
/// key) or kValueMismatch (another codec identity).
int64_t checkValueHeader(uint8_t const* value, uint64_t storedBytes, std::string_view key, IdentityHash const& identity,
    uint32_t* payloadCrc) noexcept;

/// A destination of a checked read: `bytes` writable bytes at `data`.
struct OutBuffer
{
    void* data;
    size_t bytes;
};

/// Checks each value read under keys[i] (`stored[i]`: header and payload as stored, empty where
/// the store has none) and copies its payload into outs[i]: per key the payload's bytes, or
/// kValueMiss (empty), checkValueHeader()'s codes, kValueTooSmall (outs[i] is smaller than the
/// payload) or kValueCorrupt (the payload's CRC-32C fails; outs[i] then holds the refused bytes).
/// The values are split over threads by their bytes (one per MiB, at most 8). The three vectors
/// have one entry per key.
std::vector<int64_t> unpackValues(std::vector<std::string_view> const& keys,
    std::vector<std::pair<void const*, size_t>> const& stored, std::vector<OutBuffer> const& outs,
    IdentityHash const& identity);

/// packValueHeader() of each payloads[i] stored under keys[i], at headers + i * kValueHeaderBytes;
/// the payloads' CRC-32C split over threads by their bytes (one per MiB, at most 8).
void packValueHeaders(std::vector<std::string_view> const& keys,
    std::vector<std::pair<void const*, size_t>> const& payloads, IdentityHash const& identity,
    uint8_t* headers) noexcept;

} // namespace kvcodec::daemon

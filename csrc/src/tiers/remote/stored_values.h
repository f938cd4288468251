// SPDX-License-Identifier: Apache-2.0
//
// The remote cold tier's stored values (their header: kvcodec_sdk/remote/backend.py): building the
// headers of a batch of values to store, and checking a batch of values that landed in a backend's
// staging memory and copying their payloads out, off the interpreter's lock and over several
// threads for large batches. The checks are ValueHeader.check()'s (backend.py), then the payload's
// CRC-32C; tests/remote/test_remote_values.py compares both functions with the Python header code
// value by value.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvcodec::remote {

inline constexpr size_t kHeaderBytes = 48;
inline constexpr size_t kIdentityBytes = 16;
using Identity = std::array<unsigned char, kIdentityBytes>;

// Per-value outcomes: backend.py's GET_* codes.
inline constexpr int64_t kGetMiss = -1;
inline constexpr int64_t kGetMismatch = -2;
inline constexpr int64_t kGetCorrupt = -3;
inline constexpr int64_t kGetTooSmall = -4;

/// One value read from the store into staging memory, and where its payload goes.
struct LandedValue
{
    std::string_view key;        ///< The content key it was read under.
    unsigned char const* stored; ///< The whole value as stored: header, then payload.
    uint64_t storedBytes;        ///< Its size as the store reported it (0: the store has none).
    unsigned char* out;          ///< The caller's buffer for the payload.
    uint64_t outBytes;           ///< That buffer's size.
};

/// Checks one value and copies its payload into `out`: the payload's size, or kGetMiss (no value),
/// kGetCorrupt (bad magic, version, header size, header checksum, length, key checksum or payload
/// checksum), kGetMismatch (another codec identity's value) or kGetTooSmall (`out` is smaller than
/// the payload). After kGetCorrupt for the payload's checksum, `out` holds the refused bytes.
int64_t unpackValue(LandedValue const& v, Identity const& identity) noexcept;

/// unpackValue() of values[0, count) into results[0, count): the values split over threads by
/// their bytes (one per MiB, at most 8, the calling thread one of them).
void unpackValues(LandedValue const* values, size_t count, Identity const& identity, int64_t* results) noexcept;

/// One value to store: its key and payload (the header is built for them).
struct ValueToStore
{
    std::string_view key;
    unsigned char const* payload;
    uint64_t payloadBytes;
};

/// Writes the kHeaderBytes-byte header of values[i] (the payload's and the key's CRC-32C, its
/// length and `identity`) at headers + i * kHeaderBytes, for i in [0, count): the payloads'
/// checksums split over threads by their bytes (one per MiB, at most 8).
void packHeaders(ValueToStore const* values, size_t count, Identity const& identity, unsigned char* headers) noexcept;

} // namespace kvcodec::remote

// SPDX-License-Identifier: Apache-2.0
//
// The daemon's wire protocol (version 2): length-prefixed binary frames on a Unix stream socket.
//
// A frame is a u32 little-endian payload length, then the payload. A request's payload starts with
// its op (u8); every request but `release` gets one reply, whose payload starts with a status (u8:
// 0 done, then the values; 1 refused, then a UTF-8 message). Integers are little-endian; a list is
// a u32 count then its items. Page bytes never cross the socket: they live in the shared arena,
// whose descriptor the daemon passes once, with the `hello` reply (SCM_RIGHTS).
//
//   op  name     arguments                                      reply values
//   1   hello    u32 version, u32 pid                           u32 version, u64 arena bytes, u32 client id,
//                                                               u8 huge pages (and the arena descriptor)
//   2   region   u64 page bytes, u32 slots wanted, str identity u32 region, u64 table, u64 data, u64 stride,
//                [u8 flags] (page bytes and slots 0: find,      u32 slots, u64 page bytes
//                never create; flags bit 0 "packed": a new region's stride is the page bytes, not
//                rounded up to 4 KiB, so slot s lies at data + s * page bytes)
//   3   lease    u32 region, u32 count                          u32 n, n x u32 slot, n x u64 version (odd)
//   4   commit   u32 region, u8 flags, u32 n,                   u32 n, n x u8 status (0 stored, 1 not this
//                n x {u32 slot, u32 length, u32 crc}, n x str   client's lease, 2 a bad length)
//                (flags bit 0: ephemeral; bit 1: keep each stored slot pinned for this client, as a get
//                would, so the writer goes on reading it until it releases it)
//   5   abort    u32 region, u32 n, n x u32 slot                (none)
//   6   get      u32 region, u32 n, n x str key                 u32 n, n x {u32 slot (~0: a miss), u32 length,
//                                                               u32 crc, u32 zero, u64 version}; hits pinned
//   7   release  u32 region, u32 n, n x u32 slot (no reply)     -
//   8   stats    -                                              str: a JSON object of counters
//   9   erase    u32 region, u32 n, n x str key                 u32 n, n x u8 (1: the key was stored; its slot
//                                                               is freed, or at its last unpin)
//
// A str is a u32 byte count then the bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kvcodec::daemon {

inline constexpr uint32_t kProtocolVersion = 2;
/// The largest frame either side accepts (a batch of many thousand keys fits).
inline constexpr uint32_t kMaxFrame = 16u << 20;
inline constexpr uint32_t kMiss = ~0u;
/// Region flags.
inline constexpr uint8_t kRegionPacked = 1;
/// Commit flags.
inline constexpr uint8_t kCommitEphemeral = 1;
inline constexpr uint8_t kCommitPin = 2;

/// A T written at byte `at` of `out` (no alignment needed; the host's byte order, little endian
/// on every supported host): the fixed headers of values and page files.
template <class T>
void storeAt(void* out, size_t at, T v) noexcept
{
    std::memcpy(static_cast<char*>(out) + at, &v, sizeof v);
}

/// The T at byte `at` of `in`.
template <class T>
T loadAt(void const* in, size_t at) noexcept
{
    T v;
    std::memcpy(&v, static_cast<char const*>(in) + at, sizeof v);
    return v;
}

enum class Op : uint8_t
{
    Hello = 1,
    Region = 2,
    Lease = 3,
    Commit = 4,
    Abort = 5,
    Get = 6,
    Release = 7,
    Stats = 8,
    Erase = 9,
    Prefetch = 10,
};

enum class Status : uint8_t
{
    Ok = 0,
    Refused = 1,
};

/// A request or reply that does not follow the protocol.
class ProtocolError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

/// Appends a frame's fields; `finish()` fills in the length prefix.
class FrameWriter
{
public:
    explicit FrameWriter(std::string& out)
        : out_(out)
        , start_(out.size())
    {
        out_.append(4, '\0');
    }
    template <class T>
    FrameWriter& put(T v)
    {
        char b[sizeof(T)];
        std::memcpy(b, &v, sizeof(T));
        out_.append(b, sizeof(T));
        return *this;
    }
    FrameWriter& str(std::string_view s)
    {
        put(uint32_t(s.size()));
        out_.append(s.data(), s.size());
        return *this;
    }
    /// Room for `n` bytes written later through the returned offset.
    size_t reserve(size_t n)
    {
        size_t const at = out_.size();
        out_.append(n, '\0');
        return at;
    }
    void finish()
    {
        uint32_t const n = uint32_t(out_.size() - start_ - 4);
        std::memcpy(out_.data() + start_, &n, 4);
    }

private:
    std::string& out_;
    size_t start_;
};

/// Reads a frame's fields, refusing a read past its end.
class FrameReader
{
public:
    FrameReader(char const* p, size_t n)
        : p_(p)
        , end_(p + n)
    {
    }
    template <class T>
    T get()
    {
        need(sizeof(T));
        T v;
        std::memcpy(&v, p_, sizeof(T));
        p_ += sizeof(T);
        return v;
    }
    std::string_view str()
    {
        uint32_t const n = get<uint32_t>();
        need(n);
        std::string_view s(p_, n);
        p_ += n;
        return s;
    }
    /// `n` items of `itemBytes` each, checked against what is left before anything is allocated.
    uint32_t count(size_t itemBytes)
    {
        uint32_t const n = get<uint32_t>();
        if (itemBytes && uint64_t(n) * itemBytes > uint64_t(end_ - p_))
            throw ProtocolError("a list of " + std::to_string(n) + " items is longer than its frame");
        return n;
    }
    [[nodiscard]] size_t left() const noexcept
    {
        return size_t(end_ - p_);
    }

private:
    void need(size_t n) const
    {
        if (size_t(end_ - p_) < n)
            throw ProtocolError("a frame ends in the middle of a field");
    }
    char const* p_;
    char const* end_;
};

} // namespace kvcodec::daemon

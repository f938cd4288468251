// SPDX-License-Identifier: Apache-2.0
//
// The daemon's L2 arena: one memfd-backed shared memory file that the daemon and every client map.
//
// The arena is cut into regions, one per (codec identity, page bytes). A region is a table of
// 64-byte slot headers followed by the slots' data, each slot page-aligned (a client can register
// the arena with CUDA as pinned memory and copy from it directly). The daemon alone writes
// headers; a client writes only the data of slots leased to it and reads slots it was told about.
//
// A slot header (64 bytes, little-endian):
//     u64 version   even: stable; odd: being written (a lease); bumped on every reuse
//     u64 length    bytes of data stored
//     u32 crc       CRC-32C of those bytes
//     u32 region    the region id (a reference into another region is refused)
//     u8[16] key    128-bit digest of the content key stored (keyDigest)
//     u8[24]        reserved (zero)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace kvcodec::daemon {

inline constexpr uint64_t kHeaderBytes = 64;
inline constexpr uint64_t kArenaPage = 4096;

using KeyDigest = std::array<uint8_t, 16>;

/// The 128-bit digest of a content key kept in its slot's header (it tells a reader that the slot
/// still holds the key it asked for; it is not a cryptographic hash).
KeyDigest keyDigest(std::string_view key) noexcept;

struct SlotHeader
{
    uint64_t version;
    uint64_t length;
    uint32_t crc;
    uint32_t region;
    KeyDigest key;
    uint8_t reserved[24];
};
static_assert(sizeof(SlotHeader) == kHeaderBytes);

/// Where a region lies in the arena.
struct RegionLayout
{
    uint32_t region = 0;
    uint64_t table = 0;  ///< offset of the header table
    uint64_t data = 0;   ///< offset of slot 0's data (page-aligned)
    uint64_t stride = 0; ///< bytes between slots' data (page bytes, rounded up to 4 KiB unless packed)
    uint32_t slots = 0;
    uint64_t pageBytes = 0;

    [[nodiscard]] uint64_t end() const noexcept
    {
        return data + uint64_t(slots) * stride;
    }
    [[nodiscard]] uint64_t headerOffset(uint32_t slot) const noexcept
    {
        return table + uint64_t(slot) * kHeaderBytes;
    }
    [[nodiscard]] uint64_t dataOffset(uint32_t slot) const noexcept
    {
        return data + uint64_t(slot) * stride;
    }
    /// Arena bytes a region of `slots` slots `stride` bytes apart takes.
    [[nodiscard]] static uint64_t bytesFor(uint64_t stride, uint64_t slots) noexcept;
};

/// A shared memory file mapped read-write; unmapped (and its descriptor closed) when the last
/// holder lets go, so views handed out keep the mapping alive.
class Mapping
{
public:
    /// A new arena of at least `bytes`: huge pages where the system has them reserved and
    /// `hugepages` is set, else ordinary pages. Throws std::runtime_error naming the failed call.
    static std::shared_ptr<Mapping> create(uint64_t bytes, bool hugepages);
    /// Maps `fd` (owned from now on) of `bytes`, received from the daemon.
    static std::shared_ptr<Mapping> attach(int fd, uint64_t bytes);
    ~Mapping();
    Mapping(Mapping const&) = delete;
    Mapping& operator=(Mapping const&) = delete;

    [[nodiscard]] int fd() const noexcept
    {
        return fd_;
    }
    [[nodiscard]] uint64_t size() const noexcept
    {
        return size_;
    }
    [[nodiscard]] bool hugepages() const noexcept
    {
        return hugepages_;
    }
    [[nodiscard]] uint8_t* base() const noexcept
    {
        return base_;
    }
    [[nodiscard]] SlotHeader* header(RegionLayout const& r, uint32_t slot) const noexcept
    {
        return reinterpret_cast<SlotHeader*>(base_ + r.headerOffset(slot));
    }
    [[nodiscard]] uint8_t* data(RegionLayout const& r, uint32_t slot) const noexcept
    {
        return base_ + r.dataOffset(slot);
    }

    /// Publishes a slot's header; the version is stored last, with release order, so a reader that
    /// sees the version sees the fields written with it.
    void writeHeader(RegionLayout const& r, uint32_t slot, uint64_t version, uint64_t length = 0, uint32_t crc = 0,
        KeyDigest const& key = {}) noexcept;
    /// A consistent copy of a slot's header (version read with acquire order, before and after).
    [[nodiscard]] SlotHeader readHeader(RegionLayout const& r, uint32_t slot) const noexcept;

private:
    Mapping(int fd, uint64_t size, bool hugepages, uint8_t* base)
        : fd_(fd)
        , size_(size)
        , hugepages_(hugepages)
        , base_(base)
    {
    }
    int fd_;
    uint64_t size_;
    bool hugepages_;
    uint8_t* base_;
};

} // namespace kvcodec::daemon

// SPDX-License-Identifier: Apache-2.0
#include "daemon/arena.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <sys/mman.h>
#include <unistd.h>

namespace kvcodec::daemon {
namespace {

uint64_t roundUp(uint64_t n, uint64_t to) noexcept
{
    return (n + to - 1) / to * to;
}

constexpr uint64_t mix64(uint64_t x) noexcept
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

uint64_t rotl(uint64_t x, int r) noexcept
{
    return (x << r) | (x >> (64 - r));
}

std::runtime_error sysError(std::string const& what)
{
    return std::runtime_error(what + ": " + std::strerror(errno));
}

/// `fd` mapped shared and read-write; on failure `fd` is closed and the error names `what`.
uint8_t* mapShared(int fd, uint64_t bytes, char const* what)
{
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
    {
        auto e = sysError(std::string("mmap of ") + what + " (" + std::to_string(bytes) + " bytes)");
        close(fd);
        throw e;
    }
    return static_cast<uint8_t*>(p);
}

} // namespace

KeyDigest keyDigest(std::string_view key) noexcept
{
    // Two 64-bit lanes over 8-byte words, each word mixed into both with different rotations and
    // multipliers, the length folded in, then both finalised (murmur3's fmix64).
    uint64_t a = 0x9e3779b97f4a7c15ULL ^ key.size();
    uint64_t b = 0x632be59bd9b4e019ULL + key.size();
    size_t i = 0;
    for (; i + 8 <= key.size(); i += 8)
    {
        uint64_t w;
        std::memcpy(&w, key.data() + i, 8);
        a = rotl(a ^ (w * 0x87c37b91114253d5ULL), 31) * 0x4cf5ad432745937fULL;
        b = rotl(b ^ (w * 0x4cf5ad432745937fULL), 29) * 0x87c37b91114253d5ULL + a;
    }
    uint64_t tail = 0;
    std::memcpy(&tail, key.data() + i, key.size() - i);
    a = rotl(a ^ (tail * 0x87c37b91114253d5ULL), 31) * 0x4cf5ad432745937fULL;
    b = rotl(b ^ (tail * 0x4cf5ad432745937fULL), 29) * 0x87c37b91114253d5ULL + a;
    a = mix64(a + b);
    b = mix64(b + a);
    KeyDigest out;
    std::memcpy(out.data(), &a, 8);
    std::memcpy(out.data() + 8, &b, 8);
    return out;
}

uint64_t RegionLayout::bytesFor(uint64_t stride, uint64_t slots) noexcept
{
    return roundUp(slots * kHeaderBytes, kArenaPage) + roundUp(slots * stride, kArenaPage);
}

std::shared_ptr<Mapping> Mapping::create(uint64_t bytes, bool hugepages)
{
    if (bytes == 0)
        throw std::invalid_argument("the arena needs at least one page");
    if (hugepages)
    {
        int fd = memfd_create("kvcodec-l2", MFD_CLOEXEC | MFD_HUGETLB);
        if (fd >= 0)
        {
            uint64_t const size = roundUp(bytes, 2ULL << 20);
            void* p = ftruncate(fd, off_t(size)) == 0
                ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0)
                : MAP_FAILED;
            if (p != MAP_FAILED)
                return std::shared_ptr<Mapping>(new Mapping(fd, size, true, static_cast<uint8_t*>(p)));
            close(fd); // no huge pages reserved: ordinary pages
        }
    }
    int fd = memfd_create("kvcodec-l2", MFD_CLOEXEC);
    if (fd < 0)
        throw sysError("memfd_create for the L2 arena");
    uint64_t const size = roundUp(bytes, kArenaPage);
    if (ftruncate(fd, off_t(size)) != 0)
    {
        auto e = sysError("ftruncate of the L2 arena to " + std::to_string(size) + " bytes");
        close(fd);
        throw e;
    }
    return std::shared_ptr<Mapping>(new Mapping(fd, size, false, mapShared(fd, size, "the L2 arena")));
}

std::shared_ptr<Mapping> Mapping::attach(int fd, uint64_t bytes)
{
    return std::shared_ptr<Mapping>(new Mapping(fd, bytes, false, mapShared(fd, bytes, "the daemon's arena")));
}

Mapping::~Mapping()
{
    munmap(base_, size_);
    close(fd_);
}

void Mapping::writeHeader(RegionLayout const& r, uint32_t slot, uint64_t version, uint64_t length, uint32_t crc,
    KeyDigest const& key) noexcept
{
    SlotHeader* h = header(r, slot);
    h->length = length;
    h->crc = crc;
    h->region = r.region;
    h->key = key;
    __atomic_store_n(&h->version, version, __ATOMIC_RELEASE);
}

SlotHeader Mapping::readHeader(RegionLayout const& r, uint32_t slot) const noexcept
{
    SlotHeader const* h = header(r, slot);
    SlotHeader out;
    uint64_t const before = __atomic_load_n(&h->version, __ATOMIC_ACQUIRE);
    std::memcpy(&out, h, sizeof out);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    out.version = __atomic_load_n(&h->version, __ATOMIC_ACQUIRE) == before ? before : ~0ULL; // ~0: changing
    return out;
}

} // namespace kvcodec::daemon

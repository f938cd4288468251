// SPDX-License-Identifier: Apache-2.0
//
// Internal to the disk tier: the constants of a region's directory layout and the small file and
// text helpers its parts (opening, recovery, workers, committer, resize) share.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "tiers/disk/disk_region.h"
#include "tiers/disk/file_io.h"

namespace kvcodec::disk::detail {

// Slots are padded to this in the files so that O_DIRECT (which needs offsets and sizes aligned to
// the device's logical block, 512 B or 4 KiB) can address every slot; fixing it (rather than
// probing the device) keeps a region's layout identical on every file system it is copied to.
constexpr uint64_t kAlign = 4096;
// Most adjacent slots one worker moves in a single vectored I/O.
constexpr size_t kMaxMergedSlots = 16;
constexpr char const* kJournal = "index.log";
constexpr char const* kJournalOld = "index.log.1";
constexpr char const* kSnapshot = "index.snapshot";
constexpr char const* kSnapshotBak = "index.snapshot.bak";
constexpr char const* kSnapshotTmp = "index.snapshot.tmp";
constexpr char const* kRegionFile = "region.json";
constexpr uint32_t kMaxContainers = 9999;
// A resize or defragmentation moves at most this many bytes per batch (its bounce buffer).
constexpr uint64_t kMoveBatchBytes = 64ull << 20;

/// "No such file or directory (errno 2)".
std::string errnoText(int err);

bool exists(std::string const& p);

/// A whole file in one uninitialized buffer: recovery reads journals and snapshots of hundreds
/// of MB, and zero-filling them first would cost as much as the read.
struct FileText
{
    std::unique_ptr<char[]> data;
    size_t size = 0;
    [[nodiscard]] std::string_view view() const noexcept
    {
        return {data.get(), size};
    }
};

/// Reads all of `p`; false with `err` (an errno) when it cannot.
bool readWholeFile(std::string const& p, FileText& out, int& err);
bool readWholeFile(std::string const& p, std::string& out, int& err);

/// The first and the last `n` bytes of a file (both the whole file when it is small); false
/// when it cannot be read.
bool readHeadTail(std::string const& p, size_t n, std::string& head, std::string& tail, uint64_t& size);

/// Creates `dir` and its parents; throws std::runtime_error naming the one that fails.
void mkdirs(std::string const& dir);

/// Creates (or truncates) `path`, writes `text` and fdatasyncs it, through `io`; the file is
/// closed again. Returns 0 or -errno.
int writeFileSynced(FileIo& io, std::string const& path, std::string const& text);

/// Deletes the container files numbered `first` and up in the containers directory `cdir`,
/// stopping at the first that is absent.
void removeContainersFrom(std::string const& cdir, uint32_t first);

/// fsyncs directory `dir` (its entries: created, renamed and removed files); best effort.
void syncDirectory(std::string const& dir);

inline uint64_t roundUp(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

inline std::string quoted(std::string const& s)
{
    return "'" + s + "'";
}

/// The status of a failed data I/O: kNoSpace for ENOSPC and EDQUOT, kIoError otherwise, with
/// the region, what failed and the errno in the message.
Status ioFailure(std::string const& dir, std::string const& what, int negErrno);

/// Text from a damaged file, safe to put in a message: bytes outside printable ASCII as \xNN.
std::string printable(std::string_view s);

/// A zeroed buffer aligned (and sized at least) to kAlign, as O_DIRECT needs.
struct AlignedBuffer
{
    void* p = nullptr;
    explicit AlignedBuffer(size_t bytes)
    {
        if (posix_memalign(&p, kAlign, std::max<size_t>(bytes, kAlign)) != 0)
            throw std::bad_alloc();
        std::memset(p, 0, std::max<size_t>(bytes, kAlign));
    }
    ~AlignedBuffer()
    {
        std::free(p);
    }
    AlignedBuffer(AlignedBuffer const&) = delete;
    AlignedBuffer& operator=(AlignedBuffer const&) = delete;
};

} // namespace kvcodec::disk::detail

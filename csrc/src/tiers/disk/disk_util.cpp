// SPDX-License-Identifier: Apache-2.0
#include "tiers/disk/disk_util.h"

#include <cerrno>
#include <cstdio>
#include <fcntl.h>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

namespace kvcodec::disk::detail {
namespace {

bool preadFully(int fd, char* dst, size_t n, uint64_t off, size_t& got)
{
    got = 0;
    while (got < n)
    {
        ssize_t r = ::pread(fd, dst + got, n - got, off_t(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return false;
        if (r == 0)
            break;
        got += size_t(r);
    }
    return true;
}

} // namespace

std::string errnoText(int err)
{
    return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

bool exists(std::string const& p)
{
    struct stat st;
    return ::stat(p.c_str(), &st) == 0;
}

bool readWholeFile(std::string const& p, FileText& out, int& err)
{
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
    {
        err = errno;
        return false;
    }
    struct stat st;
    if (::fstat(fd, &st) != 0)
    {
        err = errno;
        ::close(fd);
        return false;
    }
    out.data.reset(new char[size_t(st.st_size) + 1]);
    size_t got = 0;
    bool ok = preadFully(fd, out.data.get(), size_t(st.st_size), 0, got);
    if (!ok)
        err = errno;
    ::close(fd);
    out.size = got;
    return ok;
}

bool readWholeFile(std::string const& p, std::string& out, int& err)
{
    FileText text;
    if (!readWholeFile(p, text, err))
        return false;
    out.assign(text.data.get(), text.size);
    return true;
}

bool readHeadTail(std::string const& p, size_t n, std::string& head, std::string& tail, uint64_t& size)
{
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat st;
    bool ok = ::fstat(fd, &st) == 0;
    size = ok ? uint64_t(st.st_size) : 0;
    size_t got = 0;
    head.resize(std::min<uint64_t>(n, size));
    ok = ok && preadFully(fd, head.data(), head.size(), 0, got) && got == head.size();
    tail.resize(std::min<uint64_t>(n, size));
    ok = ok && preadFully(fd, tail.data(), tail.size(), size - tail.size(), got) && got == tail.size();
    ::close(fd);
    return ok;
}

void mkdirs(std::string const& dir)
{
    std::string cur;
    size_t pos = 0;
    while (pos != std::string::npos)
    {
        pos = dir.find('/', pos + 1);
        cur = dir.substr(0, pos);
        if (cur.empty())
            continue;
        if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
        {
            throw std::runtime_error("cannot create disk region directory '" + cur + "': " + errnoText(errno));
        }
    }
}

int writeFileSynced(FileIo& io, std::string const& path, std::string const& text)
{
    int fd = io.open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int rc = fd < 0 ? fd : writeFully(io, fd, text.data(), text.size(), 0);
    if (rc == 0)
        rc = io.fdatasync(fd);
    if (fd >= 0)
        io.close(fd);
    return rc;
}

void removeContainersFrom(std::string const& cdir, uint32_t first)
{
    for (uint32_t c = first; c < 10000; ++c)
        if (::unlink(containerFile(cdir, c).c_str()) != 0)
            break;
}

void syncDirectory(std::string const& dir)
{
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0)
    {
        ::fsync(fd);
        ::close(fd);
    }
}

std::string printable(std::string_view s)
{
    std::string out;
    for (char ch : s)
    {
        auto c = static_cast<unsigned char>(ch);
        if (c >= 0x20 && c < 0x7F)
            out += ch;
        else
        {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\x%02x", c);
            out += buf;
        }
    }
    return out;
}

Status ioFailure(std::string const& dir, std::string const& what, int negErrno)
{
    int err = -negErrno;
    StatusCode code = (err == ENOSPC || err == EDQUOT) ? StatusCode::kNoSpace : StatusCode::kIoError;
    return {code, "disk region '" + dir + "': " + what + ": " + errnoText(err), 0};
}

} // namespace kvcodec::disk::detail

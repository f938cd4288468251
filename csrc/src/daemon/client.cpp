// SPDX-License-Identifier: Apache-2.0
#include "daemon/client.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/wire.h"
#include "kvcodec/crc32c.h"

namespace kvcodec::daemon {
namespace {

template <class Fill>
std::string frameOf(Op op, Fill&& fill)
{
    std::string out;
    FrameWriter w(out);
    w.put(uint8_t(op));
    fill(w);
    w.finish();
    return out;
}

// A request of a region and keys (get, erase, prefetch).
std::string keysFrame(Op op, RegionLayout const& l, std::vector<std::string_view> const& keys)
{
    return frameOf(op, [&](FrameWriter& w) {
        w.put(l.region).put(uint32_t(keys.size()));
        for (auto const& k : keys)
            w.str(k);
    });
}

void checkLengths(size_t keys, size_t other, char const* what)
{
    if (keys != other)
        throw std::invalid_argument(std::to_string(keys) + " keys for " + std::to_string(other) + " " + what);
}

} // namespace

Client::Client(std::string socketPath, double timeoutS, double busyPollUs)
    : path_(std::move(socketPath))
    , timeoutS_(timeoutS)
    , spinNs_(int64_t(busyPollUs * 1e3))
{
    if (!(busyPollUs >= 0) || busyPollUs > 1e6)
        throw std::invalid_argument(
            "busy_poll_us is " + std::to_string(busyPollUs) + "; give 0 (sleep at once) to 1000000 microseconds");
    if (!(timeoutS_ > 0) || !std::isfinite(timeoutS_))
        throw std::invalid_argument(
            "timeout_s is " + std::to_string(timeoutS_) + "; give a positive number of seconds");
    connect();
}

Client::~Client()
{
    disconnect();
}

void Client::connect()
{
    if (path_.size() >= sizeof(sockaddr_un::sun_path))
        throw std::invalid_argument("the socket path is " + std::to_string(path_.size())
            + " bytes long; a Unix socket path has at most " + std::to_string(sizeof(sockaddr_un::sun_path) - 1));
    int const fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        throw DaemonGone(std::string("socket: ") + std::strerror(errno));
    timeval tv{};
    tv.tv_sec = time_t(timeoutS_);
    tv.tv_usec = suseconds_t((timeoutS_ - double(tv.tv_sec)) * 1e6);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    {
        std::string const why = std::strerror(errno);
        ::close(fd);
        throw DaemonGone("no daemon answers at " + path_ + ": " + why);
    }
    fd_ = fd;
    in_.clear();
    try
    {
        sendAll(frameOf(Op::Hello, [](FrameWriter& w) { w.put(kProtocolVersion).put(uint32_t(getpid())); }));
        // The reply carries the arena's descriptor (SCM_RIGHTS): one recvmsg takes both.
        char buf[256];
        iovec iov{buf, sizeof buf};
        alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        ssize_t const got = recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
        if (got <= 0)
            throw DaemonGone("the daemon at " + path_ + " did not complete the handshake"
                + (got < 0 ? std::string(": ") + std::strerror(errno) : std::string()));
        std::vector<int> fds;
        for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
                for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i)
                {
                    int one;
                    std::memcpy(&one, CMSG_DATA(cm) + i * sizeof(int), sizeof one);
                    fds.push_back(one);
                }
        auto closeFds = [&fds](size_t from) {
            for (size_t i = from; i < fds.size(); ++i)
                ::close(fds[i]);
        };
        in_.assign(buf, size_t(got));
        std::string const reply = readFrame();
        FrameReader r(reply.data(), reply.size());
        if (Status(r.get<uint8_t>()) != Status::Ok)
        {
            closeFds(0);
            throw DaemonRefused("the daemon refused the handshake: " + std::string(r.str()));
        }
        if (fds.empty())
            throw DaemonRefused("the daemon passed no arena descriptor");
        closeFds(1);
        r.get<uint32_t>(); // the version: a daemon speaking another refuses the handshake
        uint64_t const size = r.get<uint64_t>();
        clientId_ = r.get<uint32_t>();
        arena_ = Mapping::attach(fds[0], size);
        socketBytes_ += reply.size() + 4;
    }
    catch (...)
    {
        disconnect();
        throw;
    }
}

void Client::disconnect() noexcept
{
    if (fd_ >= 0)
        ::close(fd_);
    fd_ = -1;
    arena_.reset(); // views handed out keep the mapping alive
}

void Client::reconnect()
{
    std::lock_guard lock(mutex_);
    disconnect();
    connect();
}

void Client::close()
{
    std::lock_guard lock(mutex_);
    disconnect();
}

std::shared_ptr<Mapping> Client::arena() const
{
    std::lock_guard lock(mutex_);
    if (!arena_)
        throw DaemonGone("this client is closed (reconnect() to use it again)");
    return arena_;
}

void Client::sendAll(std::string const& frame)
{
    if (fd_ < 0)
        throw DaemonGone("this client is closed (reconnect() to use it again)");
    size_t sent = 0;
    while (sent < frame.size())
    {
        ssize_t const n = send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
        {
            std::string const why = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)
                ? "it did not take a request within " + std::to_string(timeoutS_) + " s"
                : std::strerror(errno);
            disconnect();
            throw DaemonGone("the daemon at " + path_ + " went away: " + why);
        }
        sent += size_t(n);
    }
    socketBytes_ += frame.size();
}

std::string Client::readFrame()
{
    char buf[1 << 16];
    for (;;)
    {
        if (in_.size() >= 4)
        {
            uint32_t n;
            std::memcpy(&n, in_.data(), 4);
            if (n > kMaxFrame)
            {
                disconnect();
                throw DaemonGone("the daemon sent a frame of " + std::to_string(n) + " bytes, over the protocol's "
                    + std::to_string(kMaxFrame));
            }
            if (in_.size() >= 4 + size_t(n))
            {
                std::string payload = in_.substr(4, n);
                in_.erase(0, 4 + size_t(n));
                return payload;
            }
        }
        ssize_t got = -1;
        if (spinNs_ > 0)
        {
            // A reply usually comes within microseconds: poll for it a while before sleeping
            // (a sleeping thread's wake-up costs more than the daemon's answer).
            auto const until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(spinNs_);
            do
                got = recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
            while (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && std::chrono::steady_clock::now() < until);
        }
        if (got < 0 && (spinNs_ == 0 || errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            got = recv(fd_, buf, sizeof buf, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
        {
            std::string const why = got == 0                ? "it closed the connection"
                : (errno == EAGAIN || errno == EWOULDBLOCK) ? "no reply within " + std::to_string(timeoutS_) + " s"
                                                            : std::strerror(errno);
            disconnect(); // a late reply would answer the next request: the connection goes
            throw DaemonGone("the daemon at " + path_ + " went away: " + why);
        }
        in_.append(buf, size_t(got));
    }
}

std::string Client::call(std::string const& frame)
{
    sendAll(frame);
    std::string reply = readFrame();
    socketBytes_ += reply.size() + 4;
    if (reply.empty())
        throw DaemonRefused("the daemon sent an empty reply");
    if (Status(reply[0]) != Status::Ok)
    {
        FrameReader r(reply.data() + 1, reply.size() - 1);
        throw DaemonRefused(std::string(r.str()));
    }
    return reply.substr(1);
}

RegionLayout Client::region(std::string_view identity, uint64_t pageBytes, uint32_t slots, bool packed)
{
    std::lock_guard lock(mutex_);
    std::string const reply = call(frameOf(Op::Region, [&](FrameWriter& w) {
        w.put(pageBytes).put(slots).str(identity);
        if (packed)
            w.put(kRegionPacked);
    }));
    FrameReader r(reply.data(), reply.size());
    RegionLayout l;
    l.region = r.get<uint32_t>();
    l.table = r.get<uint64_t>();
    l.data = r.get<uint64_t>();
    l.stride = r.get<uint64_t>();
    l.slots = r.get<uint32_t>();
    l.pageBytes = r.get<uint64_t>();
    if (l.end() > arena_->size() || l.stride < l.pageBytes || l.data < l.table + uint64_t(l.slots) * kHeaderBytes)
        throw DaemonRefused("the daemon answered a region outside its arena");
    return l;
}

std::vector<uint32_t> Client::lease(RegionLayout const& r, uint32_t count)
{
    std::lock_guard lock(mutex_);
    return leaseLocked(r, count);
}

std::vector<uint32_t> Client::leaseLocked(RegionLayout const& l, uint32_t count)
{
    std::string const reply = call(frameOf(Op::Lease, [&](FrameWriter& w) { w.put(l.region).put(count); }));
    FrameReader r(reply.data(), reply.size());
    std::vector<uint32_t> slots(r.count(12));
    for (auto& s : slots)
        if ((s = r.get<uint32_t>()) >= l.slots)
            throw DaemonRefused(
                "the daemon leased slot " + std::to_string(s) + ", outside region " + std::to_string(l.region));
    return slots;
}

std::vector<uint8_t> Client::commit(RegionLayout const& r, std::vector<uint32_t> const& slots,
    std::vector<std::string_view> const& keys, std::vector<uint32_t> const& lengths, bool ephemeral, bool pin,
    uint32_t const* crcs)
{
    std::lock_guard lock(mutex_);
    return commitLocked(
        r, slots, keys, lengths, uint8_t((ephemeral ? kCommitEphemeral : 0) | (pin ? kCommitPin : 0)), crcs);
}

std::vector<uint8_t> Client::commitLocked(RegionLayout const& l, std::vector<uint32_t> const& slots,
    std::vector<std::string_view> const& keys, std::vector<uint32_t> const& lengths, uint8_t flags,
    uint32_t const* crcs)
{
    checkLengths(keys.size(), slots.size(), "slots");
    checkLengths(keys.size(), lengths.size(), "lengths");
    if (!arena_)
        throw DaemonGone("this client is closed (reconnect() to use it again)");
    std::string const reply = call(frameOf(Op::Commit, [&](FrameWriter& w) {
        w.put(l.region).put(flags).put(uint32_t(slots.size()));
        for (size_t i = 0; i < slots.size(); ++i)
        {
            bool const inside = slots[i] < l.slots && lengths[i] <= l.pageBytes;
            uint32_t const crc = crcs ? crcs[i] : inside ? crc32cFast(arena_->data(l, slots[i]), lengths[i]) : 0;
            w.put(slots[i]).put(lengths[i]).put(crc);
        }
        for (auto const& k : keys)
            w.str(k);
    }));
    FrameReader r(reply.data(), reply.size());
    std::vector<uint8_t> statuses(r.count(1));
    for (auto& s : statuses)
        s = r.get<uint8_t>();
    return statuses;
}

void Client::abort(RegionLayout const& r, std::vector<uint32_t> const& slots)
{
    std::lock_guard lock(mutex_);
    abortLocked(r, slots);
}

void Client::abortLocked(RegionLayout const& l, std::vector<uint32_t> const& slots)
{
    call(frameOf(Op::Abort, [&](FrameWriter& w) {
        w.put(l.region).put(uint32_t(slots.size()));
        for (uint32_t s : slots)
            w.put(s);
    }));
}

std::vector<bool> Client::set(RegionLayout const& l, std::vector<std::string_view> const& keys,
    std::vector<std::pair<void const*, size_t>> const& pages, bool ephemeral)
{
    checkLengths(keys.size(), pages.size(), "pages");
    for (size_t i = 0; i < pages.size(); ++i)
        if (pages[i].second > l.pageBytes)
            throw std::invalid_argument("pages[" + std::to_string(i) + "] has " + std::to_string(pages[i].second)
                + " bytes; the region's pages have at most " + std::to_string(l.pageBytes));
    std::lock_guard lock(mutex_);
    std::vector<uint32_t> const slots = leaseLocked(l, uint32_t(keys.size()));
    std::vector<uint32_t> lengths(slots.size());
    for (size_t i = 0; i < slots.size(); ++i)
    {
        std::memcpy(arena_->data(l, slots[i]), pages[i].first, pages[i].second);
        lengths[i] = uint32_t(pages[i].second);
    }
    std::vector<std::string_view> const first(keys.begin(), keys.begin() + std::ptrdiff_t(slots.size()));
    std::vector<uint8_t> const st = commitLocked(l, slots, first, lengths, ephemeral ? kCommitEphemeral : uint8_t(0));
    std::vector<bool> out(keys.size(), false);
    for (size_t i = 0; i < st.size(); ++i)
        out[i] = st[i] == kStored;
    return out;
}

std::vector<Found> Client::get(RegionLayout const& r, std::vector<std::string_view> const& keys)
{
    std::lock_guard lock(mutex_);
    return getLocked(r, keys);
}

std::vector<Found> Client::getLocked(RegionLayout const& l, std::vector<std::string_view> const& keys)
{
    std::string const reply = call(keysFrame(Op::Get, l, keys));
    FrameReader r(reply.data(), reply.size());
    uint32_t const n = r.count(24);
    if (n != keys.size())
        throw DaemonRefused("the daemon answered " + std::to_string(n) + " keys of " + std::to_string(keys.size()));
    std::vector<Found> out(n);
    for (auto& f : out)
    {
        f.slot = r.get<uint32_t>();
        f.length = r.get<uint32_t>();
        f.crc = r.get<uint32_t>();
        r.get<uint32_t>();
        f.version = r.get<uint64_t>();
        if (f.slot != Found::kMissSlot && (f.slot >= l.slots || f.length > l.pageBytes))
            throw DaemonRefused("the daemon answered slot " + std::to_string(f.slot) + " of " + std::to_string(f.length)
                + " bytes, outside region " + std::to_string(l.region)); // never read
    }
    return out;
}

void Client::release(RegionLayout const& r, std::vector<uint32_t> const& slots)
{
    std::lock_guard lock(mutex_);
    releaseLocked(r, slots);
}

void Client::releaseLocked(RegionLayout const& l, std::vector<uint32_t> const& slots)
{
    size_t const hits
        = size_t(std::count_if(slots.begin(), slots.end(), [](uint32_t s) { return s != Found::kMissSlot; }));
    if (hits == 0 || fd_ < 0)
        return; // a daemon that is gone released everything with the connection
    try
    {
        sendAll(frameOf(Op::Release, [&](FrameWriter& w) {
            w.put(l.region).put(uint32_t(hits));
            for (uint32_t s : slots)
                if (s != Found::kMissSlot)
                    w.put(s);
        }));
    }
    catch (DaemonGone const&)
    {
    }
}

bool Client::valid(RegionLayout const& l, std::string_view key, Found const& f, bool checkCrc) const
{
    if (f.slot == Found::kMissSlot || f.slot >= l.slots || f.length > l.pageBytes)
        return false;
    std::shared_ptr<Mapping> const a = arena();
    SlotHeader const h = a->readHeader(l, f.slot);
    if (!headerShows(h, l, f, keyDigest(key)))
        return false;
    return !checkCrc || crc32cFast(a->data(l, f.slot), f.length) == f.crc;
}

template <class Read>
std::vector<Found> Client::readPinned(
    RegionLayout const& l, std::vector<std::string_view> const& keys, std::vector<OutBuffer> const& outs, Read&& read)
{
    checkLengths(keys.size(), outs.size(), "output buffers");
    std::lock_guard lock(mutex_);
    std::vector<Found> found = getLocked(l, keys);
    std::vector<uint32_t> pinned;
    pinned.reserve(found.size());
    for (size_t i = 0; i < found.size(); ++i)
    {
        if (found[i].slot == Found::kMissSlot)
            continue;
        pinned.push_back(found[i].slot);
        read(i, found[i]);
    }
    releaseLocked(l, pinned);
    return found;
}

std::vector<bool> Client::getInto(
    RegionLayout const& l, std::vector<std::string_view> const& keys, std::vector<OutBuffer> const& outs)
{
    std::vector<bool> ok(keys.size(), false);
    size_t tooSmall = keys.size();
    std::vector<Found> const found = readPinned(l, keys, outs, [&](size_t i, Found const& f) {
        if (outs[i].bytes < f.length)
        {
            tooSmall = std::min(tooSmall, i);
            return;
        }
        uint32_t const crc = crc32cCopy(outs[i].data, arena_->data(l, f.slot), f.length);
        // Checked after the copy, on the bytes copied (their CRC was taken in the same pass): the
        // header still shows the version that was answered (the slot was not reused meanwhile).
        SlotHeader const h = arena_->readHeader(l, f.slot);
        ok[i] = crc == f.crc && headerShows(h, l, f, keyDigest(keys[i]));
    });
    if (tooSmall < keys.size())
        throw std::invalid_argument("outs[" + std::to_string(tooSmall) + "] has " + std::to_string(outs[tooSmall].bytes)
            + " bytes; the page stored under its key has " + std::to_string(found[tooSmall].length));
    return ok;
}

std::vector<uint8_t> Client::putValues(RegionLayout const& l, std::vector<std::string_view> const& keys,
    std::vector<std::pair<void const*, size_t>> const& payloads, IdentityHash const& identity)
{
    checkLengths(keys.size(), payloads.size(), "payloads");
    std::vector<uint8_t> statuses(keys.size(), 2);
    std::vector<size_t> fits;
    for (size_t i = 0; i < keys.size(); ++i)
        if (kValueHeaderBytes + payloads[i].second <= l.pageBytes)
            fits.push_back(i);
    std::lock_guard lock(mutex_);
    std::vector<uint32_t> const slots = leaseLocked(l, uint32_t(fits.size()));
    std::vector<std::string_view> leasedKeys(slots.size());
    std::vector<uint32_t> lengths(slots.size()), crcs(slots.size());
    for (size_t j = 0; j < slots.size(); ++j)
    {
        size_t const i = fits[j];
        uint8_t* dst = arena_->data(l, slots[j]);
        auto const [src, bytes] = payloads[i];
        uint32_t const payloadCrc = crc32cCopy(dst + kValueHeaderBytes, src, bytes);
        packValueHeader(dst, keys[i], bytes, payloadCrc, identity);
        // The slot's CRC covers header and payload: joined from their two CRCs, no second pass.
        crcs[j] = crcCombine(crc32cFast(dst, kValueHeaderBytes), payloadCrc, bytes, crc32c_detail::kPowers.x);
        lengths[j] = uint32_t(kValueHeaderBytes + bytes);
        leasedKeys[j] = keys[i];
    }
    std::vector<uint8_t> const st = commitLocked(l, slots, leasedKeys, lengths, 0, crcs.data());
    for (size_t j = 0; j < fits.size(); ++j)
        statuses[fits[j]] = j < st.size() && st[j] == kStored ? 0 : 1;
    return statuses;
}

std::vector<int64_t> Client::getValues(RegionLayout const& l, std::vector<std::string_view> const& keys,
    std::vector<OutBuffer> const& outs, IdentityHash const& identity)
{
    std::vector<int64_t> codes(keys.size(), kValueMiss);
    readPinned(l, keys, outs, [&](size_t i, Found const& f) {
        uint8_t const* value = arena_->data(l, f.slot);
        uint32_t payloadCrc = 0;
        int64_t const n = checkValueHeader(value, f.length, keys[i], identity, &payloadCrc);
        if (n < 0 || uint64_t(n) > outs[i].bytes)
        {
            codes[i] = n < 0 ? n : kValueTooSmall;
            return;
        }
        uint32_t const crc = crc32cCopy(outs[i].data, value + kValueHeaderBytes, size_t(n));
        // The slot still holds what was answered (a pinned slot is never reused: this is the
        // check that it was not), and the copy is the payload the header describes.
        SlotHeader const h = arena_->readHeader(l, f.slot);
        bool const same
            = h.version == f.version && h.length == f.length && h.region == l.region && h.key == keyDigest(keys[i]);
        codes[i] = !same ? kValueMiss : crc != payloadCrc ? kValueCorrupt : n;
    });
    return codes;
}

std::vector<bool> Client::erase(RegionLayout const& l, std::vector<std::string_view> const& keys)
{
    std::lock_guard lock(mutex_);
    std::string const reply = call(keysFrame(Op::Erase, l, keys));
    FrameReader r(reply.data(), reply.size());
    std::vector<bool> out(r.count(1));
    for (size_t i = 0; i < out.size(); ++i)
        out[i] = r.get<uint8_t>() != 0;
    return out;
}

uint32_t Client::prefetch(RegionLayout const& l, std::vector<std::string_view> const& keys)
{
    std::lock_guard lock(mutex_);
    std::string const reply = call(keysFrame(Op::Prefetch, l, keys));
    FrameReader r(reply.data(), reply.size());
    return r.get<uint32_t>();
}

std::string Client::stats()
{
    std::lock_guard lock(mutex_);
    std::string const reply = call(frameOf(Op::Stats, [](FrameWriter&) {}));
    FrameReader r(reply.data(), reply.size());
    return std::string(r.str());
}

std::string Client::rawCall(std::string const& payload)
{
    std::lock_guard lock(mutex_);
    std::string frame(4, '\0');
    uint32_t const n = uint32_t(payload.size());
    std::memcpy(frame.data(), &n, 4);
    frame += payload;
    sendAll(frame);
    std::string reply = readFrame();
    socketBytes_ += reply.size() + 4;
    return reply;
}

} // namespace kvcodec::daemon

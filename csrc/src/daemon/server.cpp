// SPDX-License-Identifier: Apache-2.0
#include "daemon/server.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <type_traits>
#include <unistd.h>

#include "daemon/wire.h"

namespace kvcodec::daemon {
namespace {

/// Reply bytes a client may leave unread before the daemon drops it.
constexpr size_t kMaxPendingOut = 64u << 20;
constexpr uint64_t kListenerTag = 0, kStopTag = 1; // epoll tags below the first client id (2 and up)
constexpr uint64_t kPromotedTag = 1ULL << 32;      // above every client id

std::runtime_error sysError(std::string const& what)
{
    return std::runtime_error(what + ": " + std::strerror(errno));
}

} // namespace

Server::Server(ServerConfig config)
    : config_(std::move(config))
    , arena_([&] {
        if (config_.socketPath.empty())
            throw std::invalid_argument("socket_path is empty; give the path of the Unix socket to serve");
        if (config_.socketPath.size() >= sizeof(sockaddr_un::sun_path))
            throw std::invalid_argument("socket_path is " + std::to_string(config_.socketPath.size())
                + " bytes long; a Unix socket path has at most " + std::to_string(sizeof(sockaddr_un::sun_path) - 1));
        if (!(config_.busyPollUs >= 0) || config_.busyPollUs > 1e6)
            throw std::invalid_argument("busy_poll_us is " + std::to_string(config_.busyPollUs)
                + "; give 0 (sleep at once) to 1000000 microseconds");
        if (config_.l2Bytes < (1ULL << 20))
            throw std::invalid_argument(
                "l2_bytes is " + std::to_string(config_.l2Bytes) + "; the arena needs at least 1 MiB");
        return Mapping::create(config_.l2Bytes, config_.hugepages);
    }())
    , index_(arena_)
    , pollNs_(int64_t(config_.busyPollUs * 1e3))
    , started_(std::chrono::steady_clock::now())
{
    if (!config_.longTierDir.empty())
        long_ = std::make_unique<LongTier>(config_.longTierDir, config_.longTierQueueBytes);
    struct stat st;
    if (lstat(config_.socketPath.c_str(), &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(config_.socketPath.c_str()); // a stale socket of a daemon that died
    listener_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listener_ < 0)
        throw sysError("socket");
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, config_.socketPath.data(), config_.socketPath.size());
    if (bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    {
        auto e = sysError("bind " + config_.socketPath);
        close(listener_);
        throw e;
    }
    if (listen(listener_, 128) != 0 || (epoll_ = epoll_create1(EPOLL_CLOEXEC)) < 0
        || (stopFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
    {
        auto e = sysError("listen/epoll/eventfd");
        shutdown();
        if (stopFd_ >= 0)
            close(stopFd_);
        throw e;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenerTag;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, listener_, &ev);
    ev.data.u64 = kStopTag;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, stopFd_, &ev);
    if (long_)
    {
        ev.data.u64 = kPromotedTag;
        if ((promoteFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0
            || epoll_ctl(epoll_, EPOLL_CTL_ADD, promoteFd_, &ev) != 0)
        {
            auto e = sysError("eventfd for the long tier's reads");
            shutdown();
            close(stopFd_);
            if (promoteFd_ >= 0)
                close(promoteFd_);
            throw e;
        }
        promoterThread_ = std::thread([this] { promoter(); });
    }
}

Server::~Server()
{
    stopPromoter(); // before the index and the long tier it reads into go
    shutdown();
    if (stopFd_ >= 0)
        close(stopFd_);
    if (promoteFd_ >= 0)
        close(promoteFd_);
}

void Server::stop() noexcept
{
    if (stopFd_ >= 0) // set once by the constructor, closed only by the destructor
    {
        uint64_t one = 1;
        [[maybe_unused]] ssize_t n = write(stopFd_, &one, sizeof one);
    }
}

void Server::serve()
{
    if (served_)
        throw std::logic_error("this server has served already; create another");
    served_ = true;
    epoll_event events[64];
    for (;;)
    {
        int n = 0;
        if (pollNs_ > 0)
        {
            // After a batch another request usually follows within microseconds: poll for it a
            // while before sleeping (a sleeping thread's wake-up costs more than the answer).
            auto const until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(pollNs_);
            while ((n = epoll_wait(epoll_, events, 64, 0)) == 0 && std::chrono::steady_clock::now() < until)
            {
            }
        }
        if (n == 0)
            n = epoll_wait(epoll_, events, 64, -1);
        if (n < 0)
        {
            if (errno == EINTR)
                continue;
            auto e = sysError("epoll_wait");
            shutdown();
            throw e;
        }
        std::lock_guard lock(mutex_);
        for (int i = 0; i < n; ++i)
        {
            uint64_t const tag = events[i].data.u64;
            if (tag == kStopTag)
            {
                shutdown();
                return;
            }
            if (tag == kListenerTag)
            {
                accept();
                continue;
            }
            if (tag == kPromotedTag)
            {
                promoted();
                continue;
            }
            auto const it = clients_.find(uint32_t(tag));
            if (it != clients_.end())
                service(*it->second, events[i].events);
        }
    }
}

void Server::accept()
{
    for (;;)
    {
        int const fd = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return; // EAGAIN, or a connection that went away before it was taken
        auto c = std::make_unique<Client>();
        c->fd = fd;
        c->id = ++nextClient_; // ids start at 2: 0 and 1 tag the listener and the stop event
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = c->id;
        if (epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0)
        {
            close(fd);
            continue;
        }
        clients_.emplace(c->id, std::move(c));
    }
}

void Server::service(Client& c, uint32_t events)
{
    uint32_t const id = c.id;
    if (events & EPOLLOUT)
    {
        flush(c);
        if (clients_.find(id) == clients_.end())
            return; // the send failed: the client is gone
    }
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        return;
    char buf[1 << 16];
    for (;;)
    {
        ssize_t const got = recv(c.fd, buf, sizeof buf, 0);
        if (got > 0)
        {
            c.in.append(buf, size_t(got));
            c.bytesIn += uint64_t(got);
            if (size_t(got) < sizeof buf)
                break;
            continue;
        }
        if (got < 0 && (errno == EAGAIN || errno == EINTR))
            break;
        drop(c); // the connection ended (or failed): its pins and leases go
        return;
    }
    if (input(c))
        flush(c);
}

bool Server::input(Client& c)
{
    uint32_t const id = c.id;
    size_t pos = 0;
    while (!c.parked && c.in.size() - pos >= 4)
    {
        uint32_t n;
        std::memcpy(&n, c.in.data() + pos, 4);
        if (n > kMaxFrame || n == 0)
        {
            drop(c); // not our protocol: the connection goes
            return false;
        }
        if (c.in.size() - pos - 4 < n)
            break;
        handle(c, c.in.data() + pos + 4, n);
        if (clients_.find(id) == clients_.end())
            return false;
        pos += 4 + n;
    }
    c.in.erase(0, pos);
    return true;
}

void Server::refuse(Client& c, std::string const& message)
{
    ++refused_;
    FrameWriter w(c.out);
    w.put(uint8_t(Status::Refused)).str(message);
    w.finish();
}

template <class Answer>
void Server::perKey(FrameReader& in, std::string& out, Answer&& answer)
{
    uint32_t const region = in.get<uint32_t>();
    index_.checkRegion(region);
    uint32_t const count = in.count(4);
    FrameWriter w(out);
    w.put(uint8_t(Status::Ok)).put(count);
    for (uint32_t i = 0; i < count; ++i)
        answer(w, region, in.str());
    w.finish();
}

void Server::handle(Client& c, char const* p, size_t n)
{
    FrameReader in(p, n);
    auto const op = Op(in.get<uint8_t>());
    if (!c.hello && op != Op::Hello)
        return refuse(c, "a request before 'hello': the handshake comes first");
    std::string& out = c.out;
    size_t const mark = out.size();
    try
    {
        switch (op)
        {
        case Op::Hello:
        {
            uint32_t const version = in.get<uint32_t>();
            uint32_t const pid = in.get<uint32_t>();
            return hello(c, version, pid);
        }
        case Op::Region:
        {
            uint64_t const pageBytes = in.get<uint64_t>();
            uint32_t const slots = in.get<uint32_t>();
            std::string_view const identity = in.str();
            bool const packed = in.left() > 0 && (in.get<uint8_t>() & kRegionPacked) != 0;
            RegionLayout const& r = index_.region(identity, pageBytes, slots, packed);
            FrameWriter w(out);
            w.put(uint8_t(Status::Ok))
                .put(r.region)
                .put(r.table)
                .put(r.data)
                .put(r.stride)
                .put(r.slots)
                .put(r.pageBytes);
            return w.finish();
        }
        case Op::Lease:
        {
            uint32_t const region = in.get<uint32_t>();
            uint32_t const count = in.get<uint32_t>();
            std::vector<uint64_t> versions;
            std::vector<uint32_t> const slots = index_.lease(c.id, region, count, versions);
            FrameWriter w(out);
            w.put(uint8_t(Status::Ok)).put(uint32_t(slots.size()));
            for (uint32_t s : slots)
                w.put(s);
            for (uint64_t v : versions)
                w.put(v);
            return w.finish();
        }
        case Op::Commit:
        {
            uint32_t const region = in.get<uint32_t>();
            index_.checkRegion(region);
            uint8_t const flags = in.get<uint8_t>();
            bool const ephemeral = (flags & kCommitEphemeral) != 0;
            bool const pin = (flags & kCommitPin) != 0;
            uint32_t const count = in.count(12);
            std::vector<uint32_t> fields(3 * size_t(count));
            for (auto& f : fields)
                f = in.get<uint32_t>();
            FrameWriter w(out);
            w.put(uint8_t(Status::Ok)).put(count);
            for (uint32_t i = 0; i < count; ++i)
            {
                std::string_view const key = in.str();
                if (key.empty())
                    throw std::invalid_argument("keys[" + std::to_string(i) + "] is empty");
                auto const st = index_.commit(
                    c.id, region, fields[3 * i], key, fields[3 * i + 1], fields[3 * i + 2], ephemeral, pin);
                setRefused_ += st == kStored ? 0 : 1;
                if (st == kStored && !ephemeral && long_)
                    writeBack(region, fields[3 * i], key, fields[3 * i + 1], fields[3 * i + 2]);
                w.put(uint8_t(st));
            }
            return w.finish();
        }
        case Op::Abort:
        case Op::Release:
        {
            uint32_t const region = in.get<uint32_t>();
            index_.checkRegion(region);
            uint32_t const count = in.count(4);
            for (uint32_t i = 0; i < count; ++i)
            {
                uint32_t const s = in.get<uint32_t>();
                op == Op::Abort ? index_.abort(c.id, region, s) : index_.release(c.id, region, s);
            }
            if (op == Op::Release)
                return; // no reply: a bad release changes nothing
            FrameWriter w(out);
            w.put(uint8_t(Status::Ok));
            return w.finish();
        }
        case Op::Get:
        {
            uint32_t const region = in.get<uint32_t>();
            index_.checkRegion(region);
            std::vector<std::string_view> keys(in.count(4));
            for (auto& k : keys)
                k = in.str();
            if (!park(c, region, keys))
                answerGet(c.id, region, keys, out);
            return;
        }
        case Op::Prefetch:
        {
            uint32_t const queued = prefetch(in);
            FrameWriter w(out);
            w.put(uint8_t(Status::Ok)).put(queued);
            return w.finish();
        }
        case Op::Erase:
            erasures_ += 1; // a page being read back from the long tier is not stored after this
            return perKey(in, out, [&](FrameWriter& w, uint32_t region, std::string_view key) {
                bool const erased = index_.erase(region, key);
                if (long_)
                    long_->erase(index_.identity(region), index_.layout(region).pageBytes, key);
                w.put(uint8_t(erased));
            });
        case Op::Stats:
        {
            FrameWriter w(out);
            w.put(uint8_t(Status::Ok)).str(statsLocked());
            return w.finish();
        }
        }
        refuse(c, "unknown op " + std::to_string(unsigned(op)));
    }
    catch (std::exception const& e)
    {
        // A malformed request must not end the daemon for everyone: the client gets the reason
        // (in place of whatever part of the reply was written before the failure).
        out.resize(mark);
        refuse(c, e.what());
    }
}

void Server::hello(Client& c, uint32_t version, uint32_t pid)
{
    if (version != kProtocolVersion)
        return refuse(c,
            "protocol version " + std::to_string(version) + " is not served; this daemon speaks "
                + std::to_string(kProtocolVersion));
    c.hello = true;
    c.pid = pid;
    std::string reply;
    FrameWriter w(reply);
    w.put(uint8_t(Status::Ok)).put(kProtocolVersion).put(arena_->size()).put(c.id).put(uint8_t(arena_->hugepages()));
    w.finish();
    // The descriptor goes with the reply's bytes (SCM_RIGHTS); a fresh connection's buffer takes
    // a reply this small at once, so a short send means the client is gone.
    iovec iov{reply.data(), reply.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    int const fd = arena_->fd();
    std::memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    uint32_t const id = c.id;
    flush(c); // replies to requests refused before the handshake go first
    if (clients_.find(id) == clients_.end())
        return;
    if (!c.out.empty() || sendmsg(c.fd, &msg, MSG_NOSIGNAL) != ssize_t(reply.size()))
        return drop(c);
    c.bytesOut += reply.size();
}

void Server::flush(Client& c)
{
    while (c.outSent < c.out.size())
    {
        ssize_t const n = send(c.fd, c.out.data() + c.outSent, c.out.size() - c.outSent, MSG_NOSIGNAL);
        if (n > 0)
        {
            c.outSent += size_t(n);
            c.bytesOut += uint64_t(n);
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            break;
        return drop(c);
    }
    if (c.outSent == c.out.size())
    {
        c.out.clear();
        c.outSent = 0;
    }
    else if (c.out.size() - c.outSent > kMaxPendingOut)
        return drop(c); // a client that does not read its replies is cut off, not buffered for
    bool const waiting = !c.out.empty();
    if (waiting != c.writing) // only a change costs a system call
    {
        c.writing = waiting;
        epoll_event ev{};
        ev.events = EPOLLIN | (waiting ? EPOLLOUT : 0u);
        ev.data.u64 = c.id;
        epoll_ctl(epoll_, EPOLL_CTL_MOD, c.fd, &ev);
    }
}

void Server::drop(Client& c)
{
    index_.dropClient(c.id);
    closedClients_ += 1;
    closedBytesIn_ += c.bytesIn;
    closedBytesOut_ += c.bytesOut;
    epoll_ctl(epoll_, EPOLL_CTL_DEL, c.fd, nullptr);
    close(c.fd);
    clients_.erase(c.id); // c is gone from here on
}

void Server::shutdown()
{
    if (closed_)
        return;
    closed_ = true;
    while (!clients_.empty())
        drop(*clients_.begin()->second);
    if (listener_ >= 0)
    {
        close(listener_);
        unlink(config_.socketPath.c_str());
    }
    if (epoll_ >= 0)
        close(epoll_);
    listener_ = epoll_ = -1;
    // stopFd_ stays open until the destructor: stop() may write to it from any thread, at any
    // time, and must never write to a descriptor that was closed (and perhaps reused).
}

void Server::writeBack(uint32_t region, uint32_t slot, std::string_view key, uint32_t length, uint32_t crc)
{
    RegionLayout const& l = index_.layout(region);
    index_.hold(kLongTierClient, region, slot); // neither evicted nor reused until written
    bool const queued = long_->put(
        index_.identity(region), l.pageBytes, key, arena_->data(l, slot), length, crc, [this, region, slot] {
            std::lock_guard lock(mutex_);
            index_.release(kLongTierClient, region, slot);
        });
    if (!queued)
        index_.release(kLongTierClient, region, slot);
}

std::string Server::statsJson()
{
    std::lock_guard lock(mutex_);
    return statsLocked();
}

std::string Server::statsLocked() const
{
    Counters const& k = index_.counters();
    auto const o = index_.occupancy();
    uint64_t in = closedBytesIn_, out = closedBytesOut_;
    for (auto const& [id, c] : clients_)
    {
        in += c->bytesIn;
        out += c->bytesOut;
    }
    double const uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    std::string s = "{";
    auto add = [&s](char const* name, auto v) {
        if (s.size() > 1)
            s += ", ";
        s += '"';
        s += name;
        s += "\": ";
        if constexpr (std::is_same_v<decltype(v), bool>)
            s += v ? "true" : "false";
        else
            s += std::to_string(v);
    };
    add("sets", k.sets);
    add("set_bytes", k.setBytes);
    add("set_refused", setRefused_);
    add("requests_refused", refused_);
    add("gets", k.gets);
    add("hits", k.hits);
    add("misses", k.misses);
    add("hit_bytes", k.hitBytes);
    add("evictions", k.evictions);
    add("ephemeral", k.ephemeral);
    add("leases", k.leases);
    add("aborted", k.aborted);
    add("erased", k.erased);
    add("reclaimed_pins", k.reclaimedPins);
    add("reclaimed_leases", k.reclaimedLeases);
    add("regions", o.regions);
    add("arena_bytes", arena_->size());
    add("arena_used", o.arenaUsed);
    add("hugepages", arena_->hugepages());
    add("slots", o.slots);
    add("slots_free", o.free);
    add("slots_stored", o.stored);
    add("slots_leased", o.leased);
    add("slots_pinned", o.pinned);
    add("clients", uint64_t(clients_.size()));
    add("clients_closed", closedClients_);
    add("uptime_s", uptime);
    add("socket_bytes_in", in);
    add("socket_bytes_out", out);
    add("long_tier", bool(long_));
    LongTierCounters const t = long_ ? long_->counters() : LongTierCounters{};
    add("write_backs_queued", t.queued);
    add("write_backs", t.written);
    add("write_back_bytes", t.writtenBytes);
    add("write_backs_dropped", t.dropped);
    add("write_backs_failed", t.failed);
    add("write_back_queue_bytes", long_ ? long_->queuedBytes() : uint64_t(0));
    add("long_hits", t.hits);
    add("long_hit_bytes", t.hitBytes);
    add("long_misses", t.misses);
    add("long_corrupt", t.corrupt);
    add("long_erased", t.erased);
    add("promotions", promotions_);
    add("lookups_parked", parkedLookups_);
    add("prefetch_keys", prefetchKeys_);
    add("prefetched", prefetched_);
    add("prefetch_dropped", prefetchDropped_);
    add("protocol", kProtocolVersion);
    add("pid", int64_t(getpid()));
    return s + "}";
}

} // namespace kvcodec::daemon

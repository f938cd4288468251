// SPDX-License-Identifier: Apache-2.0
//
// The daemon's server and client under threads, built with a sanitizer by
// tests/test_daemon_sanitizers.py: four clients set, read (checked byte for byte), look up, erase,
// lease and abort, send broken requests and reconnect at random against one server, while
// another thread reads the server's counters; with a directory as third argument the server has a
// long tier there (write-backs on their own thread, lookups that miss L2 read back from it).
// Exits 0 when no page read was wrong and every pin and lease came back; anything a sanitizer
// finds ends it with an error.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <sys/socket.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "daemon/client.h"
#include "daemon/server.h"
#include "daemon/wire.h"

using namespace kvcodec::daemon;

namespace {

constexpr uint64_t kPage = 16 << 10;
constexpr int kKeys = 96;

void fill(uint8_t* p, int key)
{
    uint64_t x = 0x9e3779b97f4a7c15ULL * uint64_t(key + 1);
    for (uint64_t i = 0; i < kPage; i += 8)
    {
        x ^= x >> 29;
        x *= 0xbf58476d1ce4e5b9ULL;
        x ^= x >> 32;
        std::memcpy(p + i, &x, 8);
    }
}

std::string keyOf(int k)
{
    return "stress/" + std::to_string(k);
}

int fail(char const* what)
{
    std::fprintf(stderr, "daemon_stress: %s\n", what);
    return 1;
}

} // namespace

int main(int argc, char** argv)
{
    if (argc != 3 && argc != 4)
        return fail("usage: daemon_stress SOCKET SECONDS [LONG_TIER_DIR]");
    std::string const path = argv[1];
    double const seconds = std::atof(argv[2]);
    Server server(ServerConfig{path, 16ULL << 20, false, 0, argc == 4 ? argv[3] : "", 4ULL << 20});
    std::thread serving([&] { server.serve(); });
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> wrong{0}, hits{0}, ops{0};
    std::thread stats([&] {
        while (!stop)
            if (server.statsJson().empty())
                wrong += 1;
    });
    std::vector<std::thread> clients;
    for (int t = 0; t < 4; ++t)
        clients.emplace_back([&, t] {
            std::mt19937_64 rng(uint64_t(t) * 7919 + 1);
            Client c(path, 10.0, t % 2 ? 20.0 : 0.0);
            RegionLayout region = c.region("stress", kPage, 48);
            std::vector<uint8_t> buf(kPage * 8), expect(kPage);
            while (!stop)
            {
                ops += 1;
                int const n = 1 + int(rng() % 8);
                std::vector<std::string> names;
                for (int i = 0; i < n; ++i)
                    names.push_back(keyOf(int(rng() % kKeys)));
                std::vector<std::string_view> keys(names.begin(), names.end());
                switch (rng() % 8)
                {
                case 0:
                case 1:
                {
                    std::vector<std::pair<void const*, size_t>> pages;
                    for (int i = 0; i < n; ++i)
                    {
                        fill(buf.data() + size_t(i) * kPage, std::atoi(names[size_t(i)].c_str() + 7));
                        pages.emplace_back(buf.data() + size_t(i) * kPage, kPage);
                    }
                    c.set(region, keys, pages, false);
                    break;
                }
                case 2:
                case 3:
                {
                    std::vector<OutBuffer> outs;
                    for (int i = 0; i < n; ++i)
                        outs.push_back({buf.data() + size_t(i) * kPage, kPage});
                    std::vector<bool> const ok = c.getInto(region, keys, outs);
                    for (int i = 0; i < n; ++i)
                        if (ok[size_t(i)])
                        {
                            hits += 1;
                            fill(expect.data(), std::atoi(names[size_t(i)].c_str() + 7));
                            if (std::memcmp(expect.data(), buf.data() + size_t(i) * kPage, kPage) != 0)
                                wrong += 1;
                        }
                    break;
                }
                case 4:
                {
                    std::vector<Found> const found = c.get(region, keys);
                    std::vector<uint32_t> slots;
                    for (size_t i = 0; i < found.size(); ++i)
                    {
                        slots.push_back(found[i].slot);
                        if (found[i].slot != Found::kMissSlot && c.valid(region, keys[i], found[i], true))
                        {
                            fill(expect.data(), std::atoi(names[i].c_str() + 7));
                            uint8_t const* data = c.arena()->data(region, found[i].slot);
                            if (std::memcmp(expect.data(), data, kPage) != 0)
                                wrong += 1; // pinned and valid: must be the key's page
                        }
                    }
                    c.release(region, slots);
                    c.prefetch(region, keys); // with a long tier, reads queued behind the lookups
                    break;
                }
                case 5: c.erase(region, keys); break;
                case 6: c.abort(region, c.lease(region, uint32_t(n))); break;
                default:
                    if (rng() % 4 == 0)
                    {
                        c.reconnect(); // the daemon drops what the old connection held
                        region = c.region("stress", kPage, 48);
                    }
                    else
                    {
                        try
                        {
                            c.rawCall(std::string(1, char(6)) + std::string(3, '\0')); // a get cut short
                        }
                        catch (DaemonRefused const&)
                        {
                        }
                    }
                }
            }
        });
    // A connection that breaks the protocol: dropped, without harm to the others.
    for (int i = 0; i < 20; ++i)
    {
        int const fd = socket(AF_UNIX, SOCK_STREAM, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::memcpy(addr.sun_path, path.data(), path.size());
        if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0)
        {
            uint32_t const huge = kMaxFrame + 1;
            [[maybe_unused]] ssize_t n = send(fd, &huge, 4, MSG_NOSIGNAL);
        }
        close(fd);
        std::this_thread::sleep_for(std::chrono::milliseconds(int(seconds * 1000 / 20)));
    }
    stop = true;
    for (auto& t : clients)
        t.join();
    stats.join();
    // Every connection has ended: give the server a moment to handle the last ones, the long tier
    // to finish its write-backs and the promoter its prefetches (each holds a slot until done).
    auto const settled = [](std::string const& st) {
        return st.find("\"clients\": 0,") != std::string::npos
            && st.find("\"write_back_queue_bytes\": 0,") != std::string::npos
            && st.find("\"slots_pinned\": 0,") != std::string::npos
            && st.find("\"slots_leased\": 0,") != std::string::npos;
    };
    std::string st;
    for (int i = 0; i < 500; ++i)
    {
        st = server.statsJson();
        if (settled(st))
            break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    server.stop();
    serving.join();
    std::printf("ops %llu hits %llu wrong %llu\n%s\n", (unsigned long long)ops.load(), (unsigned long long)hits.load(),
        (unsigned long long)wrong.load(), st.c_str());
    if (wrong != 0)
        return fail("a page read was wrong");
    if (hits == 0)
        return fail("no page was ever read: the test tested nothing");
    if (!settled(st))
        return fail("pins, leases or clients left behind 5 s after the last client");
    return 0;
}

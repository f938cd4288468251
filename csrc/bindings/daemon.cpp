// SPDX-License-Identifier: Apache-2.0
//
// Bindings of the per-host daemon (kvcodec_sdk._native.daemon): the server, the client, the
// arena's mapping and region layouts. Declarations and conversions only; the Python facade is
// kvcodec_sdk/daemon/. Every call that waits on the socket runs without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "buffers.h"
#include "daemon/client.h"
#include "daemon/server.h"
#include "daemon/wire.h"

namespace py = pybind11;
using namespace pybind11::literals;
using namespace kvcodec::daemon;
using namespace kvcodec::bindings;

namespace {

std::vector<uint32_t> slotsOf(py::array_t<uint32_t, py::array::c_style | py::array::forcecast> const& a)
{
    return {a.data(), a.data() + a.size()};
}

using Slots = py::array_t<uint32_t, py::array::c_style | py::array::forcecast>;

/// A client call taking a region and slots, run without the GIL (abort, release).
template <void (Client::*Call)(RegionLayout const&, std::vector<uint32_t> const&)>
void withSlots(Client& c, RegionLayout const& r, Slots const& slots)
{
    std::vector<uint32_t> const s = slotsOf(slots);
    py::gil_scoped_release nogil;
    (c.*Call)(r, s);
}

/// A client call of a region and keys, the keys held while it runs without the GIL.
template <class R>
auto keysCall(R (Client::*call)(RegionLayout const&, std::vector<std::string_view> const&))
{
    return [call](Client& c, RegionLayout const& r, py::handle keys) {
        Keys const k = keysOf(keys);
        py::gil_scoped_release nogil;
        return (c.*call)(r, k.views);
    };
}

/// A remote-tier values call (putValues reads its buffers, getValues writes them): the keys, one
/// buffer per key (named as field[i] in errors) and the identity hash are converted in that order
/// with the GIL held; the call runs without it.
template <class R, class View>
auto valuesCall(R (Client::*call)(RegionLayout const&, std::vector<std::string_view> const&, std::vector<View> const&,
                    IdentityHash const&),
    char const* field)
{
    return [call, field](Client& c, RegionLayout const& r, py::handle keys, std::vector<py::buffer> const& bufs,
               py::bytes const& identity) {
        Keys const k = keysOf(keys);
        std::vector<View> views;
        if constexpr (std::is_same_v<View, OutBuffer>)
            views = destinationsOf(bufs, field);
        else
            views = sourcesOf(bufs, field);
        IdentityHash const id = identityOf(identity);
        py::gil_scoped_release nogil;
        return (c.*call)(r, k.views, views, id);
    };
}

template <class T>
py::array_t<T> column(std::vector<Found> const& found, T Found::* field)
{
    py::array_t<T> out(py::ssize_t(found.size()));
    T* p = out.mutable_data();
    for (size_t i = 0; i < found.size(); ++i)
        p[i] = found[i].*field;
    return out;
}

} // namespace

void bindDaemon(py::module_& parent)
{
    py::module_ m = parent.def_submodule("daemon", "The per-host cache daemon: shared L2 arena, server and client.");
    m.attr("PROTOCOL_VERSION") = kProtocolVersion;
    m.attr("MAX_FRAME") = kMaxFrame;
    m.attr("MISS") = Found::kMissSlot;
    auto refused = py::register_exception<DaemonRefused>(m, "DaemonError", PyExc_RuntimeError);
    py::register_exception<DaemonGone>(m, "DaemonUnavailable", refused.ptr());
    m.def(
        "key_digest",
        [](py::bytes const& key) {
            KeyDigest const d = keyDigest(std::string_view(key));
            return py::bytes(reinterpret_cast<char const*>(d.data()), d.size());
        },
        "key"_a, "The 16-byte digest of a content key kept in its slot's header.");

    py::class_<Mapping, std::shared_ptr<Mapping>>(m, "Mapping", py::buffer_protocol(),
        "The arena mapped in this process (a writable buffer; views of it keep the mapping alive).")
        .def_buffer([](Mapping& a) {
            return py::buffer_info(a.base(), 1, py::format_descriptor<uint8_t>::format(), 1, {py::ssize_t(a.size())},
                {py::ssize_t(1)}, false);
        })
        .def_property_readonly("size", &Mapping::size)
        .def_property_readonly("hugepages", &Mapping::hugepages)
        .def_property_readonly("fd", &Mapping::fd);

    py::class_<RegionLayout>(m, "RegionLayout", "Where a region lies in the arena.")
        .def(py::init([](uint32_t region, uint64_t table, uint64_t data, uint64_t stride, uint32_t slots,
                          uint64_t pageBytes) { return RegionLayout{region, table, data, stride, slots, pageBytes}; }),
            "region"_a, "table"_a, "data"_a, "stride"_a, "slots"_a, "page_bytes"_a)
        .def_readonly("region", &RegionLayout::region)
        .def_readonly("table", &RegionLayout::table)
        .def_readonly("data", &RegionLayout::data)
        .def_readonly("stride", &RegionLayout::stride)
        .def_readonly("slots", &RegionLayout::slots)
        .def_readonly("page_bytes", &RegionLayout::pageBytes)
        .def_property_readonly("end", &RegionLayout::end)
        .def("data_offset", &RegionLayout::dataOffset, "slot"_a)
        .def("header_offset", &RegionLayout::headerOffset, "slot"_a)
        .def("__repr__", [](RegionLayout const& l) {
            return "RegionLayout(region=" + std::to_string(l.region) + ", slots=" + std::to_string(l.slots)
                + ", page_bytes=" + std::to_string(l.pageBytes) + ")";
        });

    py::class_<Server>(m, "Server", "The daemon's server (kvcodec_sdk.daemon.Daemon is the facade).")
        .def(py::init([](std::string path, uint64_t l2Bytes, bool hugepages, double busyPollUs, std::string longTier,
                          uint64_t longTierQueueBytes) {
            return std::make_unique<Server>(
                ServerConfig{std::move(path), l2Bytes, hugepages, busyPollUs, std::move(longTier), longTierQueueBytes});
        }),
            "socket_path"_a, "l2_bytes"_a, "hugepages"_a, "busy_poll_us"_a, "long_tier"_a = "",
            "long_tier_queue_bytes"_a = uint64_t(256) << 20)
        .def("serve", &Server::serve, py::call_guard<py::gil_scoped_release>())
        .def("stop", &Server::stop)
        .def("stats_json", &Server::statsJson, py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("arena", &Server::arena);

    py::class_<Client>(m, "Client", "A connection to the daemon (kvcodec_sdk.daemon.DaemonClient is the facade).")
        .def(py::init<std::string, double, double>(), "socket_path"_a, "timeout_s"_a, "busy_poll_us"_a,
            py::call_guard<py::gil_scoped_release>())
        .def("reconnect", &Client::reconnect, py::call_guard<py::gil_scoped_release>())
        .def("close", &Client::close, py::call_guard<py::gil_scoped_release>())
        .def("region", &Client::region, "identity"_a, "page_bytes"_a, "slots"_a, "packed"_a = false,
            py::call_guard<py::gil_scoped_release>())
        .def(
            "lease",
            [](Client& c, RegionLayout const& r, uint32_t count) {
                std::vector<uint32_t> slots;
                {
                    py::gil_scoped_release nogil;
                    slots = c.lease(r, count);
                }
                return py::array_t<uint32_t>(py::ssize_t(slots.size()), slots.data());
            },
            "region"_a, "count"_a)
        .def(
            "commit",
            [](Client& c, RegionLayout const& r,
                py::array_t<uint32_t, py::array::c_style | py::array::forcecast> const& slots, py::handle keys,
                std::vector<uint32_t> const& lengths, bool ephemeral, bool pin) {
                std::vector<uint32_t> const s = slotsOf(slots);
                Keys const k = keysOf(keys);
                py::gil_scoped_release nogil;
                return c.commit(r, s, k.views, lengths, ephemeral, pin);
            },
            "region"_a, "slots"_a, "keys"_a, "lengths"_a, "ephemeral"_a, "pin"_a = false)
        .def("abort", &withSlots<&Client::abort>, "region"_a, "slots"_a)
        .def(
            "set",
            [](Client& c, RegionLayout const& r, py::handle keys, std::vector<py::buffer> const& pages,
                bool ephemeral) {
                Keys const k = keysOf(keys);
                auto const views = sourcesOf(pages, "pages");
                py::gil_scoped_release nogil;
                return c.set(r, k.views, views, ephemeral);
            },
            "region"_a, "keys"_a, "pages"_a, "ephemeral"_a)
        .def(
            "get",
            [](Client& c, RegionLayout const& r, py::handle keys) {
                Keys const k = keysOf(keys);
                std::vector<Found> found;
                {
                    py::gil_scoped_release nogil;
                    found = c.get(r, k.views);
                }
                return py::make_tuple(column(found, &Found::slot), column(found, &Found::version),
                    column(found, &Found::length), column(found, &Found::crc));
            },
            "region"_a, "keys"_a, "(slots, versions, lengths, crcs) as arrays; a miss has slot MISS")
        .def("release", &withSlots<&Client::release>, "region"_a, "slots"_a)
        .def(
            "valid",
            [](Client const& c, RegionLayout const& r, py::bytes const& key, uint32_t slot, uint64_t version,
                uint32_t length, uint32_t crc, bool checkCrc) {
                std::string_view const k = key;
                py::gil_scoped_release nogil;
                return c.valid(r, k, Found{slot, length, crc, version}, checkCrc);
            },
            "region"_a, "key"_a, "slot"_a, "version"_a, "length"_a, "crc"_a, "check_crc"_a)
        .def(
            "get_into",
            [](Client& c, RegionLayout const& r, py::handle keys, std::vector<py::buffer> const& outs) {
                Keys const k = keysOf(keys);
                auto const dst = destinationsOf(outs, "outs");
                py::gil_scoped_release nogil;
                return c.getInto(r, k.views, dst);
            },
            "region"_a, "keys"_a, "outs"_a)
        .def("put_values", valuesCall(&Client::putValues, "values"), "region"_a, "keys"_a, "payloads"_a, "identity"_a)
        .def("get_values", valuesCall(&Client::getValues, "out_buffers"), "region"_a, "keys"_a, "outs"_a, "identity"_a)
        .def("erase", keysCall(&Client::erase), "region"_a, "keys"_a)
        .def("prefetch", keysCall(&Client::prefetch), "region"_a, "keys"_a)
        .def("stats_json", &Client::stats, py::call_guard<py::gil_scoped_release>())
        .def(
            "raw_call",
            [](Client& c, py::bytes const& payload) {
                std::string const request(payload);
                std::string reply;
                {
                    py::gil_scoped_release nogil;
                    reply = c.rawCall(request);
                }
                return py::bytes(reply);
            },
            "payload"_a, "Sends one request payload as is; returns the reply's payload (protocol tests).")
        .def_property_readonly("arena", &Client::arena)
        .def_property_readonly("client_id", &Client::clientId)
        .def_property_readonly("socket_bytes", &Client::socketBytes)
        .def_property_readonly("socket_path", &Client::socketPath);
}

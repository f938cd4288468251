// SPDX-License-Identifier: Apache-2.0
//
// The KV-cache manager's bindings (kvcodec_sdk._native.kvcm; its test hooks, ._native.kvcm_testing,
// are in kvcm_testing.cpp, the page handles' helpers in kvcm_handles.cpp): declarations and
// conversions only. Logic lives in csrc/src/kvcm.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kvcm/manager.h"
#include "kvcm/remote_level.h"
#include "kvcm/staging.h"
#include "kvcm_types.h"
#include "runtime/device_runtime.h"
#include "runtime/owned_codec.h"

using namespace pybind11::literals;

namespace py = pybind11;
using namespace kvcodec;
using namespace kvcodec::bindings;
using kvcm::CacheLevel;

namespace {

/// Raises the kvcodec_sdk.disk error class for a failed disk resize or defragmentation.
[[noreturn]] void raiseDiskError(kvcodec::disk::ResizeError const& e)
{
    py::module_ const facade = py::module_::import("kvcodec_sdk.disk");
    std::string const status = kvcodec::disk::statusName(e.code);
    py::object const cls = facade.attr("_ERRORS").attr("get")(status, facade.attr("DiskIoError"));
    py::object const error = cls(status, std::string(e.what()));
    PyErr_SetObject(cls.ptr(), error.ptr());
    throw py::error_already_set();
}

std::unique_ptr<runtime::DeviceRuntime> makeRuntime(int32_t device)
{
    return device < 0 ? runtime::createHostRuntime() : runtime::createCudaRuntime(device);
}

runtime::Stream toStream(uintptr_t handle)
{
    return reinterpret_cast<runtime::Stream>(handle);
}

std::pair<kvcm::PageId const*, size_t> pageIds(
    py::array_t<uint64_t, py::array::c_style | py::array::forcecast> const& ids)
{
    return {ids.data(), size_t(ids.size())};
}

// A level argument from Python: 0..2, named in the error.
CacheLevel levelArg(int32_t level, char const* field = "level")
{
    if (level < 0 || level >= kvcm::kNumLevels)
    {
        throw std::invalid_argument(std::string(field) + " is " + std::to_string(level)
            + "; valid levels are 0 (hot), 1 (host), 2 (disk) and 3 (remote)");
    }
    return CacheLevel(level);
}

// A pool group of a level from Python: an index into the level's grouping, named in the error.
PoolGroupIndex groupArg(kvcm::KvCacheManager const& m, int32_t level, int32_t group)
{
    CacheLevel const l = levelArg(level);
    size_t const n = m.storage().numPoolGroups(l);
    if (n == 0)
    {
        throw std::invalid_argument(std::string("level is ") + std::to_string(level) + " (" + kvcm::levelName(l)
            + "), which this manager does not have");
    }
    if (group < 0 || size_t(group) >= n)
    {
        throw std::invalid_argument("pool_group is " + std::to_string(group) + "; the " + kvcm::levelName(l)
            + " level has pool groups 0.." + std::to_string(n - 1));
    }
    return group;
}

// Enters a manager's mutex for one Python call: at once when it is free (or already held by
// this thread), else with the GIL released while waiting, so that the holder (a migration whose
// observer needs the GIL) can finish.
class PyGuard
{
public:
    PyGuard(kvcm::KvCacheManager const& m, char const* what)
    {
        guard_.emplace(m, what, std::try_to_lock);
        if (!guard_->entered())
        {
            guard_.reset();
            py::gil_scoped_release release;
            guard_.emplace(m, what);
        }
    }

private:
    std::optional<kvcm::KvCacheManager::CallGuard> guard_;
};

std::optional<CacheLevel> optionalLevel(std::optional<int32_t> level)
{
    return level ? std::optional<CacheLevel>(CacheLevel(*level)) : std::nullopt;
}

using PageIds = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;

/// The keys of a shared-level call, one lifecycle given per key (std::invalid_argument otherwise).
std::vector<std::string> keysWithLifeCycles(
    std::vector<py::bytes> const& keys, std::vector<int32_t> const& lifeCycles, char const* what)
{
    if (lifeCycles.size() != keys.size())
        throw std::invalid_argument(std::string(what) + ": one lifecycle per key");
    return {keys.begin(), keys.end()};
}

/// A manager method bound as it is (arguments `A...` from Python), called under PyGuard; `what`
/// names the call in its errors.
template <class... A, class Method>
auto guarded(char const* what, Method method)
{
    return [what, method](kvcm::KvCacheManager& m, A... a) {
        PyGuard guard(m, what);
        return std::invoke(method, m, a...);
    };
}

/// A manager method without arguments that may wait (for transfers or the remote worker):
/// called under PyGuard and without the GIL.
template <class Method>
auto guardedWithoutGil(char const* what, Method method)
{
    return [what, method](kvcm::KvCacheManager& m) {
        PyGuard guard(m, what);
        py::gil_scoped_release release;
        return std::invoke(method, m);
    };
}

/// What a ring of the manager is now, described by `describe`; nullopt (None) without one.
template <class Ring, class Describe>
auto describeRing(Ring const* ring, Describe describe) -> std::optional<decltype(describe(*ring))>
{
    if (ring == nullptr)
    {
        return std::nullopt;
    }
    return describe(*ring);
}

/// A manager method on an array of page ids (then `A...`), called under PyGuard.
template <class... A, class Method>
auto onPages(char const* what, Method method)
{
    return [what, method](kvcm::KvCacheManager& m, PageIds const& ids, A... a) {
        PyGuard guard(m, what);
        auto [p, n] = pageIds(ids);
        return std::invoke(method, m, p, n, a...);
    };
}

/// migrate and submit: page ids to a level on a stream, from `required_source` only when given;
/// called under PyGuard and without the GIL.
template <class Method>
auto migration(char const* what, Method method)
{
    return [what, method](kvcm::KvCacheManager& m, PageIds const& ids, int32_t level, uintptr_t stream,
               std::optional<int32_t> requiredSource) {
        PyGuard guard(m, what);
        auto [p, n] = pageIds(ids);
        py::gil_scoped_release release;
        m.maybeReattachShared(); // A public call starts here: nothing holds a host slot yet.
        return std::invoke(method, m, p, n, CacheLevel(level), toStream(stream), optionalLevel(requiredSource));
    };
}

// Deletes a manager from Python's deallocation (GIL held): its transfers in flight are waited
// for first with the GIL released (the I/O thread may need it for an observer), then the
// manager, and the Python observers it holds, go with the GIL held.
struct ManagerDeleter
{
    void operator()(kvcm::KvCacheManager* m) const noexcept
    {
        {
            py::gil_scoped_release release;
            try
            {
                m->synchronize();
                // Without the interpreter: the remote level's queue waits for its worker's jobs.
                m->closeTiers();
            }
            catch (std::exception const&)
            {
                // Closed already (nothing in flight), or a device error the destructor reports.
            }
        }
        delete m;
    }
};

py::dict statsDict(kvcm::PoolGroupStats const& s)
{
    py::dict d("pages_offloaded"_a = s.pagesOffloaded, "bytes_offloaded"_a = s.bytesOffloaded,
        "pages_onboarded"_a = s.pagesOnboarded, "bytes_onboarded"_a = s.bytesOnboarded,
        "pages_copied"_a = s.pagesCopied, "pages_dropped"_a = s.pagesDropped);
    static char const* const kReasons[kvcm::kNumDropReasons] = {nullptr, "bad_magic", "bad_format_version",
        "bad_header", "did_not_fit", "bad_checksum", "decode_failed", "bad_index", "missing", "disk_checksum"};
    py::dict reasons;
    for (int r = 1; r < kvcm::kNumDropReasons; ++r)
    {
        reasons[kReasons[r]] = s.droppedBy[size_t(r)];
    }
    d["dropped_by_reason"] = reasons;
    d["codec_calls"] = s.codecCalls;
    d["codec_seconds"] = s.codecSeconds;
    d["hot_bytes_offloaded"] = s.hotBytesOffloaded;
    d["hot_bytes_onboarded"] = s.hotBytesOnboarded;
    d["encode_calls"] = s.encodeCalls;
    d["decode_calls"] = s.decodeCalls;
    d["encode_seconds"] = s.encodeSeconds;
    d["decode_seconds"] = s.decodeSeconds;
    d["encode_gpu_calls"] = s.encodeGpuCalls;
    d["decode_gpu_calls"] = s.decodeGpuCalls;
    d["encode_gpu_seconds"] = s.encodeGpuSeconds;
    d["decode_gpu_seconds"] = s.decodeGpuSeconds;
    d["evictions"] = s.evictions;
    d["drops"] = s.drops;
    d["hits"] = s.hits;
    return d;
}

} // namespace

void bindKvcm(py::module_& m)
{
    py::module_ k = m.def_submodule("kvcm", "The KV-cache manager's C++ core.");
    static py::exception<kvcm::CapacityError> capacityError(k, "CapacityError", PyExc_RuntimeError);
    static py::exception<kvcm::StalePageError> staleError(k, "StalePageError", PyExc_ValueError);
    static py::object migrationError = py::exception<kvcm::MigrationError>(k, "MigrationError", PyExc_RuntimeError);
    k.attr("MigrationFailure") = migrationError; // The former name.
    py::register_exception_translator([](std::exception_ptr p) {
        try
        {
            if (p)
            {
                std::rethrow_exception(p);
            }
        }
        catch (kvcm::MigrationError const& e)
        {
            py::object error = migrationError(e.what());
            error.attr("committed_pages") = e.committedPages;
            PyErr_SetObject(migrationError.ptr(), error.ptr());
        }
        catch (kvcm::CapacityError const& e)
        {
            PyErr_SetString(capacityError.ptr(), e.what());
        }
        catch (kvcm::StalePageError const& e)
        {
            PyErr_SetString(staleError.ptr(), e.what());
        }
    });
    k.attr("MAX_PAIRS_PER_CALL") = kvcm::kMaxPairsPerCall;
    bindRemoteQueue(k);
    bindKvcmConfig(k);
    bindKvcmResults(k);

    py::class_<kvcm::KvCacheManager, std::unique_ptr<kvcm::KvCacheManager, ManagerDeleter>>(k, "KvcmCore")
        .def(py::init([](kvcm::KvcmConfig config, runtime::OwnedCodec* codec, int32_t device) {
            // Consumptive: the codec leaves the Python object before anything can fail.
            runtime::CodecPtr owned = codec ? codec->take() : runtime::CodecPtr();
            int32_t const codecDevice = codec ? codec->device() : device;
            if (codec && !owned)
            {
                throw std::invalid_argument("the native codec was already released or consumed");
            }
            return new kvcm::KvCacheManager(std::move(config), makeRuntime(device), std::move(owned), codecDevice);
        }),
            py::arg("config"), py::arg("codec").none(true), py::arg("device"))
        .def_property_readonly("device", [](kvcm::KvCacheManager& m) { return m.runtime().name(); })
        .def_property_readonly(
            "internal_stream", [](kvcm::KvCacheManager& m) { return reinterpret_cast<uintptr_t>(m.internalStream()); })
        .def(
            "allocate",
            [](kvcm::KvCacheManager& m, int32_t lc, size_t n, std::optional<uintptr_t> stream,
                std::optional<std::vector<std::string>> keys) {
                PyGuard guard(m, "allocate");
                if (keys && keys->size() != n)
                {
                    throw std::invalid_argument("keys has " + std::to_string(keys->size())
                        + " entries; it needs one per page (" + std::to_string(n) + ")");
                }
                py::array_t<uint64_t> out(static_cast<py::ssize_t>(n));
                std::optional<runtime::Stream> s;
                if (stream)
                {
                    s = toStream(*stream);
                }
                uint64_t* dst = out.mutable_data();
                py::gil_scoped_release release; // Eviction may wait for staged transfers.
                m.allocate(lc, n, dst, s, keys ? keys->data() : nullptr);
                return out;
            },
            py::arg("lifecycle"), py::arg("count"), py::arg("stream").none(true), py::arg("keys") = py::none(),
            "New hot pages; `keys` (bytes per page, b'' for none) are set atomically with the allocation.")
        .def("free",
            [](kvcm::KvCacheManager& m, py::array_t<uint64_t, py::array::c_style | py::array::forcecast> const& ids) {
                PyGuard guard(m, "free");
                auto [p, n] = pageIds(ids);
                py::gil_scoped_release release; // May wait for a staged transfer (remote worker).
                m.free(p, n);
            })
        .def("migrate", migration("migrate", &kvcm::KvCacheManager::migrate), py::arg("pages"), py::arg("level"),
            py::arg("stream"), py::arg("required_source").none(true) = py::none())
        .def("submit", migration("submit", &kvcm::KvCacheManager::submit), py::arg("pages"), py::arg("level"),
            py::arg("stream"), py::arg("required_source").none(true) = py::none(), py::keep_alive<0, 1>())
        .def(
            "prefetch",
            [](kvcm::KvCacheManager& m, py::array_t<uint64_t, py::array::c_style | py::array::forcecast> const& ids,
                uint64_t maxBytes) {
                PyGuard guard(m, "prefetch");
                auto [p, n] = pageIds(ids);
                py::gil_scoped_release release;
                return m.prefetch(p, n, maxBytes);
            },
            py::arg("pages"), py::arg("max_bytes"), py::keep_alive<0, 1>())
        .def("prefetch_stats", guarded("prefetch_stats", &kvcm::KvCacheManager::prefetchStats))
        .def("in_flight_transfers", guarded("in_flight_transfers", &kvcm::KvCacheManager::inFlightTransfers))
        .def("info", guarded<uint64_t>("info", &kvcm::KvCacheManager::info))
        .def("is_live", guarded<uint64_t>("is_live", &kvcm::KvCacheManager::isLive))
        .def("num_lifecycles", [](kvcm::KvCacheManager& m) { return m.storage().numLifeCycles(); })
        .def("has_level", [](kvcm::KvCacheManager& m, int32_t l) { return m.storage().hasLevel(CacheLevel(l)); })
        .def("mapping", [](kvcm::KvCacheManager& m, int32_t l) { return m.storage().mapping(levelArg(l)); })
        .def("num_pool_groups",
            [](kvcm::KvCacheManager& m, int32_t l) { return m.storage().numPoolGroups(levelArg(l)); })
        .def("slots",
            [](kvcm::KvCacheManager& m, int32_t l, int32_t g) {
                PyGuard guard(m, "slots");
                auto& pool = const_cast<kvcm::StorageManager&>(m.storage()).slots(CacheLevel(l), groupArg(m, l, g));
                return SlotCounts{pool.numSlots(), pool.freeSlots()};
            })
        .def("page_bytes",
            [](kvcm::KvCacheManager& m, int32_t l, int32_t g) {
                PyGuard guard(m, "page_bytes");
                return m.storage().pageBytes(CacheLevel(l), groupArg(m, l, g));
            })
        .def("lifecycle_info",
            [](kvcm::KvCacheManager& m, int32_t lc) {
                if (lc < 0 || size_t(lc) >= m.storage().numLifeCycles())
                {
                    throw std::invalid_argument("lifecycle is " + std::to_string(lc)
                        + "; configured layer groups are 0.." + std::to_string(m.storage().numLifeCycles() - 1));
                }
                return m.storage().lifeCycle(lc);
            })
        .def("hot_pools",
            [](kvcm::KvCacheManager& m, int32_t g) {
                PyGuard guard(m, "hot_pools");
                auto const& group = m.storage().hotGroups()[size_t(groupArg(m, 0, g))];
                std::vector<PoolDesc> out;
                for (size_t p = 0; p < group.pools.size(); ++p)
                {
                    // The whole reserve: views stay valid across resizes of the hot level.
                    out.push_back({const_cast<void*>(static_cast<void const*>(group.pools[p].data())),
                        group.slotBytes[p], group.capacitySlots});
                }
                return out;
            })
        .def("cold_pool",
            [](kvcm::KvCacheManager& m, int32_t l, int32_t g) {
                PyGuard guard(m, "cold_pool");
                if (levelArg(l) == CacheLevel::kHot)
                {
                    throw std::invalid_argument("level is 0 (hot); cold pools are at levels 1 (host) and 2 (disk)");
                }
                groupArg(m, l, g);
                kvcm::ColdLevel* cold = m.storage().coldLevel(CacheLevel(l));
                // The owner keeps this pool's memory allocated while a view holds it, even after
                // a resize replaced the pool (the view then shows the old pool, never freed memory).
                py::object owner = py::none();
                if (auto keep = cold->memoryOwner(g))
                {
                    owner = py::capsule(
                        new std::shared_ptr<void const>(std::move(keep)), "kvcodec.pool_owner", [](PyObject* capsule) {
                            delete static_cast<std::shared_ptr<void const>*>(
                                PyCapsule_GetPointer(capsule, "kvcodec.pool_owner"));
                        });
                }
                return ColdPool{reinterpret_cast<uintptr_t>(cold->accessibleBase(g)), cold->pageBytes(g),
                    cold->slots(g).numSlots(), owner};
            })
        .def("stats",
            [](kvcm::KvCacheManager& m, int32_t l) {
                PyGuard guard(m, "stats");
                py::list out;
                for (auto const& s : m.stats(levelArg(l)))
                {
                    out.append(statsDict(s));
                }
                return out;
            })
        .def("set_codec_gpu_timing", guarded<bool>("set_codec_gpu_timing", &kvcm::KvCacheManager::setCodecGpuTiming))
        .def("touch", onPages("touch", &kvcm::KvCacheManager::touch))
        .def("pin", onPages<bool>("pin", &kvcm::KvCacheManager::pin))
        .def("set_priority", onPages<int32_t>("set_priority", &kvcm::KvCacheManager::setPriority))
        .def("pins", guarded<uint64_t>("pins", &kvcm::KvCacheManager::pins))
        .def("peak",
            [](kvcm::KvCacheManager& m, int32_t l, int32_t g) {
                PyGuard guard(m, "peak");
                return const_cast<kvcm::StorageManager&>(m.storage())
                    .slots(CacheLevel(l), groupArg(m, l, g))
                    .peakUsedSlots();
            })
        .def("evictable",
            [](kvcm::KvCacheManager& m, int32_t l, int32_t g) {
                PyGuard guard(m, "evictable");
                return m.evictable(CacheLevel(l), groupArg(m, l, g));
            })
        .def(
            "make_room",
            [](kvcm::KvCacheManager& m, int32_t l, int32_t g, uint64_t slots, std::optional<uintptr_t> stream) {
                PyGuard guard(m, "make_room");
                std::optional<runtime::Stream> s;
                if (stream)
                {
                    s = toStream(*stream);
                }
                py::gil_scoped_release release; // Eviction may wait for staged transfers.
                m.makeRoom(CacheLevel(l), g, slots, s);
            },
            py::arg("level"), py::arg("group"), py::arg("slots"), py::arg("stream").none(true))
        .def(
            "resize",
            [](kvcm::KvCacheManager& m, int32_t l, uint64_t quota, std::optional<uintptr_t> stream) {
                PyGuard guard(m, "resize");
                std::optional<runtime::Stream> s;
                if (stream)
                {
                    s = toStream(*stream);
                }
                std::optional<disk::ResizeError> failed;
                {
                    py::gil_scoped_release release; // Waits for staged transfers first.
                    try
                    {
                        m.resize(CacheLevel(l), quota, s);
                    }
                    catch (disk::ResizeError const& e)
                    {
                        failed = e;
                    }
                }
                if (failed)
                {
                    raiseDiskError(*failed);
                }
            },
            py::arg("level"), py::arg("quota_bytes"), py::arg("stream").none(true))
        .def(
            "defragment",
            [](kvcm::KvCacheManager& m, int32_t l, std::optional<uintptr_t> stream) {
                PyGuard guard(m, "defragment");
                std::optional<runtime::Stream> s;
                if (stream)
                {
                    s = toStream(*stream);
                }
                try
                {
                    return m.defragment(CacheLevel(l), s);
                }
                catch (disk::ResizeError const& e)
                {
                    raiseDiskError(e);
                }
            },
            py::arg("level"), py::arg("stream").none(true))
        .def("hot_capacity_slots",
            [](kvcm::KvCacheManager& m, int32_t g) {
                PyGuard guard(m, "hot_capacity_slots");
                return m.hotCapacitySlots(groupArg(m, 0, g));
            })
        .def("quota",
            [](kvcm::KvCacheManager& m, int32_t l) {
                PyGuard guard(m, "quota");
                levelArg(l);
                auto const& c = m.storage().config();
                kvcm::DiskColdLevel const* disk = m.storage().diskLevel();
                if (l == int32_t(CacheLevel::kRemote))
                {
                    // Bytes of the pages the manager may track there (the store's capacity is its own).
                    uint64_t bytes = 0;
                    for (size_t g = 0; g < m.storage().numPoolGroups(CacheLevel::kRemote); ++g)
                    {
                        bytes += m.storage().pageBytes(CacheLevel::kRemote, PoolGroupIndex(g)) * c.remote.maxPages;
                    }
                    return bytes;
                }
                return l == 0 ? c.gpuQuotaBytes : l == 1 ? c.hostQuotaBytes : disk ? disk->quota() : c.disk.maxBytes;
            })
        .def("get_and_reset_iteration_peak_block_stats",
            [](kvcm::KvCacheManager& m, int32_t l) {
                PyGuard guard(m, "get_and_reset_iteration_peak_block_stats");
                std::vector<SlotPeak> out;
                for (auto const& [used, peak] : m.getAndResetIterationPeakBlockStats(levelArg(l)))
                {
                    out.push_back({used, peak});
                }
                return out;
            })
        .def("add_observer",
            [](kvcm::KvCacheManager& m, std::function<void(kvcm::MigrationRecord const&)> fn) {
                PyGuard guard(m, "add_observer");
                return m.addObserver([fn](kvcm::MigrationRecord const& r) {
                    py::gil_scoped_acquire gil;
                    try
                    {
                        fn(r);
                    }
                    catch (py::error_already_set const& e)
                    {
                        // Carried past the released GIL as a plain C++ error.
                        throw std::runtime_error(std::string("a migration observer raised: ") + e.what());
                    }
                });
            })
        .def("remove_observer", guarded<int64_t>("remove_observer", &kvcm::KvCacheManager::removeObserver))
        .def("index_ring",
            [](kvcm::KvCacheManager& m) {
                PyGuard guard(m, "index_ring");
                return describeRing(m.storage().indexRing(), [](auto const& ring) {
                    return IndexRingInfo{
                        ring.capacity(), reinterpret_cast<uintptr_t>(ring.base()), ring.cursor(), ring.liveLeases()};
                });
            })
        .def("synchronize", guardedWithoutGil("synchronize", &kvcm::KvCacheManager::synchronize))
        .def("set_key",
            [](kvcm::KvCacheManager& m, uint64_t id, py::bytes key) {
                PyGuard guard(m, "set_key");
                std::string k(key);
                py::gil_scoped_release release;
                m.setKey(id, k);
            })
        .def("key",
            [](kvcm::KvCacheManager& m, uint64_t id) {
                PyGuard guard(m, "key");
                return py::bytes(m.key(id));
            })
        .def("find_on_disk",
            [](kvcm::KvCacheManager& m, std::vector<py::bytes> const& keys) {
                PyGuard guard(m, "find_on_disk");
                std::vector<std::string> k(keys.begin(), keys.end());
                py::array_t<uint64_t> out(static_cast<py::ssize_t>(k.size()));
                m.findOnDisk(k.data(), k.size(), out.mutable_data());
                return out;
            })
        .def("find_shared",
            [](kvcm::KvCacheManager& m, std::vector<py::bytes> const& keys, std::vector<int32_t> const& lifeCycles) {
                PyGuard guard(m, "find_shared");
                std::vector<std::string> const k = keysWithLifeCycles(keys, lifeCycles, "find_shared");
                py::array_t<uint64_t> out(static_cast<py::ssize_t>(k.size()));
                uint64_t* ids = out.mutable_data();
                {
                    py::gil_scoped_release nogil; // The lookup waits for the daemon's answer.
                    m.findShared(k.data(), lifeCycles.data(), k.size(), ids);
                }
                return out;
            })
        .def("prefetch_shared",
            [](kvcm::KvCacheManager& m, std::vector<py::bytes> const& keys, std::vector<int32_t> const& lifeCycles) {
                PyGuard guard(m, "prefetch_shared");
                std::vector<std::string> const k = keysWithLifeCycles(keys, lifeCycles, "prefetch_shared");
                py::gil_scoped_release nogil;
                return m.prefetchShared(k.data(), lifeCycles.data(), k.size());
            })
        .def("shared_stats",
            [](kvcm::KvCacheManager& m) -> py::object {
                PyGuard guard(m, "shared_stats");
                auto const st = m.sharedStats();
                if (!st)
                    return py::none();
                py::dict d;
                d["connected"] = st->connected;
                d["published"] = st->counters.published;
                d["found"] = st->counters.found;
                d["missed"] = st->counters.missed;
                d["rejected"] = st->counters.rejected;
                d["released"] = st->counters.released;
                d["leased"] = st->counters.leased;
                d["short"] = st->counters.short_;
                d["reattached"] = st->reattached;
                return d;
            })
        .def("reattach_shared", guardedWithoutGil("reattach_shared", &kvcm::KvCacheManager::reattachShared))
        .def("forget_unclaimed_on_disk",
            guarded("forget_unclaimed_on_disk", &kvcm::KvCacheManager::forgetUnclaimedOnDisk))
        .def("unclaimed_on_disk", guarded("unclaimed_on_disk", &kvcm::KvCacheManager::unclaimedOnDisk))
        .def("page_ring",
            [](kvcm::KvCacheManager& m) {
                PyGuard guard(m, "page_ring");
                return describeRing(m.storage().pageRing(), [](auto const& ring) {
                    return PageRingInfo{ring.capacity(), int32_t(ring.kind()), ring.liveLeases()};
                });
            })
        .def("disk_region_stats",
            [](kvcm::KvCacheManager& m, int32_t g) {
                PyGuard guard(m, "disk_region_stats");
                auto const* disk = m.storage().diskLevel();
                if (disk == nullptr || g < 0 || size_t(g) >= disk->numPoolGroups())
                {
                    throw std::invalid_argument("pool_group is " + std::to_string(g) + "; the disk level has "
                        + std::to_string(disk ? disk->numPoolGroups() : 0) + " pool groups");
                }
                auto const& region = disk->region(g);
                auto const st = region.stats();
                auto const& rec = region.recovery();
                py::dict d("dir"_a = region.dir(), "slots_total"_a = st.slotsTotal, "slots_live"_a = st.slotsLive,
                    "puts"_a = st.puts, "put_errors"_a = st.putErrors, "reads"_a = st.reads,
                    "checksum_failures"_a = st.checksumFailures, "erases"_a = st.erases, "direct_io"_a = st.directIo,
                    "io_backend"_a = st.ioBackend, "io_backend_note"_a = st.backendNote, "merged_ios"_a = st.mergedIos,
                    "queued_submits"_a = st.queuedSubmits, "queued_requests"_a = st.queuedRequests,
                    "created"_a = rec.created, "invalidated"_a = rec.invalidated, "warnings"_a = rec.warnings);
                return d;
            })
        .def("close_disk", guardedWithoutGil("close_disk", &kvcm::KvCacheManager::closeDisk))
        // Without the GIL, the remote worker finishes its jobs meanwhile.
        .def("close_tiers", guardedWithoutGil("close", &kvcm::KvCacheManager::closeTiers))
        .def("remote_offers", &kvcm::KvCacheManager::remoteOffers,
            "Remote offers neither claimed nor withdrawn (0 between find_remote calls).")
        .def(
            "find_remote",
            [](kvcm::KvCacheManager& m, std::vector<py::bytes> const& keys, std::vector<int32_t> const& lifeCycles) {
                PyGuard guard(m, "find_remote");
                if (keys.size() != lifeCycles.size())
                {
                    throw std::invalid_argument("find_remote: " + std::to_string(lifeCycles.size()) + " lifecycles for "
                        + std::to_string(keys.size()) + " keys; give one per key");
                }
                std::vector<std::string> k(keys.begin(), keys.end());
                py::array_t<uint64_t> out(static_cast<py::ssize_t>(k.size()));
                uint64_t* dst = out.mutable_data();
                py::gil_scoped_release release;
                m.findRemote(k.data(), lifeCycles.data(), k.size(), dst);
                return out;
            },
            py::arg("keys"), py::arg("lifecycles"))
        .def_static(
            "remote_blob_name",
            [](py::bytes key, int32_t lifeCycle) {
                return py::bytes(kvcm::RemoteColdLevel::keyedName(std::string(key), lifeCycle));
            },
            py::arg("key"), py::arg("lifecycle"), "The store name of a keyed page's blob at the remote level.");
    k.def("page_ring_bytes", &kvcm::pageRingBytes, py::arg("max_cold_page_bytes"),
        "max(64 MiB, 3 * max_cold_page_bytes), the pinned page ring size (OverflowError past 64 bits).");
    k.def(
        "plain_keys",
        [](py::list const& keys) {
            for (py::handle k : keys)
            {
                if (!PyBytes_CheckExact(k.ptr()))
                    return false;
                Py_ssize_t const n = PyBytes_GET_SIZE(k.ptr());
                if (n < 1 || n > 254)
                    return false;
            }
            return true;
        },
        py::arg("keys"), "True when every item is a bytes object of 1..254 bytes (a lookup's keys as they are).");

    bindKvcmHandles(k);

    py::module_ t = m.def_submodule("kvcm_testing");
    bindKvcmTesting(t);
}

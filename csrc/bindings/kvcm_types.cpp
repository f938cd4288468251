// SPDX-License-Identifier: Apache-2.0
//
// Named fields for the KV-cache manager's configuration and query results (see kvcm_types.h).
#include "kvcm_types.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "kvcm/manager.h"
#include "kvcm/remote_level.h"

namespace kvcodec::bindings {

using kvcm::CacheLevel;

// The configuration structs of kvcm/config.h with named fields; kvcodec_sdk/_boundary.py fills them.
void bindKvcmConfig(py::module_& k)
{
    py::class_<kvcm::BufferConfig>(k, "BufferConfig", "One configured buffer of a page (kvcm::BufferConfig).")
        .def(py::init<>())
        .def_readwrite("layer", &kvcm::BufferConfig::layer)
        .def_property(
            "role", [](kvcm::BufferConfig const& b) { return int32_t(b.role); },
            [](kvcm::BufferConfig& b, int32_t v) { b.role = BufferRole(v); })
        .def_property(
            "dtype", [](kvcm::BufferConfig const& b) { return int32_t(b.dtype); },
            [](kvcm::BufferConfig& b, int32_t v) { b.dtype = DataType(v); })
        .def_readwrite("bytes", &kvcm::BufferConfig::bytes)
        .def_readwrite("tokens_per_page", &kvcm::BufferConfig::tokensPerPage)
        .def_readwrite("num_heads", &kvcm::BufferConfig::numHeads)
        .def_readwrite("head_dim", &kvcm::BufferConfig::headDim);

    py::class_<kvcm::LayerGroupConfig>(k, "LayerGroupConfig", "A layer group (kvcm::LayerGroupConfig).")
        .def(py::init<>())
        .def_readwrite("buffers", &kvcm::LayerGroupConfig::buffers);

    py::class_<kvcm::DiskTierConfig>(k, "DiskTierConfig", "The disk tier (kvcm::DiskTierConfig); an empty path: none.")
        .def(py::init<>())
        .def_readwrite("path", &kvcm::DiskTierConfig::path)
        .def_readwrite("max_bytes", &kvcm::DiskTierConfig::maxBytes)
        .def_readwrite("container_bytes", &kvcm::DiskTierConfig::containerBytes)
        .def_readwrite("io_mode", &kvcm::DiskTierConfig::ioMode)
        .def_readwrite("io_threads", &kvcm::DiskTierConfig::ioThreads)
        .def_readwrite("io_backend", &kvcm::DiskTierConfig::ioBackend)
        .def_readwrite("queue_depth", &kvcm::DiskTierConfig::queueDepth)
        .def_readwrite("codec_name", &kvcm::DiskTierConfig::codecName)
        .def_readwrite("format_version", &kvcm::DiskTierConfig::formatVersion)
        .def_readwrite("param_hash", &kvcm::DiskTierConfig::paramHash)
        .def_readwrite("params_json", &kvcm::DiskTierConfig::paramsJson)
        .def_readwrite("layout_json", &kvcm::DiskTierConfig::layoutJson)
        .def_readwrite("faults", &kvcm::DiskTierConfig::faults);

    py::class_<kvcm::KvcmConfig>(k, "KvcmConfig", "Everything the core needs (kvcm::KvcmConfig).")
        .def(py::init<>())
        .def_readwrite("layer_groups", &kvcm::KvcmConfig::layerGroups)
        .def_readwrite("gpu_quota_bytes", &kvcm::KvcmConfig::gpuQuotaBytes)
        .def_readwrite("max_gpu_quota_bytes", &kvcm::KvcmConfig::maxGpuQuotaBytes)
        .def_readwrite("host_quota_bytes", &kvcm::KvcmConfig::hostQuotaBytes)
        .def_readwrite("pool_ratio", &kvcm::KvcmConfig::poolRatio)
        .def_readwrite("min_hot_slots", &kvcm::KvcmConfig::minHotSlots)
        .def_readwrite("auto_evict", &kvcm::KvcmConfig::autoEvict)
        .def_readwrite("index_ring_bytes", &kvcm::KvcmConfig::indexRingBytes)
        .def_readwrite("envelope_format_version", &kvcm::KvcmConfig::envelopeFormatVersion)
        .def_readwrite("disk", &kvcm::KvcmConfig::disk)
        .def_readwrite("remote", &kvcm::KvcmConfig::remote)
        .def_readwrite("shared", &kvcm::KvcmConfig::shared);
}

// The remote level's hand-off to the worker thread that runs its store's client
// (kvcodec_sdk/remote/level.py). The worker takes jobs with the interpreter released while it
// waits, performs them with its backend and finishes them.
void bindRemoteQueue(py::module_& k)
{
    py::class_<kvcm::RemoteJob, std::shared_ptr<kvcm::RemoteJob>>(
        k, "RemoteJob", "One batch of store operations taken from a RemoteQueue (kvcm::RemoteJob).")
        .def_readonly("id", &kvcm::RemoteJob::id)
        .def_property_readonly("op", [](kvcm::RemoteJob const& j) { return int(j.op); })
        .def_property_readonly("names",
            [](kvcm::RemoteJob const& j) {
                py::list out;
                for (std::string const& n : j.names)
                {
                    out.append(py::bytes(n));
                }
                return out;
            })
        .def_property_readonly("buffers", [](kvcm::RemoteJob const& j) {
            // Views of the level's staging or host-tier memory, valid until the job is
            // finished: read-only for puts, writable for gets.
            py::list out;
            bool const readonly = j.op != kvcm::RemoteOp::kGet;
            for (size_t i = 0; i < j.buffers.size(); ++i)
            {
                out.append(py::memoryview::from_memory(
                    static_cast<void*>(j.buffers[i]), static_cast<py::ssize_t>(j.sizes[i]), readonly));
            }
            return out;
        });
    py::class_<kvcm::RemoteQueue, std::shared_ptr<kvcm::RemoteQueue>>(
        k, "RemoteQueue", "The remote level's jobs for its store's worker (kvcm::RemoteQueue).")
        .def(py::init<>())
        .def("take", &kvcm::RemoteQueue::take, py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
            "The next job, or None after timeout_s seconds or once the queue is closed.")
        .def("finish", &kvcm::RemoteQueue::finish, py::arg("id"), py::arg("results"), py::arg("error"),
            py::call_guard<py::gil_scoped_release>(),
            "Finishes a taken job: one result per name, or an error for the whole batch.")
        .def("close", &kvcm::RemoteQueue::close, py::arg("why"), py::call_guard<py::gil_scoped_release>(),
            "Fails the jobs not taken and later pushes; waits for the taken ones.")
        .def_property_readonly("closed", &kvcm::RemoteQueue::closed)
        .def_property_readonly("queued", &kvcm::RemoteQueue::queued)
        .def_property_readonly("taken", &kvcm::RemoteQueue::taken);
    py::class_<kvcm::SharedTierConfig>(
        k, "SharedTierConfig", "The shared host level (kvcm::SharedTierConfig); an empty socket path: none.")
        .def(py::init<>())
        .def_readwrite("socket_path", &kvcm::SharedTierConfig::socketPath)
        .def_readwrite("identity", &kvcm::SharedTierConfig::identity)
        .def_readwrite("region_slots", &kvcm::SharedTierConfig::regionSlots)
        .def_readwrite("verify_crc", &kvcm::SharedTierConfig::verifyCrc)
        .def_readwrite("timeout_s", &kvcm::SharedTierConfig::timeoutS)
        .def_readwrite("reattach_every_s", &kvcm::SharedTierConfig::reattachEveryS);
    py::class_<kvcm::RemoteTierConfig>(
        k, "RemoteTierConfig", "The remote tier (kvcm::RemoteTierConfig); 0 pages: none.")
        .def(py::init<>())
        .def_readwrite("max_pages", &kvcm::RemoteTierConfig::maxPages)
        .def_readwrite("queue", &kvcm::RemoteTierConfig::queue);
}

namespace {

py::array_t<uint64_t> pageArray(std::vector<kvcm::PageId> const& ids)
{
    py::array_t<uint64_t> out(static_cast<py::ssize_t>(ids.size()));
    std::copy(ids.begin(), ids.end(), out.mutable_data());
    return out;
}

} // namespace

// Query results with named, read-only fields.
void bindKvcmResults(py::module_& k)
{
    py::class_<kvcm::PageInfo>(k, "PageInfo", "Where a page is now (kvcm::PageInfo).")
        .def_readonly("lifecycle", &kvcm::PageInfo::lifeCycle)
        .def_property_readonly("level", [](kvcm::PageInfo const& i) { return int32_t(i.level); })
        .def_readonly("slot", &kvcm::PageInfo::slot)
        .def_readonly("pool_group", &kvcm::PageInfo::poolGroup)
        .def_readonly("in_flight", &kvcm::PageInfo::inFlight);

    py::class_<kvcm::MigrationResult>(k, "MigrationResult", "Outcome of migrate() (kvcm::MigrationResult).")
        .def_readonly("moved", &kvcm::MigrationResult::moved)
        .def_property_readonly("dropped", [](kvcm::MigrationResult const& r) { return pageArray(r.dropped); })
        .def_property_readonly("failed", [](kvcm::MigrationResult const& r) { return pageArray(r.failed); })
        .def_readonly("error", &kvcm::MigrationResult::error);

    py::class_<kvcm::PrefetchStats>(k, "PrefetchStats", "Prefetch counters (kvcm::PrefetchStats).")
        .def_readonly("issued", &kvcm::PrefetchStats::issued)
        .def_readonly("completed", &kvcm::PrefetchStats::completed)
        .def_readonly("used", &kvcm::PrefetchStats::used)
        .def_readonly("wasted", &kvcm::PrefetchStats::wasted)
        .def_readonly("skipped", &kvcm::PrefetchStats::skipped)
        .def_readonly("cancelled", &kvcm::PrefetchStats::cancelled)
        .def_readonly("failed", &kvcm::PrefetchStats::failed);

    // The GIL is released while these block: the I/O thread may need it for an observer.
    py::class_<kvcm::PendingMigration, std::shared_ptr<kvcm::PendingMigration>>(
        k, "PendingMigration", "A submitted migration (kvcm::PendingMigration); it keeps its KvcmCore alive.")
        .def("done", &kvcm::PendingMigration::done, py::call_guard<py::gil_scoped_release>())
        .def("wait", &kvcm::PendingMigration::wait, py::call_guard<py::gil_scoped_release>())
        .def("cancel", &kvcm::PendingMigration::cancel, py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("requested", &kvcm::PendingMigration::requested);

    py::class_<kvcm::MigrationRecord>(k, "MigrationRecord", "One submitted transfer (kvcm::MigrationRecord).")
        .def_property_readonly("src_level", [](kvcm::MigrationRecord const& r) { return int32_t(r.srcLevel); })
        .def_property_readonly("dst_level", [](kvcm::MigrationRecord const& r) { return int32_t(r.dstLevel); })
        .def_readonly("src_pool_group", &kvcm::MigrationRecord::srcPoolGroup)
        .def_readonly("dst_pool_group", &kvcm::MigrationRecord::dstPoolGroup)
        .def_readonly("batching_representative", &kvcm::MigrationRecord::batchingRepresentative)
        .def_readonly("pages", &kvcm::MigrationRecord::pages)
        .def_readonly("bytes", &kvcm::MigrationRecord::bytes);

    py::class_<kvcm::LifeCycleInfo>(
        k, "LifeCycleInfo", "What the manager knows about a lifecycle (kvcm::LifeCycleInfo).")
        .def_readonly("hot_page_bytes", &kvcm::LifeCycleInfo::hotPageBytes)
        .def_readonly("cold_page_bytes", &kvcm::LifeCycleInfo::coldPageBytes)
        .def_readonly("batching_representative", &kvcm::LifeCycleInfo::batchingRepresentative)
        .def_property_readonly("page_index_location", [](kvcm::LifeCycleInfo const& i) { return int32_t(i.location); })
        .def_property_readonly("buffers", [](kvcm::LifeCycleInfo const& i) { return i.layout.buffers; });

    py::class_<SlotCounts>(k, "SlotCounts", "Slots and free slots of a pool group.")
        .def_readonly("num_slots", &SlotCounts::numSlots)
        .def_readonly("free_slots", &SlotCounts::freeSlots);

    py::class_<SlotPeak>(k, "SlotPeak", "Used slots now and their peak since the last reset.")
        .def_readonly("used_slots", &SlotPeak::usedSlots)
        .def_readonly("peak_used_slots", &SlotPeak::peakUsedSlots);

    py::class_<ColdPool>(k, "ColdPool", "A cold pool's accessible memory: page_bytes per slot.")
        .def_readonly("base", &ColdPool::base)
        .def_readonly("page_bytes", &ColdPool::pageBytes)
        .def_readonly("num_slots", &ColdPool::numSlots)
        .def_readonly("owner", &ColdPool::owner);

    py::class_<IndexRingInfo>(k, "IndexRingInfo", "The device index ring.")
        .def_readonly("capacity", &IndexRingInfo::capacity)
        .def_readonly("base", &IndexRingInfo::base)
        .def_readonly("cursor", &IndexRingInfo::cursor)
        .def_readonly("live_leases", &IndexRingInfo::liveLeases);

    py::class_<PageRingInfo>(k, "PageRingInfo", "The pinned page ring staging disk transfers.")
        .def_readonly("capacity", &PageRingInfo::capacity)
        .def_readonly("kind", &PageRingInfo::kind)
        .def_readonly("live_leases", &PageRingInfo::liveLeases);
}

} // namespace kvcodec::bindings

// SPDX-License-Identifier: Apache-2.0
//
// Bindings of the disk cold tier (kvcodec_sdk._native.disk): declarations and conversions only.
// The Python facade is kvcodec_sdk/disk.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvcodec/crc32c.h"
#include "tiers/disk/disk_region.h"

namespace py = pybind11;
using namespace kvcodec::disk;
using kvcodec::crc32cFast;
using kvcodec::crc32cHardware;
using kvcodec::crc32cHardwareAvailable;
using kvcodec::crc32cSlicing8;

namespace {

py::dict pageDict(PageInfo const& p)
{
    py::dict d;
    d["key"] = py::bytes(p.key);
    d["container"] = p.container;
    d["slot"] = p.slot;
    d["tag"] = p.tag;
    d["crc"] = p.crc;
    d["seq"] = p.seq;
    return d;
}

std::pair<void*, size_t> bufferOf(py::buffer const& b, bool writable, char const* what)
{
    py::buffer_info info = b.request(writable);
    if (!PyBuffer_IsContiguous(info.view(), 'C'))
        throw py::value_error(std::string(what) + " must be a C-contiguous buffer");
    return {info.ptr, size_t(info.size) * size_t(info.itemsize)};
}

/// Messages as str; bytes from a damaged file that are not UTF-8 appear as backslash escapes.
py::list textList(std::vector<std::string> const& messages)
{
    py::list out;
    for (auto const& m : messages)
    {
        PyObject* s = PyUnicode_DecodeUTF8(m.data(), Py_ssize_t(m.size()), "backslashreplace");
        if (s == nullptr)
            throw py::error_already_set();
        out.append(py::reinterpret_steal<py::str>(s));
    }
    return out;
}

/// A Python progress callback for a resize that runs without the GIL.
ResizeProgress progressOf(std::optional<py::function> const& fn)
{
    if (!fn)
        return {};
    py::function f = *fn;
    return [f](uint64_t done, uint64_t total) {
        py::gil_scoped_acquire gil;
        f(done, total);
    };
}

py::dict reportDict(ResizeReport const& r)
{
    py::dict d;
    d["containers_before"] = r.containersBefore;
    d["containers_after"] = r.containersAfter;
    d["moved"] = r.moved;
    d["dropped"] = r.dropped;
    d["checksum_drops"] = r.checksumDrops;
    return d;
}

/// The facade raises the DiskTierError subclass named by "status".
py::dict failureDict(ResizeError const& e)
{
    py::dict d;
    d["status"] = std::string(statusName(e.code));
    d["error"] = std::string(e.what());
    return d;
}
} // namespace

void bindDisk(py::module_& parent)
{
    py::module_ m = parent.def_submodule("disk", "The disk cold tier (crash-safe tablespace store).");

    py::class_<Status>(m, "Status", "A ticket's outcome (disk::Status); status is the code's name.")
        .def_property_readonly("status", [](Status const& s) { return std::string(statusName(s.code)); })
        .def_readonly("message", &Status::message)
        .def_readonly("tag", &Status::tag);

    py::class_<FaultRule>(m, "FaultRule", "A test-only I/O fault rule (disk::FaultRule).")
        .def(py::init<>())
        .def_readwrite("op", &FaultRule::op)
        .def_readwrite("path_contains", &FaultRule::pathContains)
        .def_readwrite("after_ops", &FaultRule::afterOps)
        .def_readwrite("error", &FaultRule::error)
        .def_readwrite("torn", &FaultRule::torn)
        .def_readwrite("count", &FaultRule::count)
        .def_readwrite("delay_us", &FaultRule::delayUs);

    m.def(
        "crc32c",
        [](py::buffer b, uint32_t crc) {
            auto [p, n] = bufferOf(b, false, "data");
            return crc32cFast(p, n, crc);
        },
        py::arg("data"), py::arg("crc") = 0, "CRC-32C, hardware-accelerated where the CPU allows.");
    m.def(
        "crc32c_slicing8",
        [](py::buffer b, uint32_t crc) {
            auto [p, n] = bufferOf(b, false, "data");
            return crc32cSlicing8(p, n, crc);
        },
        py::arg("data"), py::arg("crc") = 0, "CRC-32C, portable slicing-by-8.");
    m.def(
        "crc32c_hardware",
        [](py::buffer b, uint32_t crc) {
            if (!crc32cHardwareAvailable())
                throw std::runtime_error("this CPU has no SSE4.2 crc32 instruction");
            auto [p, n] = bufferOf(b, false, "data");
            return crc32cHardware(p, n, crc);
        },
        py::arg("data"), py::arg("crc") = 0, "CRC-32C with SSE4.2 (raises without it).");
    m.def("crc32c_hardware_available", &crc32cHardwareAvailable);

    m.def(
        "read_region_file",
        [](std::string const& dir) {
            py::dict d;
            for (auto const& [k, v] : DiskRegion::readRegionFile(dir))
                d[py::str(k)] = v;
            return d;
        },
        py::arg("dir"), "The fields of DIR/region.json as strings.");

    py::class_<DiskRegion>(m, "DiskRegion", "A disk tier region (see kvcodec_sdk.disk.DiskRegion).")
        .def(py::init([](std::string const& dir, std::string const& name, uint64_t slotBytes, uint64_t maxBytes,
                          uint64_t containerBytes, std::string const& codecName, uint32_t formatVersion,
                          std::string const& paramHash, std::string const& paramsJson, int ioMode, int whenFull,
                          uint32_t ioThreads, uint64_t snapshotEvery, uint32_t maxBatch, std::string const& layoutJson,
                          bool readOnly, std::vector<FaultRule> faults, int ioBackend, uint32_t queueDepth) {
            RegionConfig c;
            c.name = name;
            c.slotBytes = slotBytes;
            c.maxBytes = maxBytes;
            c.containerBytes = containerBytes;
            c.codec = {codecName, formatVersion, paramHash, paramsJson};
            c.ioMode = IoMode(ioMode);
            c.whenFull = FullPolicy(whenFull);
            c.ioThreads = ioThreads;
            c.ioBackend = IoBackend(ioBackend);
            c.queueDepth = queueDepth;
            c.snapshotEveryRecords = snapshotEvery;
            c.maxBatchRecords = maxBatch;
            c.layoutJson = layoutJson;
            c.readOnly = readOnly;
            if (!faults.empty())
                c.fileIo = faultyFileIo(std::move(faults));
            py::gil_scoped_release release;
            return DiskRegion::open(dir, std::move(c)).release();
        }),
            py::arg("dir"), py::arg("name"), py::arg("slot_bytes"), py::arg("max_bytes"), py::arg("container_bytes"),
            py::arg("codec_name"), py::arg("format_version"), py::arg("param_hash"), py::arg("params_json"),
            py::arg("io_mode"), py::arg("when_full"), py::arg("io_threads"), py::arg("snapshot_every"),
            py::arg("max_batch"), py::arg("layout_json"), py::arg("read_only"), py::arg("faults"),
            py::arg("io_backend") = 1, py::arg("queue_depth") = 8)
        .def(
            "submit_write",
            [](DiskRegion& r, py::bytes const& key, py::buffer const& data, uint32_t tag) {
                auto [p, n] = bufferOf(data, false, "data");
                return r.submitWrite(std::string(key), p, n, tag);
            },
            py::arg("key"), py::arg("data"), py::arg("tag") = 0)
        .def(
            "submit_write_ptr",
            [](DiskRegion& r, py::bytes const& key, uintptr_t src, size_t n, uint32_t tag) {
                return r.submitWrite(std::string(key), reinterpret_cast<void const*>(src), n, tag);
            },
            py::arg("key"), py::arg("src"), py::arg("nbytes"), py::arg("tag") = 0)
        .def(
            "submit_read",
            [](DiskRegion& r, py::bytes const& key, py::buffer const& out) {
                auto [p, n] = bufferOf(out, true, "out");
                return r.submitRead(std::string(key), p, n);
            },
            py::arg("key"), py::arg("out"))
        .def(
            "submit_read_ptr",
            [](DiskRegion& r, py::bytes const& key, uintptr_t dst, size_t n) {
                return r.submitRead(std::string(key), reinterpret_cast<void*>(dst), n);
            },
            py::arg("key"), py::arg("dst"), py::arg("nbytes"))
        .def(
            "submit_erase", [](DiskRegion& r, py::bytes const& key) { return r.submitErase(std::string(key)); },
            py::arg("key"))
        .def(
            "poll", [](DiskRegion& r, Ticket t) { return r.poll(t); }, py::arg("ticket"))
        .def(
            "wait",
            [](DiskRegion& r, Ticket t, double timeout) {
                Status s;
                {
                    py::gil_scoped_release release;
                    s = r.wait(t, timeout);
                }
                return s;
            },
            py::arg("ticket"), py::arg("timeout") = -1.0)
        .def("flush", &DiskRegion::flush, py::call_guard<py::gil_scoped_release>())
        .def("snapshot", &DiskRegion::snapshot, py::call_guard<py::gil_scoped_release>())
        .def("close", &DiskRegion::close, py::call_guard<py::gil_scoped_release>())
        .def("drain_events", [](DiskRegion& r) { return textList(r.drainEvents()); })
        .def("contains", [](DiskRegion const& r, py::bytes const& key) { return r.contains(std::string(key)); })
        .def("lookup",
            [](DiskRegion const& r, py::bytes const& key) -> py::object {
                auto p = r.lookup(std::string(key));
                return p ? py::object(pageDict(*p)) : py::object(py::none());
            })
        .def("pages",
            [](DiskRegion const& r) {
                py::list out;
                for (auto const& p : r.pages())
                    out.append(pageDict(p));
                return out;
            })
        .def("stats",
            [](DiskRegion const& r) {
                RegionStats s = r.stats();
                py::dict d;
                d["slots_total"] = s.slotsTotal;
                d["slots_live"] = s.slotsLive;
                d["slots_free"] = s.slotsFree;
                d["puts"] = s.puts;
                d["put_errors"] = s.putErrors;
                d["puts_refused_full"] = s.putsRefusedFull;
                d["reads"] = s.reads;
                d["hits"] = s.hits;
                d["misses"] = s.misses;
                d["checksum_failures"] = s.checksumFailures;
                d["read_errors"] = s.readErrors;
                d["erases"] = s.erases;
                d["evictions"] = s.evictions;
                d["journal_records"] = s.journalRecords;
                d["journal_batches"] = s.journalBatches;
                d["journal_bytes"] = s.journalBytes;
                d["snapshots"] = s.snapshots;
                d["last_seq"] = s.lastSeq;
                d["bytes_written"] = s.bytesWritten;
                d["bytes_read"] = s.bytesRead;
                d["merged_ios"] = s.mergedIos;
                d["merged_slots"] = s.mergedSlots;
                d["direct_io"] = s.directIo;
                d["io_backend"] = s.ioBackend;
                d["io_backend_note"] = s.backendNote;
                d["queued_submits"] = s.queuedSubmits;
                d["queued_requests"] = s.queuedRequests;
                d["failed"] = s.failed;
                return d;
            })
        .def("recovery",
            [](DiskRegion const& r) {
                RecoveryReport const& x = r.recovery();
                py::dict d;
                d["snapshot_used"] = x.snapshotUsed;
                d["snapshot_seq"] = x.snapshotSeq;
                d["snapshot_entries"] = x.snapshotEntries;
                d["journal_records_replayed"] = x.journalRecordsReplayed;
                d["journal_corrupt_lines"] = x.journalCorruptLines;
                d["truncated_tail_bytes"] = x.truncatedTailBytes;
                d["dropped_entries"] = x.droppedEntries;
                d["created"] = x.created;
                d["invalidated"] = x.invalidated;
                d["seconds"] = x.seconds;
                d["warnings"] = textList(x.warnings);
                return d;
            })
        .def_property_readonly("slot_bytes", &DiskRegion::slotBytes)
        .def_property_readonly("slot_stride", &DiskRegion::slotStride)
        .def_property_readonly("slots_per_container", &DiskRegion::slotsPerContainer)
        .def_property_readonly("num_containers", &DiskRegion::numContainers)
        .def_property_readonly("container_bytes", [](DiskRegion const& r) { return r.config().containerBytes; })
        .def(
            "resize",
            [](DiskRegion& r, uint32_t containers, std::optional<py::function> progress, bool dropOldest,
                uint32_t batchPages) {
                try
                {
                    py::gil_scoped_release release;
                    ResizeReport const rep = r.resize(containers, progressOf(progress), dropOldest, batchPages);
                    py::gil_scoped_acquire gil;
                    return reportDict(rep);
                }
                catch (ResizeError const& e)
                {
                    return failureDict(e);
                }
            },
            py::arg("containers"), py::arg("progress").none(true), py::arg("drop_oldest"), py::arg("batch_pages"))
        .def(
            "defragment",
            [](DiskRegion& r, std::optional<py::function> progress, uint32_t batchPages) {
                try
                {
                    py::gil_scoped_release release;
                    ResizeReport const rep = r.defragment(progressOf(progress), batchPages);
                    py::gil_scoped_acquire gil;
                    return reportDict(rep);
                }
                catch (ResizeError const& e)
                {
                    return failureDict(e);
                }
            },
            py::arg("progress").none(true), py::arg("batch_pages"))
        .def_property_readonly("dir", &DiskRegion::dir)
        .def_property_readonly("name", [](DiskRegion const& r) { return r.config().name; })
        .def_property_readonly("codec_name", [](DiskRegion const& r) { return r.config().codec.name; })
        .def_property_readonly(
            "codec_format_version", [](DiskRegion const& r) { return r.config().codec.formatVersion; })
        .def_property_readonly("codec_param_hash", [](DiskRegion const& r) { return r.config().codec.paramHash; })
        .def_property_readonly("codec_params_json", [](DiskRegion const& r) { return r.config().codec.paramsJson; })
        .def_property_readonly("layout_json", [](DiskRegion const& r) { return r.config().layoutJson; });
}

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

using namespace pybind11::literals;

namespace py = pybind11;
using namespace kvcodec::disk;
using kvcodec::crc32cFast;
using kvcodec::crc32cHardware;
using kvcodec::crc32cHardwareAvailable;
using kvcodec::crc32cSlicing8;

namespace {

py::dict pageDict(PageInfo const& p)
{
    py::dict d("key"_a = py::bytes(p.key), "container"_a = p.container, "slot"_a = p.slot, "tag"_a = p.tag,
        "crc"_a = p.crc, "seq"_a = p.seq);
    return d;
}

std::pair<void*, size_t> bufferOf(py::buffer const& b, bool writable, char const* what)
{
    py::buffer_info info = b.request(writable);
    if (!PyBuffer_IsContiguous(info.view(), 'C'))
        throw py::value_error(std::string(what) + " must be a C-contiguous buffer");
    return {info.ptr, size_t(info.size) * size_t(info.itemsize)};
}

/// Buffers of at least this many bytes are checksummed without the GIL (other threads go on
/// meanwhile); below it, releasing and taking the lock back costs more than it frees.
constexpr size_t kNoGilBytes = size_t(64) << 10;

/// The CRC-32C of a buffer by one of the implementations bound below.
template <uint32_t (*Crc)(void const*, size_t, uint32_t) noexcept>
uint32_t crcOfBuffer(py::buffer const& b, uint32_t crc)
{
    auto [p, n] = bufferOf(b, false, "data");
    if (n < kNoGilBytes)
        return Crc(p, n, crc);
    py::gil_scoped_release nogil;
    return Crc(p, n, crc);
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
    py::dict d("containers_before"_a = r.containersBefore, "containers_after"_a = r.containersAfter,
        "moved"_a = r.moved, "dropped"_a = r.dropped, "checksum_drops"_a = r.checksumDrops);
    return d;
}

/// The facade raises the DiskTierError subclass named by "status".
py::dict failureDict(ResizeError const& e)
{
    py::dict d("status"_a = std::string(statusName(e.code)), "error"_a = std::string(e.what()));
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

    m.def("crc32c", &crcOfBuffer<crc32cFast>, py::arg("data"), py::arg("crc") = 0,
        "CRC-32C, hardware-accelerated where the CPU allows.");
    m.def("crc32c_slicing8", &crcOfBuffer<crc32cSlicing8>, py::arg("data"), py::arg("crc") = 0,
        "CRC-32C, portable slicing-by-8.");
    m.def(
        "crc32c_hardware",
        [](py::buffer const& b, uint32_t crc) {
            if (!crc32cHardwareAvailable())
                throw std::runtime_error("this CPU has no SSE4.2 crc32 instruction");
            return crcOfBuffer<crc32cHardware>(b, crc);
        },
        py::arg("data"), py::arg("crc") = 0, "CRC-32C with SSE4.2 (raises without it).");
    m.def("crc32c_hardware_available", &crc32cHardwareAvailable);
    m.def("crc32c_fold_available", &kvcodec::crc32cFoldAvailable,
        "True when crc32c() and crc32c_copy() fold buffers of 512 bytes and more with AVX-512 "
        "carry-less multiplies.");
    m.def(
        "crc32c_copy",
        [](py::buffer const& dst, py::buffer const& src, uint32_t crc) {
            auto [d, dn] = bufferOf(dst, true, "dst");
            auto [s, sn] = bufferOf(src, false, "src");
            if (dn < sn)
                throw py::value_error("dst holds " + std::to_string(dn) + " bytes; src has " + std::to_string(sn)
                    + ": dst must hold at least as many");
            if (sn < kNoGilBytes)
                return kvcodec::crc32cCopy(d, s, sn, crc);
            py::gil_scoped_release nogil;
            return kvcodec::crc32cCopy(d, s, sn, crc);
        },
        py::arg("dst"), py::arg("src"), py::arg("crc") = 0,
        "Copies src into the start of dst (not overlapping) and returns src's CRC-32C (one pass: a "
        "checked copy).");

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
                py::dict d("slots_total"_a = s.slotsTotal, "slots_live"_a = s.slotsLive, "slots_free"_a = s.slotsFree,
                    "puts"_a = s.puts, "put_errors"_a = s.putErrors, "puts_refused_full"_a = s.putsRefusedFull,
                    "reads"_a = s.reads, "hits"_a = s.hits, "misses"_a = s.misses,
                    "checksum_failures"_a = s.checksumFailures, "read_errors"_a = s.readErrors, "erases"_a = s.erases,
                    "evictions"_a = s.evictions, "journal_records"_a = s.journalRecords,
                    "journal_batches"_a = s.journalBatches, "journal_bytes"_a = s.journalBytes,
                    "snapshots"_a = s.snapshots, "last_seq"_a = s.lastSeq, "bytes_written"_a = s.bytesWritten,
                    "bytes_read"_a = s.bytesRead, "merged_ios"_a = s.mergedIos, "merged_slots"_a = s.mergedSlots,
                    "direct_io"_a = s.directIo, "io_backend"_a = s.ioBackend, "io_backend_note"_a = s.backendNote,
                    "queued_submits"_a = s.queuedSubmits, "queued_requests"_a = s.queuedRequests,
                    "failed"_a = s.failed);
                return d;
            })
        .def("recovery",
            [](DiskRegion const& r) {
                RecoveryReport const& x = r.recovery();
                py::dict d("snapshot_used"_a = x.snapshotUsed, "snapshot_seq"_a = x.snapshotSeq,
                    "snapshot_entries"_a = x.snapshotEntries, "journal_records_replayed"_a = x.journalRecordsReplayed,
                    "journal_corrupt_lines"_a = x.journalCorruptLines, "truncated_tail_bytes"_a = x.truncatedTailBytes,
                    "dropped_entries"_a = x.droppedEntries, "created"_a = x.created, "invalidated"_a = x.invalidated,
                    "seconds"_a = x.seconds, "warnings"_a = textList(x.warnings));
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

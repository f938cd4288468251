// SPDX-License-Identifier: Apache-2.0
//
// The KV-cache manager's test hooks (kvcodec_sdk._native.kvcm_testing): the test codec, the
// recording runtime and a harness around one staging ring, for tests/ only.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvcm/staging.h"
#include "kvcm/testing/recording_runtime.h"
#include "kvcm/testing/test_codec.h"
#include "kvcm_types.h"
#include "runtime/device_runtime.h"

namespace py = pybind11;
using namespace kvcodec;

namespace {

runtime::Stream toStream(uintptr_t handle)
{
    return reinterpret_cast<runtime::Stream>(handle);
}

// Staging manager under a recording runtime, with leases held by id (tests only).
class StagingHarness
{
public:
    StagingHarness(size_t capacity, std::string const& kind)
    {
        runtime_ = std::make_unique<kvcm::testing::RecordingRuntime>();
        kvcm::StagingManager::Backing backing = kind == "host"
            ? kvcm::StagingManager::Backing(runtime::HostMem(*runtime_, capacity))
            : kvcm::StagingManager::Backing(runtime::DeviceMem(*runtime_, capacity));
        manager_ = std::make_unique<kvcm::StagingManager>(*runtime_, std::move(backing));
    }

    std::optional<int64_t> acquire(
        size_t minBytes, size_t maxBytes, size_t granularity, size_t alignment, std::optional<uintptr_t> stream)
    {
        std::optional<runtime::Stream> owner;
        if (stream)
        {
            owner = toStream(*stream);
        }
        auto lease = live().acquire(minBytes, maxBytes, granularity, alignment, owner);
        if (!lease)
        {
            return std::nullopt;
        }
        int64_t const id = next_++;
        leases_.emplace(id, std::move(*lease));
        return id;
    }

    kvcm::StagingBuffer& lease(int64_t id)
    {
        auto it = leases_.find(id);
        if (it == leases_.end())
        {
            throw py::key_error("no live lease " + std::to_string(id));
        }
        return it->second;
    }

    void release(int64_t id)
    {
        lease(id);
        leases_.erase(id);
    }

    kvcm::StagingManager& live()
    {
        if (!manager_)
        {
            throw std::runtime_error("the staging manager was closed");
        }
        return *manager_;
    }

    void close()
    {
        leases_.clear();
        manager_.reset();
    }

    std::unique_ptr<kvcm::testing::RecordingRuntime> runtime_;
    std::unique_ptr<kvcm::StagingManager> manager_;
    std::map<int64_t, kvcm::StagingBuffer> leases_;
    int64_t next_ = 1;
};

// What the staging harness reports, with named fields.
struct LeaseInfo
{
    size_t offset = 0;
    size_t size = 0;
    std::optional<uintptr_t> stream;
    uintptr_t dataOffset = 0; ///< data() - base(): where the lease's bytes start in the backing.
};

struct StagingRange
{
    size_t offset = 0;
    size_t size = 0;
    bool live = false;
    int64_t event = 0; ///< Id of the retired range's event (0: nothing outstanding).
};

} // namespace

void kvcodec::bindings::bindKvcmTesting(py::module_& t)
{
    t.doc() = "Test support of the KV-cache manager: a knob-driven CPU codec and a staging harness.";
    py::class_<kvcm::testing::CodecCall>(t, "CodecCall", "One encode/decode call of the test codec.")
        .def_property_readonly("kind", [](kvcm::testing::CodecCall const& c) { return c.encode ? "encode" : "decode"; })
        .def_readonly("lifecycle", &kvcm::testing::CodecCall::lifeCycle)
        .def_readonly("pages", &kvcm::testing::CodecCall::pages)
        .def_readonly("indices", &kvcm::testing::CodecCall::indices)
        .def_readonly("thread", &kvcm::testing::CodecCall::thread, "the OS thread id (threading.get_native_id())")
        .def_readonly("overlapped", &kvcm::testing::CodecCall::overlapped,
            "another test-codec call was running when this one began");
    py::class_<LeaseInfo>(t, "LeaseInfo", "A live staging lease.")
        .def_readonly("offset", &LeaseInfo::offset)
        .def_readonly("size", &LeaseInfo::size)
        .def_readonly("stream", &LeaseInfo::stream)
        .def_readonly("data_offset", &LeaseInfo::dataOffset);
    py::class_<StagingRange>(t, "StagingRange", "A range of the staging ring.")
        .def_readonly("offset", &StagingRange::offset)
        .def_readonly("size", &StagingRange::size)
        .def_readonly("live", &StagingRange::live)
        .def_readonly("event", &StagingRange::event);
    py::class_<kvcm::testing::RuntimeOp>(t, "RuntimeOp", "One logged operation of the recording runtime.")
        .def_readonly("op", &kvcm::testing::RuntimeOp::op)
        .def_readonly("event", &kvcm::testing::RuntimeOp::event)
        .def_readonly("stream", &kvcm::testing::RuntimeOp::stream);

    t.def(
        "test_codec_factory",
        [](uint32_t abiVersion) {
            return py::capsule(const_cast<KvcodecCodecFactory*>(kvcm::testing::testCodecFactory(abiVersion)),
                KVCODEC_FACTORY_CAPSULE_NAME);
        },
        py::arg("abi_version") = KVCODEC_PLUGIN_ABI_VERSION);
    t.def("fail_codec_calls_after", &kvcm::testing::failCodecCallsAfter, py::arg("after"));
    t.def("codec_calls", [] { return kvcm::testing::codecCalls(); });
    t.def("hold_encodes", &kvcm::testing::holdEncodes, py::arg("us"),
        "every later test-codec encode sleeps `us` microseconds first (0: off)");
    t.def("hold_decodes", &kvcm::testing::holdDecodes, py::arg("us"),
        "every later test-codec decode sleeps `us` microseconds first (0: off)");
    t.def("clear_codec_calls", &kvcm::testing::clearCodecCalls);
    t.def(
        "strided_crcs",
        [](int32_t device, py::bytes const& data, uint64_t stride, std::vector<uint32_t> const& lengths) {
            // The runtime's checksums() as the manager calls it: blobs in device memory (host
            // memory for device -1), lengths and results in mapped host memory.
            std::string const bytes = data;
            if (stride == 0 || lengths.size() * stride > bytes.size())
            {
                throw std::invalid_argument("strided_crcs: len(lengths) * stride must fit in data");
            }
            for (uint32_t length : lengths)
            {
                if (length > stride)
                {
                    throw std::invalid_argument("strided_crcs: every length must be at most stride");
                }
            }
            std::unique_ptr<runtime::DeviceRuntime> rt
                = device < 0 ? runtime::createHostRuntime() : runtime::createCudaRuntime(device);
            size_t const n = lengths.size();
            runtime::Allocation blobs(*rt, runtime::MemoryKind::kDevice, std::max<size_t>(1, bytes.size()));
            runtime::Allocation words(*rt, runtime::MemoryKind::kMappedHost, std::max<size_t>(1, 8 * n));
            auto* lens = reinterpret_cast<uint32_t*>(words.data());
            std::copy(lengths.begin(), lengths.end(), lens);
            runtime::Allocation host(*rt, runtime::MemoryKind::kMappedHost, std::max<size_t>(1, bytes.size()));
            std::memcpy(host.data(), bytes.data(), bytes.size());
            void* dst = blobs.data();
            void const* src = host.data();
            size_t const size = bytes.size();
            runtime::Stream stream = rt->createStream();
            std::string error;
            bool ok = rt->copyBatch(&dst, &src, &size, 1, stream, error);
            ok = ok && rt->checksums(blobs.data(), stride, lens, n, lens + n, stream, error);
            rt->synchronize(stream);
            rt->destroyStream(stream);
            if (!ok)
            {
                throw std::runtime_error(error);
            }
            return std::vector<uint32_t>(lens + n, lens + 2 * n);
        },
        py::arg("device"), py::arg("data"), py::arg("stride"), py::arg("lengths"),
        "CRC-32C of blob i = the lengths[i] bytes at i * stride of `data`, computed by the runtime "
        "of `device` (a CUDA ordinal, or -1 for the host backend) from device memory");

    py::class_<StagingHarness>(t, "StagingHarness")
        .def(py::init<size_t, std::string const&>(), py::arg("capacity"), py::arg("kind") = "device")
        .def("acquire", &StagingHarness::acquire, py::arg("min_bytes"), py::arg("max_bytes"), py::arg("granularity"),
            py::arg("alignment"), py::arg("stream"))
        .def("release", &StagingHarness::release)
        .def("set_stream",
            [](StagingHarness& h, int64_t id, std::optional<uintptr_t> stream) {
                std::optional<runtime::Stream> owner;
                if (stream)
                {
                    owner = toStream(*stream);
                }
                h.lease(id).setStream(owner);
            })
        .def("lease",
            [](StagingHarness& h, int64_t id) {
                auto& l = h.lease(id);
                std::optional<uintptr_t> s;
                if (l.stream())
                {
                    s = reinterpret_cast<uintptr_t>(*l.stream());
                }
                return LeaseInfo{l.offset(), l.size(), s,
                    reinterpret_cast<uintptr_t>(l.data()) - reinterpret_cast<uintptr_t>(h.live().base())};
            })
        .def("ranges",
            [](StagingHarness& h) {
                std::vector<StagingRange> out;
                for (auto const& r : h.live().ranges())
                {
                    out.push_back({r.offset, r.size, r.live, kvcm::testing::eventId(r.event)});
                }
                return out;
            })
        .def_property_readonly("cursor", [](StagingHarness& h) { return h.live().cursor(); })
        .def_property_readonly("capacity", [](StagingHarness& h) { return h.live().capacity(); })
        .def_property_readonly("base", [](StagingHarness& h) { return reinterpret_cast<uintptr_t>(h.live().base()); })
        .def_property_readonly("kind",
            [](StagingHarness& h) { return h.live().kind() == runtime::MemoryKind::kDevice ? "device" : "host"; })
        .def("log", [](StagingHarness& h) { return *h.runtime_->log; })
        .def("clear_log", [](StagingHarness& h) { h.runtime_->log->clear(); })
        .def("close", &StagingHarness::close);
}

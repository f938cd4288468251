// SPDX-License-Identifier: Apache-2.0
//
// The CUDA codec's host side (codec_cuda.h): workspaces planned and allocated at configure,
// batches alternating between two lanes per direction, kernels launched through kernels.h.
#include "codec_cuda.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvcodec/cuda_error.h"
#include "kvcodec/device_scope.h"

namespace kvcodec::nvcomp_plugin {

NvcompCodecCuda::NvcompCodecCuda(Params const& params, CudaDevice device)
    : NvcompCodec(params, device.ordinal)
    , smCount_(device.numSms)
{
}

NvcompCodecCuda::~NvcompCodecCuda()
{
    DeviceScope scope(device());
    if (encodeFork_)
        cudaEventDestroy(encodeFork_);
    if (decodeFork_)
        cudaEventDestroy(decodeFork_);
    for (int l = 0; l < kLanes; ++l)
    {
        for (Lane* lane : {&encLanes_[l], &decLanes_[l]})
        {
            if (lane->stream)
                cudaStreamSynchronize(lane->stream);
            if (lane->done)
                cudaEventDestroy(lane->done);
            if (lane->stream)
                cudaStreamDestroy(lane->stream);
        }
    }
    arena_.reset();
}

bool NvcompCodecCuda::planBackend()
{
    try
    {
        // CodecBase made the codec's device current. Load the codec's kernels now: with lazy
        // module loading a first launch can wait for work already queued on the device, and
        // encode/decode must never wait.
        check(preloadEncodeKernels(), "loading the codec's kernels");
        check(preloadDecodeKernels(), "loading the codec's kernels");
        check(cudaDeviceGetAttribute(&smCount_, cudaDevAttrMultiProcessorCount, device()), "querying the SM count");
        int pageable = 0;
        check(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device()),
            "querying pageable memory access");
        pageableAccess_ = pageable != 0;
        ops_ = makeNvcompOps(options_.algorithm, options_.elementBytes);
        arena_ = std::make_unique<DeviceArena>();
        nvcompAlignmentRequirements_t da{};
        check(ops_->decompressAlignment(&da), "nvCOMP decompress alignment query");
        if (da.input > kPayloadAlign)
        {
            return fail(std::string(algorithmInfo(options_.algorithm).name) + ": nvCOMP needs "
                + std::to_string(da.input) + "-byte aligned compressed chunks; format version 1 aligns to 16");
        }
        // Sizes every buffer from the layout's real chunks and may lower maxPagesPerBatch.
        plan_ = planWorkspace(options_, layout(), plans_, *ops_);
        chunkStride_ = plan_.chunkStride;
        compStride_ = plan_.compStride;
        groups_.resize(plans_.size());
        for (size_t g = 0; g < plans_.size(); ++g)
        {
            auto const& group = layout().groups()[g];
            std::vector<DevChunk> table;
            for (auto const& c : plans_[g].chunks)
            {
                auto const& pool = group.pools[c.pool];
                table.push_back({pool.base, pool.slotBytes, c.offset, c.bytes, c.pool});
            }
            groups_[g].encodeDirect = plan_.encodeDirect[g];
            groups_[g].decodeDirect = plan_.decodeDirect[g];
            check(groups_[g].chunks.upload(table), "copying the chunk table");
        }

        crcPowerTable(xpowHost_);
        check(xpow_.upload(std::vector<uint32_t>(std::begin(xpowHost_), std::end(xpowHost_))), "copying the CRC table");
        zeroChunk_ = arena_->alloc<uint8_t>(chunkStride_, "the zero chunk");
        check(cudaMemset(zeroChunk_, 0, chunkStride_), "clearing the zero chunk");

        for (int l = 0; l < kLanes; ++l)
        {
            allocEncode(encLanes_[l].enc);
            allocDecode(decLanes_[l].dec);
            for (Lane* lane : {&encLanes_[l], &decLanes_[l]})
            {
                check(cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking), "creating a codec stream");
                check(cudaEventCreateWithFlags(&lane->done, cudaEventDisableTiming), "creating a codec event");
            }
        }
        makeDummyChunk();
        check(cudaEventCreateWithFlags(&encodeFork_, cudaEventDisableTiming), "creating the encode event");
        check(cudaEventCreateWithFlags(&decodeFork_, cudaEventDisableTiming), "creating the decode event");
        return true;
    }
    catch (std::exception const& e)
    {
        return fail(std::string("configure(): ") + e.what());
    }
}

// Every stride here is the one the kernels index with (chunkStride_, compStride_, the blob
// stride roundUp(coldBytes, kStagingAlign), kDummyRawBytes), for plan_.maxChunks chunks.
void NvcompCodecCuda::allocEncode(EncodeWorkspace& w)
{
    uint64_t const n = plan_.maxChunks;
    w.inPtrs = arena_->alloc<void const*>(n, "encode tables");
    w.inBytes = arena_->alloc<size_t>(n, "encode tables");
    w.outPtrs = arena_->alloc<void*>(n, "encode tables");
    w.outBytes = arena_->alloc<size_t>(n, "encode tables");
    w.statuses = arena_->alloc<nvcompStatus_t>(n, "encode tables");
    w.entries = arena_->alloc<uint32_t>(n, "encode tables");
    w.offsets = arena_->alloc<uint64_t>(n, "encode tables");
    w.chunkCrc = arena_->alloc<CrcPiece>(n, "encode tables");
    w.pages = arena_->alloc<PageState>(plan_.maxPages, "encode page states");
    w.compStaging = arena_->alloc<uint8_t>(n * compStride_, "compressed-chunk staging");
    w.inStaging = plan_.encodeStaging ? arena_->alloc<uint8_t>(n * chunkStride_, "shuffle staging") : nullptr;
    w.tempBytes = plan_.compressTempBytes;
    w.temp = arena_->alloc<uint8_t>(std::max<uint64_t>(w.tempBytes, 1), "nvCOMP compress workspace");
}

void NvcompCodecCuda::allocDecode(DecodeWorkspace& w)
{
    uint64_t const n = plan_.maxChunks;
    w.inPtrs = arena_->alloc<void const*>(n, "decode tables");
    w.inBytes = arena_->alloc<size_t>(n, "decode tables");
    w.capacity = arena_->alloc<size_t>(n, "decode tables");
    w.actual = arena_->alloc<size_t>(n, "decode tables");
    w.outPtrs = arena_->alloc<void*>(n, "decode tables");
    w.statuses = arena_->alloc<nvcompStatus_t>(n, "decode tables");
    w.kinds = arena_->alloc<uint8_t>(n, "decode tables");
    w.offsets = arena_->alloc<uint64_t>(n, "decode tables");
    w.chunkCrc = arena_->alloc<CrcPiece>(n, "decode tables");
    w.pages = arena_->alloc<PageState>(plan_.maxPages, "decode page states");
    w.outStaging = plan_.decodeStaging ? arena_->alloc<uint8_t>(n * chunkStride_, "decompression staging") : nullptr;
    w.dummyOut = arena_->alloc<uint8_t>(n * kDummyRawBytes, "dummy outputs");
    w.blobStaging = arena_->alloc<uint8_t>(plan_.blobBytes, "decode blob staging");
    w.tempBytes = plan_.decompressTempBytes;
    w.temp = arena_->alloc<uint8_t>(std::max<uint64_t>(w.tempBytes, 1), "nvCOMP decompress workspace");
}

// A small valid compressed chunk that decoding hands to nvCOMP in place of chunks it must
// not decompress (raw chunks, bad pages): nvCOMP's batch size is fixed by the host.
// With lazy module loading nvCOMP's kernels load at their first launch, which can wait for
// work queued on the device; encode and decode must never wait. So every kernel they use runs
// once here: compressing and decompressing the dummy chunk and a chunk of the layout's
// largest size.
void NvcompCodecCuda::makeDummyChunk()
{
    size_t cap = 0;
    check(ops_->maxCompressedChunk(kDummyRawBytes, &cap), "nvCOMP max chunk size query");
    dummyIn_ = arena_->alloc<uint8_t>(roundUp(cap, kStagingAlign), "the dummy chunk");
    DeviceArena scratch;
    auto* raw = scratch.alloc<uint8_t>(kDummyRawBytes, "the dummy chunk");
    check(cudaMemset(raw, 0, kDummyRawBytes), "clearing the dummy chunk");
    dummyInBytes_ = roundTripOnce(raw, kDummyRawBytes, dummyIn_, "the dummy chunk");
    roundTripOnce(zeroChunk_, plan_.maxChunkBytes, nullptr, "loading nvCOMP's kernels (a largest chunk)");
}

// Compresses `bytes` bytes at `raw` into `comp` (nvCOMP's bound for them, rounded up to
// kStagingAlign; a scratch buffer when null) and decompresses them back, synchronously,
// checking that the bytes came back; returns the compressed size. `comp` is cleared first:
// decoders read whole words past a chunk's last byte (gdeflate: 4-byte words).
size_t NvcompCodecCuda::roundTripOnce(uint8_t const* raw, size_t bytes, uint8_t* comp, char const* what)
{
    size_t cap = 0, ct = 0, dt = 0;
    check(ops_->maxCompressedChunk(bytes, &cap), what);
    check(ops_->compressTemp(1, bytes, bytes, &ct, nullptr), what);
    check(ops_->decompressTemp(1, bytes, bytes, &dt, nullptr), what);
    DeviceArena scratch;
    if (comp == nullptr)
    {
        comp = scratch.alloc<uint8_t>(roundUp(cap, kStagingAlign), what);
    }
    check(cudaMemset(comp, 0, roundUp(cap, kStagingAlign)), what);
    auto* back = scratch.alloc<uint8_t>(std::max<size_t>(bytes, 1), what);
    auto* ctemp = scratch.alloc<uint8_t>(std::max<size_t>(ct, 1), what);
    auto* dtemp = scratch.alloc<uint8_t>(std::max<size_t>(dt, 1), what);
    auto* tables = scratch.alloc<uint64_t>(8, what);
    auto* status = scratch.alloc<nvcompStatus_t>(2, what);
    // [0] raw, [1] raw bytes, [2] compressed, [3] compressed bytes, [4] back, [5] capacity, [6] actual.
    uint64_t host[8] = {reinterpret_cast<uint64_t>(raw), bytes, reinterpret_cast<uint64_t>(comp), 0,
        reinterpret_cast<uint64_t>(back), bytes, 0, 0};
    check(cudaMemcpy(tables, host, sizeof(host), cudaMemcpyHostToDevice), what);
    check(ops_->compress(reinterpret_cast<void const* const*>(tables), reinterpret_cast<size_t const*>(tables + 1),
              bytes, 1, ctemp, ct, reinterpret_cast<void* const*>(tables + 2), reinterpret_cast<size_t*>(tables + 3),
              status, nullptr),
        what);
    check(
        ops_->decompress(reinterpret_cast<void const* const*>(tables + 2), reinterpret_cast<size_t const*>(tables + 3),
            reinterpret_cast<size_t const*>(tables + 5), reinterpret_cast<size_t*>(tables + 6), 1, dtemp, dt,
            reinterpret_cast<void* const*>(tables + 4), status + 1, nullptr),
        what);
    check(cudaDeviceSynchronize(), what);
    nvcompStatus_t st[2] = {nvcompErrorInternal, nvcompErrorInternal};
    check(cudaMemcpy(host, tables, sizeof(host), cudaMemcpyDeviceToHost), what);
    check(cudaMemcpy(st, status, sizeof(st), cudaMemcpyDeviceToHost), what);
    check(st[0], what);
    check(st[1], what);
    if (host[6] != bytes)
    {
        throw std::runtime_error(
            std::string(what) + ": " + std::to_string(bytes) + " bytes came back as " + std::to_string(host[6]));
    }
    return host[3];
}

// CodecBase checked the arguments and the stream and made the codec's device current.
bool NvcompCodecCuda::submit(CodecCall const& call)
{
    PoolGroupIndex const g = call.groupIndex;
    uintptr_t const blob = call.coldBase;
    PageIndexPair const* pairs = call.pages;
    size_t const n = call.numPages;
    cudaStream_t const stream = call.stream;
    bool const encode = call.encoding;
    uint8_t* const pageStatus = call.pageStatus;
    char const* op = encode ? "encode" : pageStatus ? "decodeChecked" : "decode";
    if (pageStatus != nullptr)
    {
        std::string why = statusMemoryProblem(pageStatus);
        if (!why.empty())
            return fail(std::string(op) + "(): " + why);
    }
    // Fork: the lanes wait for the caller's stream; batches alternate between the two lanes
    // so one batch's transfer overlaps the next one's (de)compression; join: the caller's
    // stream waits for both. A lane's own stream orders its workspace across calls.
    Lane* lanes = encode ? encLanes_ : decLanes_;
    cudaEvent_t fork = encode ? encodeFork_ : decodeFork_;
    cudaError_t st = cudaEventRecord(fork, stream);
    for (int l = 0; st == cudaSuccess && l < kLanes; ++l)
    {
        st = cudaStreamWaitEvent(lanes[l].stream, fork, 0);
    }
    if (st != cudaSuccess)
    {
        cudaGetLastError();
        return fail(std::string(op) + "(): forking onto the codec's streams failed: " + cudaErrorText(st));
    }
    auto const& plan = plans_[g];
    auto const& group = layout().groups()[g];
    // Blobs in host memory: at least four batches when the call is large enough, none under
    // ~8 MiB of raw data, so one batch's PCIe transfer overlaps the next one's compression.
    // Blobs in device memory have no transfer to hide: the largest batches keep the most
    // chunks in flight.
    uint64_t batch = plan.maxPagesPerBatch;
    bool const hostBlobs = !isDeviceMemory(reinterpret_cast<void const*>(blob));
    if (hostBlobs)
    {
        uint64_t const minPages = std::max<uint64_t>(1, (8ull << 20) / group.pageBytes);
        batch = std::min<uint64_t>(batch, std::max<uint64_t>(minPages, (n + 3) / 4));
    }
    std::string err;
    int b = 0;
    for (size_t first = 0; first < n && err.empty(); first += batch, ++b)
    {
        size_t const m = std::min<size_t>(batch, n - first);
        Lane& lane = lanes[b % kLanes];
        err = encode ? encodeBatch(g, blob, pairs + first, m, lane, hostBlobs)
                     : decodeBatch(g, blob, pairs + first, m, lane, hostBlobs,
                           pageStatus != nullptr ? pageStatus + first : nullptr);
    }
    for (int l = 0; l < kLanes; ++l)
    {
        cudaError_t e = cudaEventRecord(lanes[l].done, lanes[l].stream);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent(stream, lanes[l].done, 0);
        if (e != cudaSuccess && err.empty())
        {
            cudaGetLastError();
            err = "joining the codec's streams failed: " + cudaErrorText(e);
        }
    }
    return err.empty() ? true : fail(std::string(op) + "(): " + err);
}

// Why the codec's kernels cannot write decodeChecked()'s status array at `p`, or an empty
// string: it must be memory of this device, managed memory, mapped pinned host memory whose
// device address is its host address, or any host memory where the device reads pageable
// memory. A host query without synchronization; a kernel's write to other memory would fault
// and take the CUDA context with it.
std::string NvcompCodecCuda::statusMemoryProblem(void const* p) const
{
    cudaPointerAttributes at{};
    cudaError_t const st = cudaPointerGetAttributes(&at, p);
    if (st != cudaSuccess)
    {
        cudaGetLastError();
        return "cannot query the page status array's memory: " + cudaErrorText(st);
    }
    switch (at.type)
    {
    case cudaMemoryTypeDevice:
        if (at.device == device())
            return {};
        return "the page status array is memory of CUDA device " + std::to_string(at.device) + ", not of device "
            + std::to_string(device()) + " that the codec runs on";
    case cudaMemoryTypeManaged: return {};
    case cudaMemoryTypeHost:
        if (at.devicePointer == p)
            return {};
        return "the page status array is pinned host memory that is not mapped at its host address; allocate it "
               "with cudaHostAlloc (or torch's pin_memory())";
    default:
        if (pageableAccess_)
            return {};
        return "the page status array is pageable host memory, which this device cannot write; use device memory "
               "or mapped pinned host memory";
    }
}

std::string NvcompCodecCuda::encodeBatch(
    PoolGroupIndex g, uintptr_t blob, PageIndexPair const* pairs, size_t m, Lane& lane, bool hostBlobs)
{
    EncodeWorkspace& enc_ = lane.enc;
    cudaStream_t const stream = lane.stream;
    auto const& group = layout().groups()[g];
    auto const& plan = plans_[g];
    uint32_t const numChunks = uint32_t(plan.chunks.size());
    size_t const total = m * numChunks;
    EncodeArgs a{groups_[g].chunks.get(), numChunks, group.numSlots, pairs, options_.elementBytes,
        options_.bitshuffle ? 1u : 0u, groups_[g].encodeDirect ? 1u : 0u, uint8_t(options_.algorithm),
        options_.chunkBytes, chunkStride_, enc_.inStaging, zeroChunk_, enc_.inPtrs, enc_.inBytes, enc_.outPtrs,
        enc_.compStaging, compStride_, zeroCompressed() ? 1u : 0u, enc_.outBytes, enc_.statuses, enc_.entries,
        enc_.offsets, enc_.chunkCrc, enc_.pages, headerOp(plan.headerBytes), plan.coldBytes, plan.headerBytes,
        group.pageBytes, blob, xpow_.get()};
    cudaError_t st = launchEncodePrepare(a, total, stream);
    if (st != cudaSuccess)
        return "prepare kernel launch failed: " + cudaErrorText(st);
    nvcompStatus_t ns = ops_->compress(enc_.inPtrs, enc_.inBytes, plan_.maxChunkBytes, total, enc_.temp, enc_.tempBytes,
        enc_.outPtrs, enc_.outBytes, enc_.statuses, stream);
    if (ns != nvcompSuccess)
        return "nvCOMP batched compress of " + std::to_string(total) + " chunks failed: status "
            + std::to_string(int(ns));
    st = launchEncodeFinish(a, m, chunkGrid(total, hostBlobs), total, stream);
    return st == cudaSuccess ? std::string() : "finish kernels' launch failed: " + cudaErrorText(st);
}

// `pageStatus`: the batch's first page's status byte (decodeChecked), or null.
std::string NvcompCodecCuda::decodeBatch(PoolGroupIndex g, uintptr_t blob, PageIndexPair const* pairs, size_t m,
    Lane& lane, bool hostBlobs, uint8_t* pageStatus)
{
    DecodeWorkspace& dec_ = lane.dec;
    cudaStream_t const stream = lane.stream;
    auto const& group = layout().groups()[g];
    auto const& plan = plans_[g];
    uint32_t const numChunks = uint32_t(plan.chunks.size());
    size_t const total = m * numChunks;
    DecodeArgs a{groups_[g].chunks.get(), numChunks, group.numSlots, pairs, options_.elementBytes,
        options_.bitshuffle ? 1u : 0u, groups_[g].decodeDirect ? 1u : 0u, uint8_t(options_.algorithm),
        options_.chunkBytes, chunkStride_, dec_.outStaging, dec_.inPtrs, dec_.inBytes, dec_.capacity, dec_.actual,
        dec_.outPtrs, dec_.statuses, dec_.kinds, dec_.offsets, dec_.chunkCrc, dec_.pages, headerOp(plan.headerBytes),
        dummyIn_, dummyInBytes_, dec_.dummyOut, dec_.blobStaging, roundUp(plan.coldBytes, kStagingAlign),
        plan.coldBytes, plan.headerBytes, group.pageBytes, blob, xpow_.get(), hostBlobs ? 0u : 1u, pageStatus};
    cudaError_t st = launchDecodeFetch(a, m, chunkGrid(total, hostBlobs), total, stream);
    if (st != cudaSuccess)
        return "fetch kernels' launch failed: " + cudaErrorText(st);
    nvcompStatus_t ns = ops_->decompress(dec_.inPtrs, dec_.inBytes, dec_.capacity, dec_.actual, total, dec_.temp,
        dec_.tempBytes, dec_.outPtrs, dec_.statuses, stream);
    if (ns != nvcompSuccess)
        return "nvCOMP batched decompress of " + std::to_string(total) + " chunks failed: status "
            + std::to_string(int(ns));
    st = launchDecodeScatter(a, total, stream);
    return st == cudaSuccess ? std::string() : "scatter kernel launch failed: " + cudaErrorText(st);
}

} // namespace kvcodec::nvcomp_plugin

// SPDX-License-Identifier: Apache-2.0
//
// Benchmark and test hooks that run nvCOMP directly on device memory (testing.h): the
// benchmark's baseline and the compressed-output probe. Not used by the codecs.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_arena.h"
#include "kernels.h" // kStagingAlign
#include "nvcomp_ops.h"
#include "testing.h"

namespace kvcodec::nvcomp_plugin {
namespace {

__global__ void cutChunks(uint8_t* base, uint64_t bytes, uint64_t chunkBytes, uint64_t chunks, void** inPtrs,
    size_t* inBytes, void** outPtrs, uint8_t* comp, uint64_t compStride, void** backPtrs, uint8_t* back, size_t* cap)
{
    uint64_t const k = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (k >= chunks)
        return;
    uint64_t const off = k * chunkBytes;
    inPtrs[k] = base + off;
    inBytes[k] = min(chunkBytes, bytes - off);
    outPtrs[k] = comp + k * compStride;
    backPtrs[k] = back + off;
    cap[k] = inBytes[k];
}

} // namespace

DirectResult directBenchmark(Algorithm algorithm, uint32_t elementBytes, uintptr_t data, uint64_t bytes,
    uint64_t chunkBytes, int iterations, cudaStream_t stream)
{
    auto ops = makeNvcompOps(algorithm, elementBytes);
    uint64_t const chunks = (bytes + chunkBytes - 1) / chunkBytes;
    size_t maxOut = 0;
    check(ops->maxCompressedChunk(chunkBytes, &maxOut), "nvCOMP max chunk size query");
    uint64_t const compStride = roundUp(maxOut, kStagingAlign);
    size_t ct = 0, dt = 0;
    check(ops->compressTemp(chunks, chunkBytes, bytes, &ct, stream), "nvCOMP compress temp-size query");
    check(ops->decompressTemp(chunks, chunkBytes, bytes, &dt, stream), "nvCOMP decompress temp-size query");
    DeviceArena arena;
    auto* inPtrs = arena.alloc<void*>(chunks, "tables");
    auto* inBytes = arena.alloc<size_t>(chunks, "tables");
    auto* outPtrs = arena.alloc<void*>(chunks, "tables");
    auto* outBytes = arena.alloc<size_t>(chunks, "tables");
    auto* backPtrs = arena.alloc<void*>(chunks, "tables");
    auto* cap = arena.alloc<size_t>(chunks, "tables");
    auto* actual = arena.alloc<size_t>(chunks, "tables");
    auto* statuses = arena.alloc<nvcompStatus_t>(chunks, "tables");
    auto* comp = arena.alloc<uint8_t>(chunks * compStride, "compressed chunks");
    auto* back = arena.alloc<uint8_t>(bytes, "decompressed copy");
    auto* ctemp = arena.alloc<uint8_t>(std::max<size_t>(ct, 1), "compress workspace");
    auto* dtemp = arena.alloc<uint8_t>(std::max<size_t>(dt, 1), "decompress workspace");
    cutChunks<<<unsigned((chunks + 255) / 256), 256, 0, stream>>>(reinterpret_cast<uint8_t*>(data), bytes, chunkBytes,
        chunks, inPtrs, inBytes, outPtrs, comp, compStride, backPtrs, back, cap);
    check(cudaGetLastError(), "chunk table kernel");
    cudaEvent_t e0, e1, e2;
    check(cudaEventCreate(&e0), "event");
    check(cudaEventCreate(&e1), "event");
    check(cudaEventCreate(&e2), "event");
    DirectResult r;
    r.rawBytes = bytes;
    float cms = 0, dms = 0;
    for (int it = -1; it < iterations; ++it) // iteration -1 warms up
    {
        cudaEventRecord(e0, stream);
        check(ops->compress(inPtrs, inBytes, chunkBytes, chunks, ctemp, ct, outPtrs, outBytes, statuses, stream),
            "nvCOMP compress");
        cudaEventRecord(e1, stream);
        check(ops->decompress(outPtrs, outBytes, cap, actual, chunks, dtemp, dt, backPtrs, statuses, stream),
            "nvCOMP decompress");
        cudaEventRecord(e2, stream);
        check(cudaEventSynchronize(e2), "benchmark iteration");
        float a = 0, b = 0;
        cudaEventElapsedTime(&a, e0, e1);
        cudaEventElapsedTime(&b, e1, e2);
        if (it >= 0)
        {
            cms += a;
            dms += b;
        }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaEventDestroy(e2);
    std::vector<size_t> sizes(chunks);
    check(cudaMemcpy(sizes.data(), outBytes, chunks * sizeof(size_t), cudaMemcpyDeviceToHost), "reading sizes");
    for (size_t s : sizes)
        r.compressedBytes += s;
    std::vector<uint8_t> a(bytes), b(bytes);
    check(cudaMemcpy(a.data(), reinterpret_cast<void*>(data), bytes, cudaMemcpyDeviceToHost), "reading input");
    check(cudaMemcpy(b.data(), back, bytes, cudaMemcpyDeviceToHost), "reading output");
    r.roundTripOk = a == b;
    r.compressMs = cms / std::max(iterations, 1);
    r.decompressMs = dms / std::max(iterations, 1);
    return r;
}

std::vector<std::string> compressChunksForTest(Algorithm algorithm, uint32_t elementBytes, uintptr_t data,
    std::vector<uint64_t> const& sizes, uint8_t inFill, uint8_t outFill, uint8_t tempFill)
{
    auto ops = makeNvcompOps(algorithm, elementBytes);
    uint64_t const n = sizes.size();
    if (n == 0)
        return {};
    uint64_t const maxChunk = *std::max_element(sizes.begin(), sizes.end());
    uint64_t total = 0;
    for (uint64_t b : sizes)
        total += b;
    size_t maxOut = 0, temp = 0;
    check(ops->maxCompressedChunk(maxChunk, &maxOut), "nvCOMP max chunk size query");
    check(ops->compressTemp(n, maxChunk, total, &temp, nullptr), "nvCOMP compress temp-size query");
    uint64_t const inStride = roundUp(maxChunk, kStagingAlign);
    uint64_t const outStride = roundUp(maxOut, kStagingAlign);
    DeviceArena arena;
    auto* in = arena.alloc<uint8_t>(n * inStride, "input chunks");
    auto* out = arena.alloc<uint8_t>(n * outStride, "output chunks");
    auto* tempPtr = arena.alloc<uint8_t>(std::max<size_t>(temp, 1), "compress workspace");
    auto* tables = arena.alloc<uint64_t>(4 * n, "tables");
    auto* statuses = arena.alloc<nvcompStatus_t>(n, "statuses");
    check(cudaMemset(in, inFill, n * inStride), "filling the input chunks");
    check(cudaMemset(out, outFill, n * outStride), "filling the output chunks");
    check(cudaMemset(tempPtr, tempFill, std::max<size_t>(temp, 1)), "filling the workspace");
    std::vector<uint64_t> host(4 * n);
    uint64_t off = 0;
    for (uint64_t k = 0; k < n; ++k)
    {
        check(cudaMemcpy(
                  in + k * inStride, reinterpret_cast<uint8_t const*>(data) + off, sizes[k], cudaMemcpyDeviceToDevice),
            "staging a chunk");
        off += sizes[k];
        host[k] = reinterpret_cast<uint64_t>(in + k * inStride);
        host[n + k] = sizes[k];
        host[2 * n + k] = reinterpret_cast<uint64_t>(out + k * outStride);
    }
    check(
        cudaMemcpy(tables, host.data(), host.size() * sizeof(uint64_t), cudaMemcpyHostToDevice), "copying the tables");
    check(ops->compress(reinterpret_cast<void const* const*>(tables), reinterpret_cast<size_t const*>(tables + n),
              maxChunk, n, tempPtr, temp, reinterpret_cast<void* const*>(tables + 2 * n),
              reinterpret_cast<size_t*>(tables + 3 * n), statuses, nullptr),
        "nvCOMP compress");
    check(cudaDeviceSynchronize(), "nvCOMP compress");
    std::vector<nvcompStatus_t> st(n);
    check(cudaMemcpy(host.data(), tables, host.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost), "reading the sizes");
    check(cudaMemcpy(st.data(), statuses, n * sizeof(nvcompStatus_t), cudaMemcpyDeviceToHost), "reading the statuses");
    std::vector<std::string> result(n);
    for (uint64_t k = 0; k < n; ++k)
    {
        check(st[k], "nvCOMP compress of a chunk");
        result[k].resize(host[3 * n + k]);
        check(cudaMemcpy(result[k].data(), out + k * outStride, result[k].size(), cudaMemcpyDeviceToHost),
            "reading a compressed chunk");
    }
    return result;
}

} // namespace kvcodec::nvcomp_plugin

// {{ cookiecutter.codec_name }}: the CUDA kernel. One launch covers every (page, pool, chunk) of a
// call; each thread block transforms one chunk of one pool slot. See codec.h for the format.
#include "codec.h"

#include <algorithm>
#include "kvcodec/kernels.cuh"

namespace {{ cookiecutter.codec_name | replace('-', '_') }}_codec {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) transformKernel(__grid_constant__ KernelArgs const a)
{
    uint64_t const total = a.numPairs * a.chunksPerPage;
    uint32_t const w = a.wordBytes;
    uint64_t const keep = a.dropBits == 0 ? ~0ull : ~((1ull << a.dropBits) - 1);
    for (uint64_t item = blockIdx.x; item < total; item += gridDim.x)
    {
        uint64_t const page = item / a.chunksPerPage;
        uint64_t const r = item - page * a.chunksPerPage;
        uint32_t const p = kvcodec::poolOfChunk(a.pools, a.numPools, r);
        kvcodec::ChunkedPool const pool = a.pools[p];
        kvcodec::PageIndexPair const pair = a.devicePairs != nullptr ? a.devicePairs[page] : a.hostPairs[page];
        int32_t const hot = a.encode ? pair.src : pair.dst;
        int32_t const cold = a.encode ? pair.dst : pair.src;
        if (hot < 0 || uint64_t(hot) >= a.numHotSlots || cold < 0)
        {
            continue; // Out-of-range pairs are skipped: never write outside the pools.
        }
        uint8_t* slot = reinterpret_cast<uint8_t*>(pool.base + uint64_t(hot) * pool.slotBytes);
        uint8_t* blob = reinterpret_cast<uint8_t*>(a.blob + uint64_t(cold) * a.pageBytes + pool.blobOffset);
        uint64_t const words = pool.slotBytes / w;
        uint64_t const begin = (r - pool.firstChunk) * kChunkBytes; // kChunkBytes is a multiple of every w
        uint64_t const end = min(begin + kChunkBytes, pool.slotBytes);
        for (uint64_t k = begin / w + threadIdx.x; k < min(end / w, words); k += blockDim.x)
        {
            uint64_t word = 0;
            if (a.encode)
            {
                for (uint32_t j = 0; j < w; ++j)
                {
                    word |= uint64_t(slot[k * w + j]) << (8 * j);
                }
                if (a.dropBits != 0)
                {
                    for (uint32_t q = 0; q < a.numRanges; ++q)
                    {
                        KernelRange const range = a.ranges[q];
                        if (range.pool == p && k * w >= range.begin && k * w + w <= range.end)
                        {
                            word &= keep;
                            break;
                        }
                    }
                }
                for (uint32_t j = 0; j < w; ++j)
                {
                    blob[j * words + k] = uint8_t(word >> (8 * j));
                }
            }
            else
            {
                for (uint32_t j = 0; j < w; ++j)
                {
                    slot[k * w + j] = blob[j * words + k];
                }
            }
        }
        if (end == pool.slotBytes)
        {
            // The slotBytes % w trailing bytes follow the planes unchanged.
            for (uint64_t t = words * w + threadIdx.x; t < pool.slotBytes; t += blockDim.x)
            {
                if (a.encode)
                {
                    blob[t] = slot[t];
                }
                else
                {
                    slot[t] = blob[t];
                }
            }
        }
    }
}

} // namespace

cudaError_t preloadKernel() noexcept
{
    return kvcodec::preloadKernels(transformKernel);
}

cudaError_t launchKernel(KernelArgs const& args, int numSms, cudaStream_t stream) noexcept
{
    uint64_t const total = args.numPairs * args.chunksPerPage;
    if (total == 0)
    {
        return cudaSuccess;
    }
    transformKernel<<<kvcodec::gridBlocks(total, numSms, 16), kThreads, 0, stream>>>(args);
    return cudaGetLastError();
}

} // namespace {{ cookiecutter.codec_name | replace('-', '_') }}_codec

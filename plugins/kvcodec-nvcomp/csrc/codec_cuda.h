// SPDX-License-Identifier: Apache-2.0
//
// CUDA implementation of the nvCOMP codecs (blob format in format.h; kernels in kernel_encode.cu
// and kernel_decode.cu). Every call is enqueued on the caller's stream with no host synchronization:
//
//   encode: prepare kernel (chunk pointer tables from the device page indices; bit shuffle or
//           copy into aligned staging when needed) -> nvCOMP batched compress -> layout kernel
//           (per page: raw or compressed per chunk from the device-side sizes, chunk table,
//           payload offsets, does the page fit) -> chunks kernel (per chunk: its payload straight
//           into the cold slot, and its piece of the CRC-32C) -> seal kernel (per page: codec
//           header and chunk table, the pieces combined into the checksum, the envelope; an
//           envelope alone with did-not-fit when the page exceeds the slot).
//   decode: header kernel (per page: check the envelope, stage and check the chunk table, lay
//           out the chunks) -> chunks kernel (per chunk: stage its payload, its piece of the
//           CRC-32C) -> verify kernel (per page: the checksum; nvCOMP's tables, where raw chunks
//           and the chunks of a bad page get a small dummy compressed chunk so the batch size
//           stays fixed) -> nvCOMP batched decompress -> scatter kernel (per chunk: raw chunks,
//           un-shuffle; only pages whose every chunk decoded).
//   decodeChecked: the same kernels, which also record why a page is refused (PageState flags)
//           and write one PageStatus byte per page where they decide it: the verify kernel for a
//           page that fails its checks, the scatter kernel's block of chunk 0 for a page that
//           went to nvCOMP (decoded, or kPageDecodeFailed). No extra kernel and no host copy.
//   The per-chunk kernels put every chunk of a batch in flight at once: one block per page
//   would leave most of the GPU idle and serialize a page's checksum and copies.
//
// Workspaces are allocated at configure time for the largest batch, two per direction ("lanes",
// each with its own internal stream); workspace.h sizes them from the layout's real chunks. A
// call is cut into batches that alternate between the lanes, so one batch's PCIe transfer
// overlaps the next one's (de)compression; the lanes wait for the caller's stream through an
// event and the caller's stream waits for both lanes, so the call is ordered on the caller's
// stream as if enqueued there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "codec.h"
#include "device_arena.h"
#include "kernels.h"
#include "nvcomp_ops.h"
#include "workspace.h"

namespace kvcodec::nvcomp_plugin {

class NvcompCodecCuda final : public NvcompCodec
{
public:
    NvcompCodecCuda(Params const& params, CudaDevice device);
    ~NvcompCodecCuda() override;

private:
    struct EncodeWorkspace
    {
        void const** inPtrs = nullptr;
        size_t* inBytes = nullptr;
        void** outPtrs = nullptr;
        size_t* outBytes = nullptr;
        nvcompStatus_t* statuses = nullptr;
        uint32_t* entries = nullptr;
        uint64_t* offsets = nullptr;
        CrcPiece* chunkCrc = nullptr;
        PageState* pages = nullptr;
        uint8_t* compStaging = nullptr;
        uint8_t* inStaging = nullptr;
        uint8_t* temp = nullptr;
        size_t tempBytes = 0;
    };

    struct DecodeWorkspace
    {
        void const** inPtrs = nullptr;
        size_t* inBytes = nullptr;
        size_t* capacity = nullptr;
        size_t* actual = nullptr;
        void** outPtrs = nullptr;
        nvcompStatus_t* statuses = nullptr;
        uint8_t* kinds = nullptr;
        uint64_t* offsets = nullptr;
        CrcPiece* chunkCrc = nullptr;
        PageState* pages = nullptr;
        uint8_t* outStaging = nullptr;
        uint8_t* dummyOut = nullptr;
        uint8_t* blobStaging = nullptr;
        uint8_t* temp = nullptr;
        size_t tempBytes = 0;
    };

    struct Lane
    {
        EncodeWorkspace enc;
        DecodeWorkspace dec;
        cudaStream_t stream = nullptr;
        cudaEvent_t done = nullptr;
    };

    static constexpr int kLanes = 2;

    struct GroupState
    {
        DeviceArray<DevChunk> chunks;
        bool encodeDirect = false;
        bool decodeDirect = false;
    };

    bool planBackend() override;
    void allocEncode(EncodeWorkspace& w);
    void allocDecode(DecodeWorkspace& w);
    void makeDummyChunk();
    size_t roundTripOnce(uint8_t const* raw, size_t bytes, uint8_t* comp, char const* what);

    uint32_t headerOp(uint32_t headerBytes) const noexcept
    {
        return crcShiftOperator(headerBytes - kCodecHeaderOffset, xpowHost_);
    }

    PageIndexLocation pageIndexLocation(HotLayout::LifeCycle const&) const override
    {
        return PageIndexLocation::kDevice;
    }

    // On the GPU a page's gdeflate and ANS blobs changed with the other pages of its call (same
    // sizes, bytes inside compressed chunks differing; compute-sanitizer's initcheck saw ANS's
    // compress kernel read 16-byte words it had not written) while LZ4 blobs did not. nvCOMP
    // does not promise to write every byte of a compressed chunk up to its reported size
    // (gdeflate ends its 32 interleaved bit streams in partial words that the decoder ignores),
    // so stale bytes of another chunk in the same staging slot can reach the blob; ANS also
    // writes bytes past the size it reports, so the whole slot is cleared. Clearing the slot
    // first makes the blob depend on its page alone; test_nvcomp_gpu.py's stale-memory test
    // checks which buffer matters.
    bool zeroCompressed() const noexcept
    {
        return options_.algorithm == Algorithm::kGdeflate || options_.algorithm == Algorithm::kAns;
    }

    bool submit(CodecCall const& call) override;
    std::string statusMemoryProblem(void const* p) const;

    // Blocks of the chunk kernels: one per chunk, or for blobs in host memory two per SM (enough
    // bytes in flight for the link).
    unsigned chunkGrid(size_t chunks, bool hostBlobs) const noexcept
    {
        return unsigned(hostBlobs ? std::min<size_t>(chunks, 2 * size_t(smCount_)) : chunks);
    }

    std::string encodeBatch(
        PoolGroupIndex g, uintptr_t blob, PageIndexPair const* pairs, size_t m, Lane& lane, bool hostBlobs);
    // `pageStatus`: the batch's first page's status byte (decodeChecked), or null.
    std::string decodeBatch(PoolGroupIndex g, uintptr_t blob, PageIndexPair const* pairs, size_t m, Lane& lane,
        bool hostBlobs, uint8_t* pageStatus);

    std::unique_ptr<NvcompOps> ops_;
    std::unique_ptr<DeviceArena> arena_;
    std::vector<GroupState> groups_;
    Lane encLanes_[kLanes];
    Lane decLanes_[kLanes];
    WorkspacePlan plan_;
    uint64_t chunkStride_ = 0;
    uint64_t compStride_ = 0;
    DeviceArray<uint32_t> xpow_;
    uint32_t xpowHost_[64] = {};
    int smCount_ = 1;
    bool pageableAccess_ = false; // kernels may write pageable host memory (HMM, ATS)
    uint8_t* zeroChunk_ = nullptr;
    uint8_t* dummyIn_ = nullptr;
    uint64_t dummyInBytes_ = 0;
    cudaEvent_t encodeFork_ = nullptr;
    cudaEvent_t decodeFork_ = nullptr;
};

} // namespace kvcodec::nvcomp_plugin

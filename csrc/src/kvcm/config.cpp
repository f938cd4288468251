// SPDX-License-Identifier: Apache-2.0
#include "kvcm/config.h"

#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "kvcodec/layout.h"

namespace kvcodec::kvcm {

char const* levelName(CacheLevel level) noexcept
{
    switch (level)
    {
    case CacheLevel::kHot: return "hot";
    case CacheLevel::kHost: return "host";
    case CacheLevel::kDisk: return "disk";
    case CacheLevel::kRemote: return "remote";
    }
    return "unknown";
}

void validateConfig(KvcmConfig const& config)
{
    auto fail = [](std::string const& message) { throw std::invalid_argument(message); };
    if (config.layerGroups.empty())
    {
        fail("config.layerGroups is empty; configure at least one layer group");
    }
    for (size_t l = 0; l < config.layerGroups.size(); ++l)
    {
        auto const& group = config.layerGroups[l];
        std::string const where = "config.layerGroups[" + std::to_string(l) + "]";
        if (group.buffers.empty())
        {
            fail(where + ".buffers is empty; a layer group needs at least one buffer");
        }
        for (size_t b = 0; b < group.buffers.size(); ++b)
        {
            auto const& buf = group.buffers[b];
            std::string const bw = where + ".buffers[" + std::to_string(b) + "]";
            if (buf.bytes == 0)
            {
                fail(bw + ".bytes is 0; it must be positive");
            }
            size_t const elem = dataTypeBytes(buf.dtype);
            if (elem == 0)
            {
                fail(bw + ".dtype is " + std::to_string(int(buf.dtype)) + "; not a kvcodec::DataType");
            }
            if (int(buf.role) < 0 || int(buf.role) > int(BufferRole::kKeyValue))
            {
                fail(bw + ".role is " + std::to_string(int(buf.role))
                    + "; valid roles are 0 (K), 1 (V), 2 (other), 3 (K and V side by side)");
            }
            if (buf.role == BufferRole::kKeyValue && buf.numHeads % 2 != 0)
            {
                fail(bw + ".numHeads is " + std::to_string(buf.numHeads)
                    + "; a K-and-V buffer (role 3) alternates K and V along its heads, so it needs an even number");
            }
            bool const shaped = buf.tokensPerPage > 0 && buf.numHeads > 0 && buf.headDim > 0;
            bool const opaque = buf.tokensPerPage == 0 && buf.numHeads == 0 && buf.headDim == 0;
            if (!shaped && !opaque)
            {
                fail(bw
                    + " sets only some of tokensPerPage/numHeads/headDim (or a negative one); set all three or none");
            }
            if (shaped
                && uint64_t(buf.tokensPerPage) * uint64_t(buf.numHeads) * uint64_t(buf.headDim) * elem != buf.bytes)
            {
                fail(bw + ".bytes is " + std::to_string(buf.bytes)
                    + " but tokensPerPage*numHeads*headDim*sizeof(dtype) is "
                    + std::to_string(
                        uint64_t(buf.tokensPerPage) * uint64_t(buf.numHeads) * uint64_t(buf.headDim) * elem));
            }
            if (!shaped && buf.bytes % elem != 0)
            {
                fail(bw + ".bytes is " + std::to_string(buf.bytes) + ", not a multiple of the element size "
                    + std::to_string(elem));
            }
        }
    }
    if (config.poolRatio.size() != config.layerGroups.size())
    {
        fail("config.poolRatio has " + std::to_string(config.poolRatio.size())
            + " entries; it needs one per layer group (" + std::to_string(config.layerGroups.size()) + ")");
    }
    for (size_t l = 0; l < config.poolRatio.size(); ++l)
    {
        if (!(config.poolRatio[l] > 0) || !std::isfinite(config.poolRatio[l]))
        {
            fail("config.poolRatio[" + std::to_string(l) + "] is " + std::to_string(config.poolRatio[l])
                + "; every weight must be a positive finite number");
        }
    }
    if (!config.minHotSlots.empty() && config.minHotSlots.size() != config.layerGroups.size())
    {
        fail("config.minHotSlots has " + std::to_string(config.minHotSlots.size())
            + " entries; it needs none or one per layer group (" + std::to_string(config.layerGroups.size()) + ")");
    }
    for (size_t l = 0; l < config.minHotSlots.size(); ++l)
    {
        if (config.minHotSlots[l] > uint64_t(INT32_MAX))
        {
            fail("config.minHotSlots[" + std::to_string(l) + "] is " + std::to_string(config.minHotSlots[l])
                + "; a pool group holds at most " + std::to_string(INT32_MAX) + " slots");
        }
    }
    if (config.gpuQuotaBytes == 0)
    {
        fail("config.gpuQuotaBytes is 0; the hot tier needs a positive quota");
    }
    if (config.indexRingBytes < 64 || config.indexRingBytes % sizeof(PageIndexPair) != 0)
    {
        fail("config.indexRingBytes is " + std::to_string(config.indexRingBytes)
            + "; it must be at least 64 and a multiple of 8 (sizeof(PageIndexPair))");
    }
    if (!config.disk.path.empty())
    {
        if (config.disk.maxBytes == 0)
        {
            fail("config.disk.maxBytes is 0; a disk tier needs a positive quota");
        }
        if (config.disk.containerBytes == 0)
        {
            fail("config.disk.containerBytes is 0; it must be positive");
        }
        if (config.disk.ioMode < 0 || config.disk.ioMode > 2)
        {
            fail("config.disk.ioMode is " + std::to_string(config.disk.ioMode)
                + "; valid: 0 (auto), 1 (direct), 2 (buffered)");
        }
        if (config.disk.ioThreads == 0)
        {
            fail("config.disk.ioThreads is 0; it must be positive");
        }
        if (config.disk.codecName.empty())
        {
            fail("config.disk.codecName is empty; the disk tier records the codec identity");
        }
    }
    if (config.remote.maxPages != 0)
    {
        if (!config.remote.queue)
        {
            fail("config.remote.queue is not set; a remote tier needs the queue its store's worker serves");
        }
        if (config.remote.maxPages > uint64_t(INT32_MAX))
        {
            fail("config.remote.maxPages is " + std::to_string(config.remote.maxPages) + "; it must be at most "
                + std::to_string(INT32_MAX));
        }
    }
}

HotSlotLayout hotSlotLayout(LayerGroupConfig const& group)
{
    HotSlotLayout out;
    std::vector<int32_t> layers; // pool p holds layer layers[p]
    for (auto const& buf : group.buffers)
    {
        size_t p = 0;
        while (p < layers.size() && layers[p] != buf.layer)
        {
            ++p;
        }
        if (p == layers.size())
        {
            layers.push_back(buf.layer);
            out.poolSlotBytes.push_back(0);
        }
        out.buffers.push_back({buf.layer, buf.role, int32_t(p), buf.dtype, out.poolSlotBytes[p], buf.bytes,
            buf.tokensPerPage, buf.numHeads, buf.headDim, 0});
        out.poolSlotBytes[p] += buf.bytes;
    }
    return out;
}

} // namespace kvcodec::kvcm

// SPDX-License-Identifier: Apache-2.0
//
// A validated, owned copy of the hot layout passed to IKvCacheColdPageCodec::configure().
// Header-only, for use inside codecs (built-in or plugin). Every codec has to validate the same
// descriptors the same way; this is that code, with error messages naming the offending field.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvcodec/codec.h"

namespace kvcodec {

/// Size in bytes of one element of `dtype`, or 0 for an unknown value.
constexpr size_t dataTypeBytes(DataType dtype) noexcept
{
    switch (dtype)
    {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2: return 1;
    case DataType::kFloat16:
    case DataType::kBFloat16: return 2;
    case DataType::kFloat32:
    case DataType::kInt32: return 4;
    }
    return 0;
}

/// True when two buffer lists are field-for-field identical (codecs that follow the buffer list
/// encode them identically).
inline bool sameBuffers(std::vector<BufferDesc> const& a, std::vector<BufferDesc> const& b) noexcept
{
    return a.size() == b.size()
        && std::equal(a.begin(), a.end(), b.begin(), [](BufferDesc const& x, BufferDesc const& y) {
               return x.layerId == y.layerId && x.role == y.role && x.poolIndex == y.poolIndex && x.dtype == y.dtype
                   && x.byteOffset == y.byteOffset && x.bytes == y.bytes && x.tokensPerPage == y.tokensPerPage
                   && x.numHeads == y.numHeads && x.headDim == y.headDim;
           });
}

class HotLayout
{
public:
    struct Pool
    {
        uintptr_t base;
        uint64_t slotBytes;
        uint64_t numSlots;
    };

    struct Group
    {
        std::vector<Pool> pools;
        std::vector<LifeCycleId> lifeCycles; ///< In descriptor order.
        uint64_t pageBytes = 0;              ///< Sum of slotBytes over pools.
        uint64_t numSlots = 0;               ///< Minimum numSlots over pools.
    };

    struct LifeCycle
    {
        LifeCycleId id;
        PoolGroupIndex group;
        std::vector<BufferDesc> buffers;
    };

    /// Validates and copies the descriptors. Returns an empty string on success, else a message
    /// naming the offending field and value.
    std::string load(PoolGroupDesc const* descs, PoolGroupIndex numDescs)
    {
        groups_.clear();
        lifeCycles_.clear();
        index_.clear();
        if (numDescs < 0)
        {
            return "numGpuDescs is " + std::to_string(numDescs) + "; it must be >= 0";
        }
        if (numDescs > 0 && descs == nullptr)
        {
            return "gpuDescs is null but numGpuDescs is " + std::to_string(numDescs);
        }
        for (PoolGroupIndex g = 0; g < numDescs; ++g)
        {
            PoolGroupDesc const& d = descs[g];
            std::string const where = "gpuDescs[" + std::to_string(g) + "]";
            if (d.poolGroupIndex != g)
            {
                return where + ".poolGroupIndex is " + std::to_string(d.poolGroupIndex)
                    + "; descriptors must be ordered so that poolGroupIndex == position (" + std::to_string(g) + ")";
            }
            if (d.numPools == 0 || d.pools == nullptr)
            {
                return where + " has no pools (numPools " + std::to_string(d.numPools) + ", pools "
                    + (d.pools ? "set" : "null") + "); a pool group needs at least one pool";
            }
            Group group;
            group.numSlots = std::numeric_limits<uint64_t>::max();
            for (uint32_t p = 0; p < d.numPools; ++p)
            {
                PoolDesc const& pool = d.pools[p];
                std::string const pw = where + ".pools[" + std::to_string(p) + "]";
                if (pool.base == nullptr)
                {
                    return pw + ".base is null";
                }
                if (pool.slotBytes == 0)
                {
                    return pw + ".slotBytes is 0; it must be positive";
                }
                if (pool.numSlots == 0 || pool.numSlots > uint64_t(std::numeric_limits<int32_t>::max()) + 1)
                {
                    return pw + ".numSlots is " + std::to_string(pool.numSlots) + "; it must be in [1, 2^31]";
                }
                if (pool.slotBytes > std::numeric_limits<uint64_t>::max() / pool.numSlots
                    || group.pageBytes + pool.slotBytes < group.pageBytes)
                {
                    return pw + " is too large (slotBytes * numSlots overflows)";
                }
                group.pools.push_back({reinterpret_cast<uintptr_t>(pool.base), pool.slotBytes, pool.numSlots});
                group.pageBytes += pool.slotBytes;
                group.numSlots = std::min(group.numSlots, pool.numSlots);
            }
            if (d.numLifeCycles > 0 && d.lifeCycles == nullptr)
            {
                return where + ".lifeCycles is null but numLifeCycles is " + std::to_string(d.numLifeCycles);
            }
            for (uint32_t l = 0; l < d.numLifeCycles; ++l)
            {
                LifeCycleDesc const& lc = d.lifeCycles[l];
                std::string const lw = where + ".lifeCycles[" + std::to_string(l) + "]";
                if (lc.lifeCycleId < 0)
                {
                    return lw + ".lifeCycleId is " + std::to_string(lc.lifeCycleId) + "; it must be >= 0";
                }
                if (index_.count(lc.lifeCycleId))
                {
                    return lw + ".lifeCycleId " + std::to_string(lc.lifeCycleId)
                        + " appears twice; each lifecycle belongs to exactly one hot pool group";
                }
                if (lc.numBuffers > 0 && lc.buffers == nullptr)
                {
                    return lw + ".buffers is null but numBuffers is " + std::to_string(lc.numBuffers);
                }
                LifeCycle entry{lc.lifeCycleId, g, {}};
                for (uint32_t b = 0; b < lc.numBuffers; ++b)
                {
                    std::string err = checkBuffer(lc.buffers[b], group, lw + ".buffers[" + std::to_string(b) + "]");
                    if (!err.empty())
                    {
                        return err;
                    }
                    entry.buffers.push_back(lc.buffers[b]);
                }
                index_[lc.lifeCycleId] = lifeCycles_.size();
                lifeCycles_.push_back(std::move(entry));
                group.lifeCycles.push_back(lc.lifeCycleId);
            }
            groups_.push_back(std::move(group));
        }
        return {};
    }

    [[nodiscard]] std::vector<Group> const& groups() const noexcept
    {
        return groups_;
    }

    [[nodiscard]] std::vector<LifeCycle> const& lifeCycles() const noexcept
    {
        return lifeCycles_;
    }

    /// The lifecycle, or nullptr when unknown.
    [[nodiscard]] LifeCycle const* find(LifeCycleId id) const noexcept
    {
        auto it = index_.find(id);
        return it == index_.end() ? nullptr : &lifeCycles_[it->second];
    }

    /// Checks the arguments of one encode()/decode() call (`op` names the call in messages).
    /// Returns the lifecycle to run; nullptr with `error` empty when there is nothing to do (no
    /// pages), or nullptr with `error` naming the bad argument: called before configure, an
    /// unknown lifecycle, or a null cold base or page-index array with pages to move.
    [[nodiscard]] LifeCycle const* checkCall(char const* op, bool configured, LifeCycleId id, void const* coldBase,
        void const* pageIndices, size_t numPages, std::string& error) const
    {
        error.clear();
        if (!configured)
        {
            error = std::string(op) + "() called before configure()";
            return nullptr;
        }
        LifeCycle const* lc = find(id);
        if (lc == nullptr)
        {
            error = std::string(op) + "(): unknown lifecycle " + std::to_string(id);
        }
        else if (numPages > 0 && coldBase == nullptr)
        {
            error = std::string(op) + "(): the cold base pointer is null with " + std::to_string(numPages) + " pages";
        }
        else if (numPages > 0 && pageIndices == nullptr)
        {
            error = std::string(op) + "(): pageIndices is null with " + std::to_string(numPages) + " pages";
        }
        return error.empty() && numPages > 0 ? lc : nullptr;
    }

    /// Smallest lifecycle ID configured in hot pool group `g`.
    [[nodiscard]] LifeCycleId smallestLifeCycle(PoolGroupIndex g) const noexcept
    {
        LifeCycleId best = -1;
        for (LifeCycleId id : groups_[g].lifeCycles)
        {
            best = (best < 0 || id < best) ? id : best;
        }
        return best;
    }

private:
    static std::string checkBuffer(BufferDesc const& b, Group const& group, std::string const& where)
    {
        if (b.poolIndex < 0 || size_t(b.poolIndex) >= group.pools.size())
        {
            return where + ".poolIndex is " + std::to_string(b.poolIndex) + "; valid pool indices are 0.."
                + std::to_string(group.pools.size() - 1);
        }
        uint64_t const slot = group.pools[b.poolIndex].slotBytes;
        if (b.bytes == 0 || b.byteOffset > slot || b.bytes > slot - b.byteOffset)
        {
            return where + " covers bytes [" + std::to_string(b.byteOffset) + ", "
                + std::to_string(b.byteOffset + b.bytes) + ") but the slot of pool " + std::to_string(b.poolIndex)
                + " has " + std::to_string(slot) + " bytes (a buffer must be non-empty and inside its slot)";
        }
        if (int32_t(b.role) < 0 || int32_t(b.role) > int32_t(BufferRole::kKeyValue))
        {
            return where + ".role is " + std::to_string(int32_t(b.role))
                + "; valid roles are 0 (K), 1 (V), 2 (other), 3 (K and V side by side)";
        }
        if (b.role == BufferRole::kKeyValue && b.numHeads % 2 != 0)
        {
            return where + ".numHeads is " + std::to_string(b.numHeads)
                + "; a K-and-V buffer (role 3) alternates K and V along its heads, so it needs an even number";
        }
        size_t const elem = dataTypeBytes(b.dtype);
        if (elem == 0)
        {
            return where + ".dtype is " + std::to_string(int32_t(b.dtype)) + "; not a kvcodec::DataType";
        }
        if (b.tokensPerPage < 0 || b.numHeads < 0 || b.headDim < 0)
        {
            return where + " has a negative tokensPerPage/numHeads/headDim";
        }
        bool const shaped = b.tokensPerPage > 0 && b.numHeads > 0 && b.headDim > 0;
        bool const opaque = b.tokensPerPage == 0 && b.numHeads == 0 && b.headDim == 0;
        if (!shaped && !opaque)
        {
            return where + " sets only some of tokensPerPage/numHeads/headDim; set all three or none";
        }
        if (shaped && uint64_t(b.tokensPerPage) * uint64_t(b.numHeads) * uint64_t(b.headDim) * elem != b.bytes)
        {
            return where + ".bytes is " + std::to_string(b.bytes)
                + " but tokensPerPage*numHeads*headDim*sizeof(dtype) = "
                + std::to_string(uint64_t(b.tokensPerPage) * b.numHeads * b.headDim * elem);
        }
        if (!shaped && b.bytes % elem != 0)
        {
            return where + ".bytes is " + std::to_string(b.bytes) + ", not a multiple of the element size "
                + std::to_string(elem);
        }
        return {};
    }

    std::vector<Group> groups_;
    std::vector<LifeCycle> lifeCycles_;
    std::unordered_map<LifeCycleId, size_t> index_;
};

} // namespace kvcodec

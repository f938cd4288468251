// SPDX-License-Identifier: Apache-2.0
//
// Internal to the disk tier: the free-slot bitset of a region. A cursor makes allocation
// continue after the slot handed out last, so slots fill sequentially (and adjacent writes can
// be merged into one I/O). Slots at or above the limit are never handed out: a shrink in
// progress is cutting them off. Not synchronized: the region's index mutex guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvcodec::disk::detail {

class FreeSlots
{
public:
    /// Rebuilds the bitset over `slots` slots of which [0, limit) may be handed out (limit is
    /// capped to `slots`), marking those for which `isFree(slot)` holds. The cursor restarts at 0
    /// when it lies at or above the limit.
    template <class IsFree>
    void rebuild(uint32_t slots, uint32_t limit, IsFree&& isFree)
    {
        slots_ = slots;
        limit_ = limit < slots ? limit : slots;
        bits_.assign((size_t(slots) + 63) / 64, 0);
        count_ = 0;
        for (uint32_t s = 0; s < limit_; ++s)
        {
            if (isFree(s))
            {
                bits_[s / 64] |= 1ull << (s % 64);
                ++count_;
            }
        }
        if (cursor_ >= limit_)
            cursor_ = 0;
    }

    /// Takes a free slot (the first at or after the cursor, wrapping around); -1 when none is.
    int64_t take();
    /// Marks `slot` free again, unless it lies at or above the limit.
    void give(uint32_t slot);

    [[nodiscard]] uint32_t count() const noexcept
    {
        return count_;
    }
    /// The next allocation starts from slot 0.
    void rewind() noexcept
    {
        cursor_ = 0;
    }

private:
    std::vector<uint64_t> bits_;
    uint32_t slots_ = 0;
    uint32_t limit_ = 0;
    uint32_t count_ = 0;
    uint32_t cursor_ = 0;
};

} // namespace kvcodec::disk::detail

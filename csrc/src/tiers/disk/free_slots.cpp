// SPDX-License-Identifier: Apache-2.0
#include "tiers/disk/free_slots.h"

namespace kvcodec::disk::detail {

int64_t FreeSlots::take()
{
    if (count_ == 0)
        return -1;
    size_t const words = bits_.size();
    size_t w = cursor_ / 64;
    for (size_t n = 0; n <= words; ++n, w = (w + 1) % words)
    {
        uint64_t bits = bits_[w];
        if (n == 0)
            bits &= ~0ull << (cursor_ % 64); // continue after the cursor: slots fill sequentially
        if (bits == 0)
            continue;
        uint32_t s = uint32_t(w * 64 + uint32_t(__builtin_ctzll(bits)));
        bits_[w] &= ~(1ull << (s % 64));
        --count_;
        cursor_ = (s + 1) % slots_;
        return s;
    }
    return -1;
}

void FreeSlots::give(uint32_t slot)
{
    if (slot < limit_) // Slots a shrink is cutting off are never handed out again.
    {
        bits_[slot / 64] |= 1ull << (slot % 64);
        ++count_;
    }
}

} // namespace kvcodec::disk::detail

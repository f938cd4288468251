// SPDX-License-Identifier: Apache-2.0
//
// Internal to the disk tier: the slot layout of a region. Slots are numbered globally; slot s
// lives in container file s / slotsPerContainer at byte (s % slotsPerContainer) * stride, and
// container c is the file containers/<c as four digits>.bin of the region directory.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace kvcodec::disk::detail {

struct SlotGeometry
{
    uint64_t stride = 0; ///< Bytes a slot takes in its file (slot_bytes padded to 4 KiB).
    uint32_t slotsPerContainer = 0;
    uint32_t containers = 0;
    uint32_t slots = 0; ///< containers x slotsPerContainer.

    [[nodiscard]] uint32_t containerOf(uint32_t slot) const noexcept
    {
        return slot / slotsPerContainer;
    }
    /// The slot's byte offset in its container file.
    [[nodiscard]] off_t offsetOf(uint32_t slot) const noexcept
    {
        return off_t(uint64_t(slot % slotsPerContainer) * stride);
    }
    /// Bytes of one container file.
    [[nodiscard]] uint64_t containerBytes() const noexcept
    {
        return stride * slotsPerContainer;
    }
    /// "container C slot S" (S within the container), for messages.
    [[nodiscard]] std::string where(uint32_t slot) const
    {
        return "container " + std::to_string(slot / slotsPerContainer) + " slot "
            + std::to_string(slot % slotsPerContainer);
    }
};

/// The path of container `c` in the containers directory `cdir`.
inline std::string containerFile(std::string const& cdir, uint32_t c)
{
    char leaf[32];
    std::snprintf(leaf, sizeof(leaf), "/%04u.bin", c);
    return cdir + leaf;
}

} // namespace kvcodec::disk::detail

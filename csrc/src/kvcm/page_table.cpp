// SPDX-License-Identifier: Apache-2.0
#include "kvcm/page_table.h"

#include <cstdio>
#include <random>

namespace kvcodec::kvcm {

std::string hexId(PageId id)
{
    char buf[32];
    std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(id));
    return buf;
}

PageTable::PageTable()
{
    std::random_device entropy;
    generationBase_ = 1u + (uint32_t(entropy()) ^ uint32_t(reinterpret_cast<uintptr_t>(this) >> 4)) % 0x7FFFFFFFu;
}

uint32_t PageTable::resolve(PageId id, size_t position) const
{
    uint32_t const index = uint32_t(id & 0xffffffffu);
    uint32_t const generation = uint32_t(id >> 32);
    if (index >= pages_.size() || pages_[index].generation != generation || pages_[index].level < 0)
    {
        bool const issued = index < pages_.size()
            && uint32_t(generation - generationBase_) <= uint32_t(pages_[index].generation - generationBase_);
        throw StalePageError("pages[" + std::to_string(position) + "] (page " + hexId(id) + ") is "
            + (issued ? "stale: it was freed or dropped" : "not a page of this manager"));
    }
    return index;
}

bool PageTable::isLive(PageId id) const noexcept
{
    uint32_t const index = uint32_t(id & 0xffffffffu);
    return index < pages_.size() && pages_[index].generation == uint32_t(id >> 32) && pages_[index].level >= 0;
}

uint32_t PageTable::add()
{
    if (!free_.empty())
    {
        uint32_t const index = free_.back();
        free_.pop_back();
        return index;
    }
    auto const index = uint32_t(pages_.size());
    pages_.emplace_back();
    pages_.back().generation = generationBase_;
    return index;
}

void PageTable::release(uint32_t index) noexcept
{
    Page& p = pages_[index];
    p.level = -1;
    p.slot = -1;
    p.pins = 0;
    p.priority = 0;
    ++p.generation;
    free_.push_back(index);
}

} // namespace kvcodec::kvcm

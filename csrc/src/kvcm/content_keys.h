// SPDX-License-Identifier: Apache-2.0
//
// Content keys of the KV-cache manager's pages: page index -> key and key -> page index, unique
// among live pages. Each key is stored once, in its key -> page entry; a page finds its key
// through a pointer to that entry's key (entries of an unordered_map keep their address), so
// setting a key costs one entry, not two (a lookup of hundreds of keys sets hundreds).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvcodec::kvcm {

class ContentKeys
{
public:
    /// The page's key, or an empty string.
    [[nodiscard]] std::string const& of(uint32_t index) const noexcept
    {
        static std::string const none;
        std::string const* key = index < byPage_.size() ? byPage_[index] : nullptr;
        return key != nullptr ? *key : none;
    }
    /// The page holding `key`, or nullopt.
    [[nodiscard]] std::optional<uint32_t> owner(std::string const& key) const
    {
        auto const it = owners_.find(key);
        return it == owners_.end() ? std::nullopt : std::optional<uint32_t>(it->second);
    }
    /// Sets the page's key (empty clears it); the caller checked that no other page holds it.
    void set(uint32_t index, std::string const& key)
    {
        erase(index);
        if (key.empty())
        {
            return;
        }
        if (index >= byPage_.size())
        {
            byPage_.resize(std::max<size_t>(size_t(index) + 1, 2 * byPage_.size()), nullptr);
        }
        byPage_[index] = &owners_.emplace(key, index).first->first;
    }
    /// The page no longer has a key (it was freed or dropped).
    void erase(uint32_t index) noexcept
    {
        if (index >= byPage_.size() || byPage_[index] == nullptr)
        {
            return;
        }
        auto const it = owners_.find(*byPage_[index]);
        byPage_[index] = nullptr;
        owners_.erase(it);
    }

private:
    std::unordered_map<std::string, uint32_t> owners_;
    std::vector<std::string const*> byPage_; ///< By page index: its key in owners_, or null.
};

} // namespace kvcodec::kvcm

// SPDX-License-Identifier: Apache-2.0
//
// Content keys of the KV-cache manager's pages: page index -> key and key -> page index, unique
// among live pages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

namespace kvcodec::kvcm {

class ContentKeys
{
public:
    /// The page's key, or an empty string.
    [[nodiscard]] std::string const& of(uint32_t index) const noexcept
    {
        static std::string const none;
        auto const it = keys_.find(index);
        return it == keys_.end() ? none : it->second;
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
        if (!key.empty())
        {
            keys_.emplace(index, key);
            owners_.emplace(key, index);
        }
    }
    /// The page no longer has a key (it was freed or dropped).
    void erase(uint32_t index) noexcept
    {
        auto const k = keys_.empty() ? keys_.end() : keys_.find(index);
        if (k != keys_.end())
        {
            owners_.erase(k->second);
            keys_.erase(k);
        }
    }

private:
    std::unordered_map<uint32_t, std::string> keys_;
    std::unordered_map<std::string, uint32_t> owners_;
};

} // namespace kvcodec::kvcm

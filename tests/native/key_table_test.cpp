// SPDX-License-Identifier: Apache-2.0
//
// The key table of the daemon and the disk tier (csrc/src/common/key_table.h), with each kind of
// entry, against std::unordered_map: random inserts, finds, moves to another slot (put) and erases
// of keys of 1 to 80 bytes (inline and long ones) in tables kept nearly full, so probe runs wrap
// around the end and erases shift entries back; once sized for every key, once grown from one.
// Built with AddressSanitizer and UBSan by tests/test_daemon_sanitizers.py. Prints "mismatches 0"
// and exits 0 when every answer matched the model.
#include <cstdio>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/key_table.h"

namespace {

template <class Entry>
size_t check(std::mt19937_64& rng, bool grow, size_t& operations)
{
    using Table = kvcodec::KeyTable<Entry>;
    size_t mismatches = 0;
    for (size_t maxKeys : {1u, 3u, 12u, 13u, 100u, 1000u})
    {
        Table table;
        table.reset(grow ? 1 : maxKeys);
        std::unordered_map<std::string, uint32_t> model;
        std::vector<std::string> keyOf(maxKeys);
        std::vector<uint32_t> freeSlots;
        for (uint32_t s = 0; s < maxKeys; ++s)
            freeSlots.push_back(s);
        // A small pool of keys, so the same ones come back after being erased.
        std::vector<std::string> pool;
        for (size_t i = 0; i < 3 * maxKeys + 4; ++i)
        {
            size_t const lengths[] = {0, 1, 15, 16, 49, 50, 51, 64, 80};
            std::string k(lengths[rng() % 9], '\0');
            for (char& c : k)
                c = char('a' + rng() % 26);
            k += std::to_string(i); // distinct
            pool.push_back(k);
        }
        for (size_t step = 0; step < 20000; ++step, ++operations)
        {
            std::string const& k = pool[rng() % pool.size()];
            auto const m = model.find(k);
            uint32_t const found = table.find(k, keyOf);
            if (found != (m == model.end() ? Table::kNone : m->second))
                ++mismatches;
            int const op = int(rng() % 4);
            if (op == 0 && m == model.end() && !freeSlots.empty())
            {
                uint32_t const s = freeSlots.back();
                freeSlots.pop_back();
                keyOf[s] = k;
                table.insert(k, s);
                model.emplace(k, s);
            }
            else if (op == 1 && m != model.end())
            {
                uint32_t const s = m->second;
                if (table.erase(keyOf[s], keyOf) != s)
                    ++mismatches;
                keyOf[s].clear();
                freeSlots.push_back(s);
                model.erase(m);
            }
            else if (op == 1 && table.erase(k, keyOf) != Table::kNone)
            {
                ++mismatches; // erased a key that is absent
            }
            else if (op == 2 && !freeSlots.empty())
            {
                // put: a new key, or a key moved to another slot (its old slot's key read first).
                uint32_t const s = freeSlots.back();
                freeSlots.pop_back();
                uint32_t const old = table.put(k, s, keyOf);
                if (old != (m == model.end() ? Table::kNone : m->second))
                    ++mismatches;
                if (old != Table::kNone)
                {
                    keyOf[old].clear();
                    freeSlots.push_back(old);
                }
                keyOf[s] = k;
                model[k] = s;
            }
            if (table.size() != model.size())
                ++mismatches;
        }
        for (auto const& [k, s] : model) // everything left is still found where it was put
            if (table.find(k, keyOf) != s)
                ++mismatches;
        table.clear();
        if (table.size() != 0 || (!model.empty() && table.find(model.begin()->first, keyOf) != Table::kNone))
            ++mismatches;
    }
    return mismatches;
}

} // namespace

int main()
{
    std::mt19937_64 rng(7);
    size_t mismatches = 0;
    size_t operations = 0;
    for (bool grow : {false, true})
    {
        mismatches += check<kvcodec::InlineKeyEntry>(rng, grow, operations);
        mismatches += check<kvcodec::TagEntry>(rng, grow, operations);
    }
    std::printf("operations %zu mismatches %zu\n", operations, mismatches);
    return mismatches == 0 ? 0 : 1;
}

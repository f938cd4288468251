// SPDX-License-Identifier: Apache-2.0
//
// LZ4 blocks through the LZ4 reference library. nvCOMP's CPU library (libnvcomp_cpu, linked
// already for gdeflate) exports LZ4's C API but ships no header for it, so the two functions used
// here are declared below with the signatures of LZ4's lz4.h, stable since LZ4 1.7.
#include "lz4_block.h"

#include <climits>

extern "C" {
int LZ4_compress_default(char const* src, char* dst, int srcSize, int dstCapacity);
int LZ4_decompress_safe(char const* src, char* dst, int compressedSize, int dstCapacity);
}

namespace kvcodec::nvcomp_plugin::lz4 {

size_t compress(uint8_t const* src, size_t n, uint8_t* dst, size_t cap) noexcept
{
    if (n > size_t(INT_MAX))
        return 0;
    int const capacity = cap > size_t(INT_MAX) ? INT_MAX : int(cap);
    int const got
        = LZ4_compress_default(reinterpret_cast<char const*>(src), reinterpret_cast<char*>(dst), int(n), capacity);
    return got > 0 ? size_t(got) : 0;
}

int64_t decompress(uint8_t const* src, size_t n, uint8_t* dst, size_t cap) noexcept
{
    if (n > size_t(INT_MAX))
        return -1;
    int const capacity = cap > size_t(INT_MAX) ? INT_MAX : int(cap);
    int const got
        = LZ4_decompress_safe(reinterpret_cast<char const*>(src), reinterpret_cast<char*>(dst), int(n), capacity);
    return got >= 0 ? int64_t(got) : -1;
}

} // namespace kvcodec::nvcomp_plugin::lz4

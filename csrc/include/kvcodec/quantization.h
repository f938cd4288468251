// SPDX-License-Identifier: Apache-2.0
//
// What quantizing codecs share (fp8, nvfp4 and any an author writes), the C++ side of the Python
// module kvcodec_sdk.quantization: which buffers the lossless policy leaves to quantize, the
// buffer list a lifecycle's blob is planned from, and float bit casts for host and device code.
// Header-only; nothing here crosses the plugin ABI.
#pragma once

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "kvcodec/crc32c.h" // KVCODEC_HD, KVCODEC_FORCEINLINE
#include "kvcodec/layout.h"
#include "kvcodec/params.h"

namespace kvcodec {

/// The bits of an fp32 value.
KVCODEC_HD KVCODEC_FORCEINLINE uint32_t floatBits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/// The fp32 value of `u`'s bits.
KVCODEC_HD KVCODEC_FORCEINLINE float bitsFloat(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/// The lossless policy of a quantizing codec, from its parameters lossless_roles (comma-separated
/// 'key', 'value', 'other') and lossless_layers (comma-separated layer ids). A codec's parameter
/// struct derives from it and calls readLossless() from its read().
struct LosslessPolicy
{
    bool losslessKey = false;
    bool losslessValue = false;
    std::set<int64_t> losslessLayers;

    void readLossless(ParamReader& r)
    {
        std::vector<std::string> items;
        r.readList("lossless_roles", items);
        for (auto const& role : items)
        {
            losslessKey = losslessKey || role == "key";
            losslessValue = losslessValue || role == "value";
            if (role != "key" && role != "value" && role != "other")
            {
                r.refuseItem("lossless_roles", "names '" + role + "'",
                    "valid roles are 'key', 'value', 'other' (comma-separated)");
            }
        }
        r.readList("lossless_layers", items);
        for (auto const& item : items)
        {
            bool const digits = item.size() <= 9 && item.find_first_not_of("0123456789") == std::string::npos;
            if (!digits)
            {
                r.refuseItem("lossless_layers", "has the item '" + item + "'",
                    "it must be comma-separated non-negative layer ids, e.g. '0,31'");
            }
            losslessLayers.insert(std::stoll(item));
        }
    }
};

/// True when the lossless policy leaves buffer `b` to quantize: a K, V or K-and-V buffer shaped as
/// tokens x heads x head dim, of a role and a layer not kept lossless (a K-and-V buffer holds both:
/// it stays lossless when either role is). The codec adds the dtypes it takes.
inline bool quantizableKv(BufferDesc const& b, LosslessPolicy const& params)
{
    bool const shaped = b.tokensPerPage > 0 && b.numHeads > 0 && b.headDim > 0;
    bool const role = (b.role == BufferRole::kKey && !params.losslessKey)
        || (b.role == BufferRole::kValue && !params.losslessValue)
        || (b.role == BufferRole::kKeyValue && !params.losslessKey && !params.losslessValue);
    return shaped && role && params.losslessLayers.count(b.layerId) == 0;
}

/// The buffers the blob of lifecycle `lc` is planned from, into `out`: its own, in descriptor
/// order, or one opaque (kOther, uint8) buffer per pool covering the whole slot when it declares
/// none. A buffer that `quantizes(buffer)` must not share hot bytes with another (decode would
/// write both): returns the error naming them, else an empty string.
template <class Quantizes>
std::string quantizationBuffers(
    HotLayout const& layout, HotLayout::LifeCycle const& lc, Quantizes&& quantizes, std::vector<BufferDesc>& out)
{
    auto const& group = layout.groups()[lc.group];
    out = lc.buffers;
    for (size_t p = 0; lc.buffers.empty() && p < group.pools.size(); ++p)
    {
        out.push_back(
            {lc.id, BufferRole::kOther, int32_t(p), DataType::kUInt8, 0, group.pools[p].slotBytes, 0, 0, 0, 0});
    }
    for (size_t i = 0; i < out.size(); ++i)
    {
        for (size_t j = i + 1; j < out.size(); ++j)
        {
            BufferDesc const& a = out[i];
            BufferDesc const& b = out[j];
            bool const overlap = a.poolIndex == b.poolIndex && a.byteOffset < b.byteOffset + b.bytes
                && b.byteOffset < a.byteOffset + a.bytes;
            if (overlap && (quantizes(a) || quantizes(b)))
            {
                return "lifecycle " + std::to_string(lc.id) + ": buffers[" + std::to_string(i) + "] and buffers["
                    + std::to_string(j) + "] overlap in pool " + std::to_string(a.poolIndex)
                    + " and one of them is quantized; a quantized buffer must not share hot bytes with another buffer";
            }
        }
    }
    return {};
}

} // namespace kvcodec

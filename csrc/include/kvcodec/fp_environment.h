// SPDX-License-Identifier: Apache-2.0
//
// The floating-point environment of a CPU codec call. A codec's CPU implementation runs on the
// caller's thread, whose floating-point control bits are whatever the caller (or a library it
// loaded) set: flush-to-zero, denormals-are-zero (torch.set_flush_denormal(True) sets both) or a
// rounding mode other than to-nearest. IEEE arithmetic under those gives other blobs than the
// CUDA implementation and the golden vectors. CodecBase runs every CPU call inside an IeeeScope;
// a codec not built on it holds one itself. Header-only, for use inside codecs (built-in or
// plugin).
#pragma once

#if defined(__x86_64__) || defined(_M_X64) || defined(__SSE2__)
#include <xmmintrin.h>
#define KVCODEC_HAVE_MXCSR 1
#endif

namespace kvcodec {

/// Clears flush-to-zero and denormals-are-zero and selects round-to-nearest-even for the scope,
/// restoring the caller's settings on exit (x86-64: the MXCSR register, which SSE and AVX
/// arithmetic follows; elsewhere the default environment is assumed and nothing changes).
class IeeeScope
{
public:
    IeeeScope() noexcept
    {
#if KVCODEC_HAVE_MXCSR
        saved_ = _mm_getcsr();
        _mm_setcsr(saved_ & ~kControlBits);
#endif
    }

    ~IeeeScope()
    {
#if KVCODEC_HAVE_MXCSR
        _mm_setcsr(saved_);
#endif
    }

    IeeeScope(IeeeScope const&) = delete;
    IeeeScope& operator=(IeeeScope const&) = delete;

    /// MXCSR's flush-to-zero (bit 15), rounding control (bits 13-14) and denormals-are-zero (bit 6).
    static constexpr unsigned kControlBits = 0xE040u;

private:
    unsigned saved_ = 0;
};

} // namespace kvcodec

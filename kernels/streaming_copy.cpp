#include "kernels/streaming_copy.hpp"

#include <cstddef>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace muon {

#if defined(__x86_64__)

void copy_streaming(float* dst, const float* src, int64_t n) {
  int64_t i = 0;
  // movntps needs a 16-byte aligned destination; a float's is 4, so at most three go first.
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 15) != 0; ++i) dst[i] = src[i];
  // Four stores of 16 bytes per turn: a whole 64-byte line, so the write-combining buffer goes
  // out full.
  for (; i + 16 <= n; i += 16) {
    const __m128 a = _mm_loadu_ps(src + i);
    const __m128 b = _mm_loadu_ps(src + i + 4);
    const __m128 c = _mm_loadu_ps(src + i + 8);
    const __m128 d = _mm_loadu_ps(src + i + 12);
    _mm_stream_ps(dst + i, a);
    _mm_stream_ps(dst + i + 4, b);
    _mm_stream_ps(dst + i + 8, c);
    _mm_stream_ps(dst + i + 12, d);
  }
  for (; i < n; ++i) dst[i] = src[i];
  // Non-temporal stores are weakly ordered, even against later ordinary stores.
  _mm_sfence();
}

#else

void copy_streaming(float* dst, const float* src, int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

#endif

}  // namespace muon

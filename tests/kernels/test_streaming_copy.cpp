// copy_streaming (kernels/streaming_copy.hpp): bit for bit memcpy at every alignment of source
// and destination and every length around the 16-element groups, NaN payloads, signed zeros and
// subnormals included, and nothing written outside [dst, dst + n).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/streaming_copy.hpp"

namespace {

// Bit patterns a float copy must keep: quiet and signalling NaNs with payloads, both zeros,
// subnormals, infinities, and random words.
std::vector<uint32_t> awkward_words(size_t n, unsigned seed) {
  const uint32_t special[] = {0x7fc00001u, 0x7f800001u, 0xffc12345u, 0x80000000u, 0x00000000u,
                              0x00000001u, 0x807fffffu, 0x7f800000u, 0xff800000u, 0x3f800000u};
  std::mt19937 rng(seed);
  std::vector<uint32_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = i % 3 == 0 ? special[(i / 3) % 10] : rng();
  return out;
}

}  // namespace

TEST(StreamingCopy, IsMemcpyBitForBitAtEveryAlignmentAndLength) {
  const auto src_words = awkward_words(300, 1);
  for (size_t src_shift = 0; src_shift < 4; ++src_shift) {
    for (size_t dst_shift = 0; dst_shift < 4; ++dst_shift) {
      for (int64_t n : {0, 1, 3, 4, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255}) {
        // Guard words around the destination: the copy writes [dst, dst + n) and nothing else.
        std::vector<uint32_t> dst(static_cast<size_t>(n) + 16, 0xdeadbeefu);
        float* d = reinterpret_cast<float*>(dst.data()) + 4 + dst_shift;
        const float* s = reinterpret_cast<const float*>(src_words.data()) + src_shift;
        muon::copy_streaming(d, s, n);
        for (size_t i = 0; i < dst.size(); ++i) {
          const auto at = static_cast<int64_t>(i) - 4 - static_cast<int64_t>(dst_shift);
          const uint32_t want = at >= 0 && at < n ? src_words[src_shift + static_cast<size_t>(at)]
                                                  : 0xdeadbeefu;
          ASSERT_EQ(dst[i], want) << "src+" << src_shift << " dst+" << dst_shift << " n " << n
                                  << " word " << i;
        }
      }
    }
  }
}

TEST(StreamingCopy, CopiesALargeBufferAsMemcpyDoes) {
  // A 4 MiB buffer filled in 256 KiB chunks at an odd offset, as a contribution store fills one.
  const int64_t n = int64_t{1} << 20, chunk = 65536;
  const auto words = awkward_words(static_cast<size_t>(n), 2);
  const float* src = reinterpret_cast<const float*>(words.data());
  std::vector<float> streamed(static_cast<size_t>(n) + 1), copied(static_cast<size_t>(n) + 1);
  for (int64_t off = 0; off < n; off += chunk) {
    muon::copy_streaming(streamed.data() + 1 + off, src + off, chunk);
    std::memcpy(copied.data() + 1 + off, src + off, chunk * sizeof(float));
  }
  EXPECT_EQ(std::memcmp(streamed.data(), copied.data(), streamed.size() * sizeof(float)), 0);
}

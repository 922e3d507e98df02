// The contributor-order tile reduction: the launch plan and the host version against the
// server's StepReducer (bitwise, fp32 and bf16 contributions, sources beyond one launch, a
// reduction continued across calls) run everywhere; the device version against both runs where
// a GPU is usable and skips with the reason elsewhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "daemon/registration.hpp"
#include "daemon/step_reducer.hpp"
#include "kernels/tile_reduce.hpp"
#include "kernels/bf16.hpp"

#ifdef MUON_HAVE_CUDA
#include "kernels/device_probe.hpp"
#include "tests/kernels/device_vector.hpp"
#endif

using namespace muon;
using muon::daemon::ParameterLayout;
using muon::daemon::ParameterSpec;
using muon::daemon::PendingRegistration;
using muon::daemon::StepReducer;
using muon::transport::Range;

namespace {

// One contributor's values: fp32, or bf16 bits (`bits`) with `values` their exact widening.
struct Contribution {
  DType dtype = DType::f32;
  std::vector<float> values;
  std::vector<uint16_t> bits;
  TileSource source() const {
    return {dtype == DType::f32 ? static_cast<const void*>(values.data())
                                    : static_cast<const void*>(bits.data()),
            dtype};
  }
};

// Values whose sum depends on the order: large opposite magnitudes next to small ones, plus
// Gaussian noise; every `bf16_every`-th rank (0: none) contributes bf16.
std::vector<Contribution> contributions(int ranks, int64_t n, unsigned seed, int bf16_every = 0) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 3);
  std::vector<Contribution> out(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& c = out[static_cast<size_t>(r)];
    c.dtype = bf16_every > 0 && r % bf16_every == bf16_every - 1 ? DType::bf16 : DType::f32;
    c.values.resize(static_cast<size_t>(n));
    for (auto& v : c.values) {
      const int k = pick(gen);
      v = k == 0 ? 1e8f * (noise(gen) > 0 ? 1.0f : -1.0f) : (k == 1 ? 1e-3f : 1.0f) * noise(gen);
    }
    if (c.dtype == DType::bf16) {
      c.bits.resize(c.values.size());
      for (size_t i = 0; i < c.values.size(); ++i) {
        c.bits[i] = f32_to_bf16(c.values[i]);
        c.values[i] = bf16_to_f32(c.bits[i]);  // what the server widens to
      }
    }
  }
  return out;
}

// The server's reduction: every rank pushes every element, in chunks of `chunk`, ranks and
// chunks arriving in a shuffled order.
std::vector<float> step_reducer_sum(const std::vector<Contribution>& cs, int64_t n, int64_t chunk,
                                    unsigned seed) {
  ParameterSpec spec;
  spec.name = "w";
  spec.shape = {1, 1, n};
  const int ranks = static_cast<int>(cs.size());
  PendingRegistration reg(spec, ranks);
  for (int r = 0; r < ranks; ++r) reg.add(r, spec, {Range{0, n}}, {});
  const ParameterLayout layout = reg.finish();
  StepReducer red(layout, 0);
  struct Piece {
    int rank;
    int64_t offset;
  };
  std::vector<Piece> pieces;
  for (int r = 0; r < ranks; ++r)
    for (int64_t off = 0; off < n; off += chunk) pieces.push_back({r, off});
  std::shuffle(pieces.begin(), pieces.end(), std::mt19937(seed));
  for (const Piece& p : pieces) {
    const auto len = static_cast<size_t>(std::min(chunk, n - p.offset));
    red.add(p.rank, p.offset, {cs[static_cast<size_t>(p.rank)].values.data() + p.offset, len});
  }
  for (int r = ranks - 1; r >= 0; --r) red.commit(r);
  std::vector<float> grad(static_cast<size_t>(n));
  red.reduce(grad.data());
  return grad;
}

std::vector<TileSource> sources_of(const std::vector<Contribution>& cs, size_t first = 0,
                                   size_t last = SIZE_MAX) {
  std::vector<TileSource> s;
  for (size_t i = first; i < std::min(last, cs.size()); ++i) s.push_back(cs[i].source());
  return s;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// ---- plan and host version: run everywhere ---------------------------------------------------

TEST(TileReducePlan, ChunksSourcesInOrderAndAssignsOnlyFirst) {
  EXPECT_TRUE(plan_tile_reduce(0, TileReduce::assign).empty());
  const auto one = plan_tile_reduce(1, TileReduce::assign);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].first, 0u);
  EXPECT_EQ(one[0].count, 1u);
  EXPECT_TRUE(one[0].assign);
  const auto many = plan_tile_reduce(2 * kMaxTilesPerLaunch + 1, TileReduce::assign);
  ASSERT_EQ(many.size(), 3u);
  EXPECT_EQ(many[1].first, kMaxTilesPerLaunch);
  EXPECT_EQ(many[1].count, kMaxTilesPerLaunch);
  EXPECT_FALSE(many[1].assign);
  EXPECT_EQ(many[2].first, 2 * kMaxTilesPerLaunch);
  EXPECT_EQ(many[2].count, 1u);
  EXPECT_FALSE(many[2].assign);
  const auto acc = plan_tile_reduce(3, TileReduce::accumulate);
  ASSERT_EQ(acc.size(), 1u);
  EXPECT_FALSE(acc[0].assign);
}

TEST(TileReduceHost, BitwiseEqualsStepReducerForAnyContributorCount) {
  const int64_t n = 1000;
  for (int ranks : {1, 2, 3, 8, 9, 17}) {
    const auto cs = contributions(ranks, n, 100u + ranks);
    const auto expected = step_reducer_sum(cs, n, 96, 7u * ranks);
    std::vector<float> acc(static_cast<size_t>(n), 42.0f);  // assign ignores old contents
    reduce_tiles_host(sources_of(cs), acc.data(), n, TileReduce::assign);
    EXPECT_TRUE(bitwise_equal(acc, expected)) << ranks << " ranks";
  }
}

TEST(TileReduceHost, OrderMattersForTheseValues) {
  // Guards the test above: the reverse order gives other bits, so equality means rank order.
  const int64_t n = 1000;
  const auto cs = contributions(3, n, 5);
  std::vector<float> forward(static_cast<size_t>(n)), reverse(static_cast<size_t>(n));
  reduce_tiles_host(sources_of(cs), forward.data(), n, TileReduce::assign);
  std::vector<TileSource> rev = sources_of(cs);
  std::reverse(rev.begin(), rev.end());
  reduce_tiles_host(rev, reverse.data(), n, TileReduce::assign);
  EXPECT_FALSE(bitwise_equal(forward, reverse));
}

TEST(TileReduceHost, Bf16ContributionsWidenExactly) {
  const int64_t n = 777;
  for (int every : {1, 2}) {  // all bf16, or mixed with fp32
    const auto cs = contributions(5, n, 31u + every, every);
    const auto expected = step_reducer_sum(cs, n, 100, 3);
    std::vector<float> acc(static_cast<size_t>(n));
    reduce_tiles_host(sources_of(cs), acc.data(), n, TileReduce::assign);
    EXPECT_TRUE(bitwise_equal(acc, expected)) << "bf16 every " << every;
  }
}

TEST(TileReduceHost, ReductionContinuedAcrossCallsEqualsOneCall) {
  const int64_t n = 500;
  const auto cs = contributions(11, n, 77);
  std::vector<float> once(static_cast<size_t>(n)), split(static_cast<size_t>(n));
  reduce_tiles_host(sources_of(cs), once.data(), n, TileReduce::assign);
  reduce_tiles_host(sources_of(cs, 0, 4), split.data(), n, TileReduce::assign);
  reduce_tiles_host(sources_of(cs, 4, 5), split.data(), n, TileReduce::accumulate);
  reduce_tiles_host(sources_of(cs, 5), split.data(), n, TileReduce::accumulate);
  EXPECT_TRUE(bitwise_equal(once, split));
}

TEST(TileReduceHost, RejectsBadArguments) {
  std::vector<float> acc(4), a(4, 1.0f);
  EXPECT_THROW(reduce_tiles_host({}, acc.data(), 4, TileReduce::assign), InvalidArgument);
  const std::vector<TileSource> null_source = {{nullptr, DType::f32}};
  EXPECT_THROW(reduce_tiles_host(null_source, acc.data(), 4, TileReduce::assign), InvalidArgument);
  const std::vector<TileSource> ok = {{a.data(), DType::f32}};
  EXPECT_THROW(reduce_tiles_host(ok, acc.data(), -1, TileReduce::assign), InvalidArgument);
  EXPECT_NO_THROW(reduce_tiles_host({}, acc.data(), 4, TileReduce::accumulate));  // nothing to add
}

// ---- device version: skips where no GPU is usable --------------------------------------------

#ifdef MUON_HAVE_CUDA

namespace {

using muon::testing::DeviceVector;

class TileReduceDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = cuda_unavailable_reason();
    if (!reason.empty()) GTEST_SKIP() << "no usable GPU: " << reason;
  }

  // Uploads the contributions, reduces [first, last) on the device with `mode` into `acc`.
  static void reduce_on_device(const std::vector<Contribution>& cs, size_t first, size_t last,
                               DeviceVector<float>& acc, TileReduce mode) {
    std::vector<std::unique_ptr<DeviceVector<float>>> f32;
    std::vector<std::unique_ptr<DeviceVector<uint16_t>>> bf16;
    std::vector<TileSource> sources;
    for (size_t i = first; i < std::min(last, cs.size()); ++i) {
      if (cs[i].dtype == DType::f32) {
        f32.push_back(std::make_unique<DeviceVector<float>>(cs[i].values));
        sources.push_back({f32.back()->get(), DType::f32});
      } else {
        bf16.push_back(std::make_unique<DeviceVector<uint16_t>>(cs[i].bits));
        sources.push_back({bf16.back()->get(), DType::bf16});
      }
    }
    reduce_tiles(sources, acc.get(), static_cast<int64_t>(acc.size()), mode, nullptr);
    MUON_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

}  // namespace

TEST_F(TileReduceDevice, BitwiseEqualsStepReducerAndHost) {
  // (1 << 20) + 3 elements for 3 ranks: many blocks and an odd tail.
  for (int ranks : {1, 2, 3, 9, 17}) {
    const int64_t n = ranks == 3 ? (int64_t{1} << 20) + 3 : 4099;
    const auto cs = contributions(ranks, n, 200u + ranks, ranks == 9 ? 3 : 0);
    const auto expected = step_reducer_sum(cs, n, 1000, 11u * ranks);
    std::vector<float> host(static_cast<size_t>(n));
    reduce_tiles_host(sources_of(cs), host.data(), n, TileReduce::assign);
    DeviceVector<float> acc(std::vector<float>(static_cast<size_t>(n), 42.0f));
    reduce_on_device(cs, 0, cs.size(), acc, TileReduce::assign);
    const auto device = acc.download();
    EXPECT_TRUE(bitwise_equal(device, expected)) << ranks << " ranks vs StepReducer";
    EXPECT_TRUE(bitwise_equal(device, host)) << ranks << " ranks vs host";
  }
}

TEST_F(TileReduceDevice, Bf16AndAContinuedReduction) {
  const int64_t n = 10007;
  const auto cs = contributions(12, n, 99, 2);
  const auto expected = step_reducer_sum(cs, n, 512, 5);
  DeviceVector<float> acc(static_cast<size_t>(n));
  reduce_on_device(cs, 0, 5, acc, TileReduce::assign);
  reduce_on_device(cs, 5, 12, acc, TileReduce::accumulate);
  EXPECT_TRUE(bitwise_equal(acc.download(), expected));
}

TEST_F(TileReduceDevice, RejectsBadArgumentsBeforeLaunching) {
  DeviceVector<float> acc(4);
  EXPECT_THROW(reduce_tiles({}, acc.get(), 4, TileReduce::assign, nullptr), InvalidArgument);
  const std::vector<TileSource> null_source = {{nullptr, DType::f32}};
  EXPECT_THROW(reduce_tiles(null_source, acc.get(), 4, TileReduce::assign, nullptr),
               InvalidArgument);
}

#endif  // MUON_HAVE_CUDA

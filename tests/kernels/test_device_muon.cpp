// The device Muon step against the host: momentum bitwise equal to the host's elementwise math;
// updates within the CUDA backend's tolerances of the CPU oracle and bitwise equal to the CUDA
// backend's host API (the same Newton-Schulz); CUDA-graph replay and stream priorities bitwise
// equal to the plain run; non-finite gradients handled on the device. GPU tests skip with the
// reason where no GPU is usable.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "kernels/device_buffer.hpp"
#include "kernels/device_muon.hpp"
#include "kernels/device_stream.hpp"
#include "kernels/device_sync_guard.hpp"
#include "kernels/elementwise.hpp"
#include "tests/kernels/device_vector.hpp"
#include "tests/kernels/svd_oracle.hpp"

using namespace muon;
using namespace muon::testing;

namespace {

constexpr double kFp32Tolerance = 1e-4;  // as test_cuda_backend
constexpr double kBf16Tolerance = 3e-2;

double tolerance(Precision p) {
  return p == Precision::fp32 ? kFp32Tolerance : kBf16Tolerance;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

MuonOptions options_of(MomentumConvention conv, bool nesterov, Precision p) {
  MuonOptions o;
  o.momentum = {conv, 0.95f, nesterov};
  o.orthogonalize.precision = p;
  return o;
}

// The result of one device step.
struct StepResult {
  std::vector<float> momentum, update;
  int status = 0;
};

StepResult device_step(DeviceMuon& dm, const MatrixShape& shape, const std::vector<float>& g,
                       const std::vector<float>& m0, const MuonOptions& o,
                       StreamHandle stream = nullptr) {
  DeviceVector<float> grad(g), momentum(m0), update(g.size());
  DeviceVector<int> status(std::vector<int>{0});
  dm.step("w", shape, grad.get(), momentum.get(), update.get(), o, stream, status.get());
  return {momentum.download(), update.download(), status.download()[0]};
}

// Creates a DeviceMuon per test, or skips the test with the reason.
class DeviceMuonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      dm_ = std::make_unique<DeviceMuon>();
    } catch (const BackendUnavailable& e) {
      GTEST_SKIP() << "CUDA unavailable: " << e.what();
    }
  }
  std::unique_ptr<DeviceMuon> dm_;
};

// Shapes that take every path: one wide block in place, tall (transposed), square, a batch of
// slices, row splits.
struct Case {
  MatrixShape shape;
  std::vector<int64_t> splits;
};
const Case kCases[] = {{{1, 48, 80}, {}},
                       {{1, 96, 64}, {}},
                       {{1, 64, 64}, {}},
                       {{3, 40, 72}, {}},
                       {{2, 64, 48}, {16, 16, 32}}};

}  // namespace

// ---- run everywhere ---------------------------------------------------------------------------

TEST(DeviceMuonFactory, EitherWorksOrThrowsBackendUnavailableWithAReason) {
  try {
    DeviceMuon dm;
    EXPECT_EQ(dm.default_precision(), Precision::bf16);
    EXPECT_EQ(dm.captured_graphs(), 0u);
  } catch (const BackendUnavailable& e) {
    EXPECT_FALSE(e.message().empty());
    std::cout << "[   INFO   ] DeviceMuon: " << e.what() << "\n";
  }
}

TEST(StreamPriorityNames, ParseAndReject) {
  EXPECT_EQ(parse_stream_priority("low"), StreamPriority::low);
  EXPECT_EQ(parse_stream_priority("normal"), StreamPriority::normal);
  EXPECT_EQ(parse_stream_priority("high"), StreamPriority::high);
  EXPECT_THROW(parse_stream_priority("urgent"), InvalidArgument);
}

// gpu-review F7: device-synchronizing calls share the guard, a capture excludes them all.
TEST(DeviceSyncGuard, SyncsRunSideBySideAndACaptureExcludesThem) {
  {
    const auto first = device_sync_scope();
    std::atomic<bool> second_held{false};
    std::thread other([&] {
      const auto second = device_sync_scope();  // would block forever if scopes excluded
      second_held = true;
    });
    other.join();
    EXPECT_TRUE(second_held);
  }
  std::atomic<bool> sync_held{false};
  std::thread syncer;
  {
    const auto exclusive = capture_scope();
    syncer = std::thread([&] {
      const auto sync = device_sync_scope();
      sync_held = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(sync_held) << "a device sync ran while a capture held the guard";
  }
  syncer.join();
  EXPECT_TRUE(sync_held);
}

// ---- GPU tests --------------------------------------------------------------------------------

TEST_F(DeviceMuonTest, MomentumIsBitwiseTheHostsElementwiseMath) {
  const int r = 48, c = 80, n = r * c;
  const auto g = gaussian(n, 1), m0 = gaussian(n, 2);
  for (auto conv : {MomentumConvention::sum, MomentumConvention::ema}) {
    for (bool nesterov : {true, false}) {
      const auto o = options_of(conv, nesterov, Precision::fp32);
      std::vector<float> expected = m0;
      for (int i = 0; i < n; ++i) expected[i] = momentum_step(conv, m0[i], g[i],
                                                                momentum_coefficients(o.momentum.mu));
      const auto res = device_step(*dm_, {1, r, c}, g, m0, o);
      EXPECT_TRUE(bitwise_equal(res.momentum, expected))
          << "convention " << static_cast<int>(conv) << " nesterov " << nesterov;
      EXPECT_EQ(res.status, 0);
    }
  }
}

TEST_F(DeviceMuonTest, StepMatchesTheCpuOracle) {
  auto cpu = make_backend("cpu");
  unsigned seed = 10;
  for (const Case& k : kCases) {
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      auto o = options_of(MomentumConvention::sum, true, p);
      o.orthogonalize.row_splits = k.splits;
      auto cpu_o = o;
      cpu_o.orthogonalize.precision = Precision::fp32;
      const auto n = static_cast<size_t>(k.shape.numel());
      const auto g = gaussian(n, ++seed), m0 = gaussian(n, ++seed);
      const auto res = device_step(*dm_, k.shape, g, m0, o);
      auto m_cpu = m0;
      std::vector<float> u_cpu(n);
      ASSERT_TRUE(cpu->muon_update("w", k.shape, g.data(), m_cpu.data(), u_cpu.data(), cpu_o));
      EXPECT_TRUE(bitwise_equal(res.momentum, m_cpu)) << k.shape.str();
      EXPECT_LT(rel_error(res.update, u_cpu), tolerance(p))
          << precision_name(p) << " " << k.shape.str() << " splits " << k.splits.size();
    }
  }
}

TEST_F(DeviceMuonTest, StepIsBitwiseTheCudaBackendsHostApi) {
  auto cuda = make_backend("cuda");
  unsigned seed = 40;
  for (const Case& k : kCases) {
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      auto o = options_of(MomentumConvention::ema, true, p);
      o.orthogonalize.row_splits = k.splits;
      const auto n = static_cast<size_t>(k.shape.numel());
      const auto g = gaussian(n, ++seed), m0 = gaussian(n, ++seed);
      const auto res = device_step(*dm_, k.shape, g, m0, o);
      auto m_host = m0;
      std::vector<float> u_host(n);
      ASSERT_TRUE(cuda->muon_update("w", k.shape, g.data(), m_host.data(), u_host.data(), o));
      EXPECT_TRUE(bitwise_equal(res.momentum, m_host)) << k.shape.str();
      EXPECT_TRUE(bitwise_equal(res.update, u_host)) << precision_name(p) << " " << k.shape.str();
    }
  }
}

TEST_F(DeviceMuonTest, OrthogonalizeLeavesItsInputAndMatchesTheCpu) {
  auto cpu = make_backend("cpu");
  const MatrixShape shape{1, 64, 96};
  const auto g = matrix_with_spectrum(64, 96, 1e-2, 3);
  DeviceVector<float> in(g), out(g.size());
  OrthogonalizeOptions o;
  o.precision = Precision::fp32;
  dm_->orthogonalize("w", shape, in.get(), out.get(), o, nullptr);
  std::vector<float> ref(g.size());
  ASSERT_TRUE(cpu->orthogonalize("w", shape, g.data(), ref.data(), o));
  EXPECT_TRUE(bitwise_equal(in.download(), g));
  EXPECT_LT(rel_error(out.download(), ref), kFp32Tolerance);
}

TEST_F(DeviceMuonTest, ConventionNoneOrthogonalizesTheGradientWithoutMomentum) {
  const MatrixShape shape{1, 32, 64};
  const auto g = gaussian(size_t(32) * 64, 5);
  auto o = options_of(MomentumConvention::none, false, Precision::fp32);
  DeviceVector<float> grad(g), update(g.size()), direct(g.size());
  dm_->step("w", shape, grad.get(), nullptr, update.get(), o, nullptr);
  dm_->orthogonalize("w", shape, grad.get(), direct.get(), o.orthogonalize, nullptr);
  EXPECT_TRUE(bitwise_equal(update.download(), direct.download()));
}

TEST_F(DeviceMuonTest, GraphReplayIsBitwiseTheUncapturedRun) {
  DeviceMuon graphs({.device = 0, .capture_graphs = true});
  unsigned seed = 70;
  for (const Case& k : kCases) {
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      auto o = options_of(MomentumConvention::sum, true, p);
      o.orthogonalize.row_splits = k.splits;
      const auto n = static_cast<size_t>(k.shape.numel());
      const auto g = gaussian(n, ++seed), m0 = gaussian(n, ++seed);
      const auto plain = device_step(*dm_, k.shape, g, m0, o);
      const auto captured = device_step(graphs, k.shape, g, m0, o);  // first: run, capture
      const auto replayed = device_step(graphs, k.shape, g, m0, o);  // second: replay only
      EXPECT_TRUE(bitwise_equal(captured.update, plain.update)) << k.shape.str();
      EXPECT_TRUE(bitwise_equal(replayed.update, plain.update)) << k.shape.str();
      EXPECT_TRUE(bitwise_equal(replayed.momentum, plain.momentum)) << k.shape.str();
    }
  }
  EXPECT_GT(graphs.captured_graphs(), 0u);
  const size_t after = graphs.captured_graphs();
  const auto g = gaussian(size_t(48) * 80, 1), m0 = gaussian(size_t(48) * 80, 2);
  device_step(graphs, {1, 48, 80}, g, m0,
              options_of(MomentumConvention::sum, true, Precision::fp32));
  EXPECT_EQ(graphs.captured_graphs(), after)
      << "a known (shape, options) key is not captured again";
  EXPECT_EQ(dm_->captured_graphs(), 0u);
}

// gpu-review F7: a capture on this thread while another frees and reallocates device memory
// (as the io thread does when a session closes or a buffer grows) stays valid, and replays give
// the uncaptured bits. Without the guard the frees would invalidate captures on a real GPU.
TEST_F(DeviceMuonTest, CapturesStayValidWhileAnotherThreadFrees) {
  DeviceMuon graphs({.device = 0, .capture_graphs = true});
  std::atomic<bool> stop{false};
  std::atomic<int> frees{0};
  std::thread churn([&] {
    size_t bytes = 1 << 20;
    while (!stop) {
      DeviceBuffer b;
      b.reserve(bytes);
      b.reserve(bytes * 2);  // grows: frees the first block
      ++frees;
      bytes = bytes % (size_t(8) << 20) + (1 << 20);
    }
  });
  unsigned seed = 170;
  size_t keys = 0;
  for (int round = 0; round < 3; ++round) {
    for (const Case& k : kCases) {
      auto o = options_of(MomentumConvention::sum, true, Precision::fp32);
      o.orthogonalize.row_splits = k.splits;
      o.orthogonalize.eps = 1e-7f * static_cast<float>(round + 1);  // a new key each round
      const auto n = static_cast<size_t>(k.shape.numel());
      const auto g = gaussian(n, ++seed), m0 = gaussian(n, ++seed);
      const auto plain = device_step(*dm_, k.shape, g, m0, o);
      const auto first = device_step(graphs, k.shape, g, m0, o);
      const auto replayed = device_step(graphs, k.shape, g, m0, o);
      EXPECT_TRUE(bitwise_equal(first.update, plain.update)) << k.shape.str();
      EXPECT_TRUE(bitwise_equal(replayed.update, plain.update)) << k.shape.str();
    }
    keys = graphs.captured_graphs();
  }
  stop = true;
  churn.join();
  EXPECT_GT(frees.load(), 0);
  EXPECT_GE(keys, 3 * std::size(kCases)) << "every case of every round is a new key";
}

TEST_F(DeviceMuonTest, StreamPrioritiesGiveTheSameBits) {
  DeviceStream low(StreamPriority::low), normal(StreamPriority::normal), high(StreamPriority::high);
  EXPECT_EQ(low.priority(), stream_priority_value(StreamPriority::low));
  EXPECT_EQ(high.priority(), stream_priority_value(StreamPriority::high));
  EXPECT_GE(low.priority(), normal.priority());  // CUDA: larger numbers are less urgent
  EXPECT_GE(normal.priority(), high.priority());
  std::cout << "[   INFO   ] stream priorities: low " << low.priority() << ", normal "
            << normal.priority() << ", high " << high.priority() << "\n";
  const MatrixShape shape{2, 64, 96};
  const auto n = static_cast<size_t>(shape.numel());
  const auto g = gaussian(n, 81), m0 = gaussian(n, 82);
  const auto o = options_of(MomentumConvention::sum, true, Precision::bf16);
  const auto on_default = device_step(*dm_, shape, g, m0, o, nullptr);
  for (const DeviceStream* s : {&low, &normal, &high}) {
    const auto res = device_step(*dm_, shape, g, m0, o, s->get());
    EXPECT_TRUE(bitwise_equal(res.update, on_default.update)) << "priority " << s->priority();
    EXPECT_TRUE(bitwise_equal(res.momentum, on_default.momentum));
  }
}

TEST_F(DeviceMuonTest, NonFiniteGradientLeavesMomentumAndZeroesTheUpdate) {
  for (const Case& k : kCases) {
    const auto n = static_cast<size_t>(k.shape.numel());
    auto g = gaussian(n, 91);
    const auto m0 = gaussian(n, 92);
    g[n / 2] = std::numeric_limits<float>::quiet_NaN();
    g[n - 1] = std::numeric_limits<float>::infinity();
    auto o = options_of(MomentumConvention::sum, true, Precision::bf16);
    o.orthogonalize.row_splits = k.splits;
    const auto res = device_step(*dm_, k.shape, g, m0, o);
    EXPECT_EQ(res.status, kDeviceInputNonFinite) << k.shape.str();
    EXPECT_TRUE(bitwise_equal(res.momentum, m0)) << "momentum untouched, " << k.shape.str();
    for (float v : res.update) ASSERT_EQ(v, 0.0f) << k.shape.str();
  }
}

TEST_F(DeviceMuonTest, ValidatesOnTheHostBeforeEnqueueing) {
  DeviceVector<float> a(16), b(16), c(16);
  MuonOptions o;
  o.orthogonalize.schedule = "no_such_schedule";
  EXPECT_THROW(dm_->step("w", {1, 4, 4}, a.get(), b.get(), c.get(), o, nullptr), InvalidArgument);
  MuonOptions keeps_momentum;
  EXPECT_THROW(dm_->step("w", {1, 4, 4}, a.get(), nullptr, c.get(), keeps_momentum, nullptr),
               InvalidArgument);
}

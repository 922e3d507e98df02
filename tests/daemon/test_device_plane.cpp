// The server's GPU data plane against the host path it must equal: the device contribution store
// reduces bitwise as the host StepReducer (fp32 and bf16 pushes, accumulation, any arrival
// order); a parameter's device step, run through the Scheduler on the plane's StepRunner as the
// server runs it, is bitwise DeviceMuon's on the same reduced gradient, over several steps
// (momentum carried on the device), alone or batched with parameters of its shape; a non-finite
// gradient is refused (or skipped) with the momentum untouched, and in a batch only its own
// step is. The session rings are exercised across processes by the
// end-to-end GPU test (test_server_integration). GPU tests skip with the reason where no GPU is
// usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "daemon/device_plane.hpp"
#include "daemon/registration.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/step/step_runner.hpp"
#include "daemon/step_reducer.hpp"
#include "kernels/device_muon.hpp"
#include "kernels/device_stream.hpp"
#include "tests/kernels/device_vector.hpp"
#include "transport/bf16.hpp"

using namespace muon;
using namespace muon::daemon;
using namespace muon::testing;

namespace {

ParameterLayout layout_of(const ParameterSpec& spec, const std::vector<std::vector<Range>>& push) {
  PendingRegistration reg(spec, static_cast<int>(push.size()));
  for (size_t r = 0; r < push.size(); ++r) reg.add(static_cast<int>(r), spec, push[r], {});
  return reg.finish();
}

ParameterSpec spec_of(MatrixShape shape, MuonOptions options = {}) {
  ParameterSpec s;
  s.name = "w";
  s.shape = shape;
  s.options = options;
  return s;
}

std::vector<float> random_values(size_t n, uint32_t seed, bool wide = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-8.0f, 8.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = wide ? normal(rng) * std::pow(10.0f, exponent(rng)) : normal(rng);
  return v;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

NsJob device_job(const std::string& name, int64_t step, const MatrixShape& shape,
                 const MuonOptions& o, DeviceParamState& param) {
  NsJob job;
  job.name = name;
  job.step = step;
  job.shape = shape;
  job.options = o;
  job.device = &param;
  return job;
}

class DevicePlaneTest : public ::testing::Test {
 protected:
  // Runs `jobs` through a Scheduler on this plane's StepRunner, as the server does, all queued
  // while the worker is held on a blocker of another shape, so that jobs of one shape and
  // options share a call. Returns them in submission order.
  std::vector<NsJob> schedule(std::vector<NsJob> jobs) {
    auto blocker_param = plane_->make_param(6, true);
    std::promise<void> entered, release;
    auto released = release.get_future().share();
    std::mutex mu;
    std::vector<NsJob> done;
    bool first = true;
    {
      Scheduler sched(
          make_backend("cpu"),
          [&](std::vector<NsJob> batch) {
            if (first) {
              first = false;
              entered.set_value();
              released.wait();
              return;
            }
            std::lock_guard lock(mu);
            for (auto& j : batch) done.push_back(std::move(j));
          },
          plane_->step_runner());
      sched.submit(device_job("blocker", -1, {1, 2, 3}, MuonOptions{}, *blocker_param));
      entered.get_future().wait();
      const size_t n = jobs.size();
      for (auto& j : jobs) sched.submit(std::move(j));
      release.set_value();
      sched.stop();
      EXPECT_EQ(done.size(), n);
    }
    return done;
  }
  // Reduces `red` into the parameter and runs its step alone (as the worker does).
  NsJob run_step(StepReducer& red, DeviceParamState& param, const MatrixShape& shape,
                 const MuonOptions& o, int64_t step) {
    plane_->reduce(red, param);
    std::vector<NsJob> jobs;
    jobs.push_back(device_job("w", step, shape, o, param));
    return std::move(schedule(std::move(jobs)).front());
  }
  void SetUp() override {
    try {
      plane_ = std::make_unique<DevicePlane>(DevicePlaneConfig{});
    } catch (const BackendUnavailable& e) {
      GTEST_SKIP() << "CUDA unavailable: " << e.what();
    }
  }
  std::unique_ptr<DevicePlane> plane_;
};

// One push of the scenario below: rank, element offset, count, bf16 or fp32, a repeat (adds).
struct Piece {
  int rank;
  int64_t offset, count;
  bool bf16;
};

}  // namespace

TEST_F(DevicePlaneTest, ReductionIsBitwiseTheHostStepReducer) {
  // 5 ranks, 2 contributors per element, one rank pushing nothing (as test_daemon_core), values
  // spanning 1e-8..1e8; every rank pushes its ranges in chunks, some twice (accumulation), some
  // in bf16; the chunks arrive shuffled.
  const auto layout = layout_of(spec_of({2, 7, 9}),
                                {{{0, 50}, {100, 126}}, {{0, 61}}, {}, {{61, 126}}, {{50, 100}}});
  std::vector<Piece> pieces;
  std::mt19937 rng(5);
  for (int r = 0; r < 5; ++r) {
    for (const auto& g : layout.ranks[r].push) {
      for (int64_t o = g.begin; o < g.end; o += 13) {
        const int64_t n = std::min<int64_t>(13, g.end - o);
        pieces.push_back({r, o, n, (o / 13) % 3 == 1});
        if ((o / 13) % 4 == 2) pieces.push_back({r, o, n, false});  // accumulates
      }
    }
  }
  std::shuffle(pieces.begin(), pieces.end(), rng);
  StepReducer host(layout, 0);
  StepReducer device(layout, 0, plane_->make_contribution_store());
  uint32_t seed = 100;
  std::vector<std::unique_ptr<DeviceVector<float>>> keep_f32;
  std::vector<std::unique_ptr<DeviceVector<uint16_t>>> keep_bf16;
  for (const auto& p : pieces) {
    const auto v = random_values(static_cast<size_t>(p.count), seed++, true);
    if (p.bf16) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = transport::f32_to_bf16(v[i]);
      host.add(p.rank, p.offset, Contribution{h.data(), TileDType::bf16, false, p.count});
      keep_bf16.push_back(std::make_unique<DeviceVector<uint16_t>>(h));
      device.add(p.rank, p.offset,
                 Contribution{keep_bf16.back()->get(), TileDType::bf16, true, p.count});
    } else {
      host.add(p.rank, p.offset, std::span<const float>(v));
      keep_f32.push_back(std::make_unique<DeviceVector<float>>(v));
      // Every other fp32 piece comes from host memory (a shm session on a GPU server).
      if (seed % 2 == 0) {
        device.add(p.rank, p.offset, std::span<const float>(v));
      } else {
        device.add(p.rank, p.offset,
                   Contribution{keep_f32.back()->get(), TileDType::f32, true, p.count});
      }
    }
  }
  for (int r : {4, 0, 3, 1}) {
    host.commit(r);
    device.commit(r);
  }
  std::vector<float> expected(126);
  host.reduce(expected.data());
  DeviceVector<float> grad(126);
  device.reduce(grad.get());
  EXPECT_TRUE(bitwise_equal(grad.download(), expected));
}

TEST_F(DevicePlaneTest, StepsAreBitwiseDeviceMuonOnTheSameGradient) {
  MuonOptions o;
  o.momentum = {MomentumConvention::ema, 0.95f, true};
  const MatrixShape shape{1, 96, 64};  // tall: transposed to wide inside
  const auto layout = layout_of(spec_of(shape, o), {{{0, 6144}}, {{0, 6144}}});
  auto param = plane_->make_param(shape.numel(), true);
  DeviceMuon reference;
  DeviceStream stream;
  DeviceVector<float> ref_momentum(std::vector<float>(6144, 0.0f)), ref_update(6144),
      ref_grad(6144);
  for (int step = 0; step < 3; ++step) {
    const auto g0 = random_values(6144, 10 + step), g1 = random_values(6144, 20 + step);
    StepReducer red(layout, step, plane_->make_contribution_store());
    red.add(1, 0, g1);
    red.add(0, 0, g0);
    red.commit(0);
    red.commit(1);
    const NsJob job = run_step(red, *param, shape, o, step);
    ASSERT_TRUE(job.error.empty()) << job.error;
    EXPECT_TRUE(job.applied);

    std::vector<float> g(6144);
    for (size_t i = 0; i < g.size(); ++i) g[i] = -0.0f + g0[i] + g1[i];
    ref_grad.upload(g);
    reference.step("w", shape, ref_grad.get(), ref_momentum.get(), ref_update.get(), o,
                   stream.get());
    stream.synchronize();
    std::vector<float> momentum(6144), update(6144);
    plane_->read_momentum(*param, 0, 6144, momentum.data());
    plane_->read_update(*param, 0, 6144, update.data());
    EXPECT_TRUE(bitwise_equal(momentum, ref_momentum.download())) << "step " << step;
    EXPECT_TRUE(bitwise_equal(update, ref_update.download())) << "step " << step;
  }
}

TEST_F(DevicePlaneTest, NonFiniteGradientLeavesTheMomentumUntouched) {
  for (auto policy : {NonFinitePolicy::error, NonFinitePolicy::skip}) {
    MuonOptions o;
    o.momentum = {MomentumConvention::sum, 0.9f, false};
    o.orthogonalize.nonfinite = policy;
    const MatrixShape shape{1, 8, 16};
    const auto layout = layout_of(spec_of(shape, o), {{{0, 128}}});
    auto param = plane_->make_param(128, true);
    const auto before = random_values(128, 3);
    plane_->write_momentum(*param, 0, before.data(), 128);
    auto g = random_values(128, 4);
    g[77] = std::numeric_limits<float>::quiet_NaN();
    StepReducer red(layout, 0, plane_->make_contribution_store());
    red.add(0, 0, g);
    red.commit(0);
    const NsJob job = run_step(red, *param, shape, o, 0);
    EXPECT_FALSE(job.applied);
    if (policy == NonFinitePolicy::error) {
      EXPECT_EQ(job.error_code, ErrorCode::non_finite);
      EXPECT_NE(job.error.find("'w'"), std::string::npos) << job.error;
    } else {
      EXPECT_TRUE(job.error.empty()) << job.error;
      std::vector<float> update(128, 1.0f);
      plane_->read_update(*param, 0, 128, update.data());
      EXPECT_TRUE(std::all_of(update.begin(), update.end(), [](float x) { return x == 0.0f; }));
    }
    std::vector<float> after(128);
    plane_->read_momentum(*param, 0, 128, after.data());
    EXPECT_TRUE(bitwise_equal(after, before));
  }
}

TEST_F(DevicePlaneTest, ABatchOfOneShapeIsBitwiseEachParameterAloneAndANonFiniteOneFailsAlone) {
  MuonOptions o;
  o.momentum = {MomentumConvention::sum, 0.9f, true};
  const MatrixShape shape{1, 32, 48};
  const int64_t n = shape.numel();
  const auto layout = layout_of(spec_of(shape, o), {{{0, n}}});
  constexpr int kParams = 3;
  std::vector<DeviceParamPtr> params;
  std::vector<std::unique_ptr<DeviceVector<float>>> ref_momentum, ref_update;
  for (int p = 0; p < kParams; ++p) {
    params.push_back(plane_->make_param(n, true));
    ref_momentum.push_back(
        std::make_unique<DeviceVector<float>>(std::vector<float>(static_cast<size_t>(n), 0.0f)));
    ref_update.push_back(std::make_unique<DeviceVector<float>>(static_cast<size_t>(n)));
  }
  DeviceMuon reference;
  DeviceStream stream;
  DeviceVector<float> ref_grad(static_cast<size_t>(n));
  for (int step = 0; step < 3; ++step) {
    // Step 1: parameter 1's gradient holds a NaN: only its step is refused.
    std::vector<NsJob> jobs;
    std::vector<std::vector<float>> grads;
    for (int p = 0; p < kParams; ++p) {
      auto g = random_values(static_cast<size_t>(n), 100 * step + p);
      if (step == 1 && p == 1) g[5] = std::numeric_limits<float>::quiet_NaN();
      StepReducer red(layout, step, plane_->make_contribution_store());
      red.add(0, 0, g);
      red.commit(0);
      plane_->reduce(red, *params[p]);
      grads.push_back(g);
      jobs.push_back(device_job("p" + std::to_string(p), step, shape, o, *params[p]));
    }
    const auto done = schedule(std::move(jobs));
    for (int p = 0; p < kParams; ++p) {
      const NsJob& job = done[static_cast<size_t>(p)];
      ASSERT_EQ(job.name, "p" + std::to_string(p));
      const bool refused = step == 1 && p == 1;
      std::vector<float> momentum(static_cast<size_t>(n)), update(static_cast<size_t>(n));
      plane_->read_momentum(*params[p], 0, n, momentum.data());
      if (refused) {
        EXPECT_EQ(job.error_code, ErrorCode::non_finite) << job.error;
        EXPECT_NE(job.error.find("'p1'"), std::string::npos) << job.error;
        EXPECT_FALSE(job.applied);
        EXPECT_TRUE(bitwise_equal(momentum, ref_momentum[p]->download())) << "untouched";
        continue;
      }
      ASSERT_TRUE(job.error.empty()) << job.error;
      EXPECT_TRUE(job.applied);
      ref_grad.upload(grads[p]);
      reference.step("ref", shape, ref_grad.get(), ref_momentum[p]->get(), ref_update[p]->get(), o,
                     stream.get());
      stream.synchronize();
      plane_->read_update(*params[p], 0, n, update.data());
      EXPECT_TRUE(bitwise_equal(momentum, ref_momentum[p]->download()))
          << "parameter " << p << " step " << step;
      EXPECT_TRUE(bitwise_equal(update, ref_update[p]->download()))
          << "parameter " << p << " step " << step;
    }
  }
}

// server_step/gpt2_small/<plane>: one optimizer step of GPT-2 small's 48 Muon matrices through a
// live muon-offloadd on the CUDA backend (the GPU data plane), gradients pushed from and updates
// received into this process' device memory, against the same 48 device Muon steps run in this
// process on device buffers (DeviceMuon: what a trainer pays without offload), measured in the
// same iteration. `cuda_ipc` rows copy straight into the server's exported rings; `shm` rows
// stage through host shared memory (the fallback a client on the shm plane gets).
// Counters:
//   offload_ms               push every gradient, commit, wait every update, synchronize
//   inprocess_ms             the 48 DeviceMuon steps, synchronized
//   offload/inprocess        the cost of the trip through the server relative to computing here
// One untimed step first (server buffers, CUDA graphs off, IPC handles opened).
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bench/gpu_bench.hpp"
#include "bench/model_shapes.hpp"
#include "bench/server_process.hpp"
#include "client/client.hpp"
#include "client/health_probe.hpp"
#include "core/clock.hpp"
#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/device_muon.hpp"
#include "kernels/device_probe.hpp"
#include "kernels/device_stream.hpp"

namespace muon::bench {
namespace {

using Clock = std::chrono::steady_clock;

using muon::seconds_since;

// Device buffers owned by the benchmark.
class DeviceFloats {
 public:
  explicit DeviceFloats(int64_t n, float fill_seed) : n_(n) {
    std::vector<float> host(static_cast<size_t>(n));
    uint32_t x = static_cast<uint32_t>(fill_seed * 1000) + 1;
    for (auto& v : host) {
      x = x * 1664525u + 1013904223u;
      v = static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
    MUON_CUDA_CHECK(cudaMalloc(&p_, sizeof(float) * host.size()));
    MUON_CUDA_CHECK(
        cudaMemcpy(p_, host.data(), sizeof(float) * host.size(), cudaMemcpyHostToDevice));
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  ~DeviceFloats() { MUON_CUDA_CHECK_NOTHROW(cudaFree(p_)); }
  float* get() const { return static_cast<float*>(p_); }

 private:
  void* p_ = nullptr;
  int64_t n_;
};

void run_server_step(benchmark::State& state, transport::DataPlane plane) {
  const auto mats = gpt2_small_matrices();
  std::vector<std::unique_ptr<DeviceFloats>> grads, momenta, updates;
  for (size_t i = 0; i < mats.size(); ++i) {
    const int64_t n = mats[i].rows * mats[i].cols;
    grads.push_back(std::make_unique<DeviceFloats>(n, static_cast<float>(i)));
    momenta.push_back(std::make_unique<DeviceFloats>(n, 0.5f));
    updates.push_back(std::make_unique<DeviceFloats>(n, 0.25f));
  }
  BenchServer server({"--backend", "cuda", "--slot-kib", "4096"});
  client::ClientConfig cfg;
  cfg.servers = {server.socket()};
  cfg.data_plane = plane;
  cfg.op_timeout = std::chrono::minutes(5);
  client::Client c(cfg);
  std::vector<client::ParameterRegistration> regs;
  MuonOptions options;
  for (const auto& m : mats) {
    client::ParameterRegistration r;
    r.name = m.name;
    r.shape = {m.rows, m.cols};
    r.options = options;
    r.push = {{0, m.rows * m.cols}};
    r.want = {{0, m.rows * m.cols}};
    regs.push_back(r);
  }
  c.register_parameters(regs);

  DeviceMuon dm;
  DeviceStream stream;
  int64_t step = 0;
  const auto offload_step = [&] {
    const auto t0 = Clock::now();
    for (size_t i = 0; i < mats.size(); ++i) {
      c.push_device(mats[i].name, step, 0, grads[i]->get(), mats[i].rows * mats[i].cols,
                    stream.get());
      c.commit(mats[i].name, step);
    }
    for (size_t i = 0; i < mats.size(); ++i) {
      c.wait_update_device(mats[i].name, step, updates[i]->get(), stream.get());
    }
    stream.synchronize();
    ++step;
    return seconds_since(t0);
  };
  const auto inprocess_step = [&] {
    const auto t0 = Clock::now();
    for (size_t i = 0; i < mats.size(); ++i) {
      dm.step(mats[i].name, {1, mats[i].rows, mats[i].cols}, grads[i]->get(), momenta[i]->get(),
              updates[i]->get(), options, stream.get());
    }
    stream.synchronize();
    return seconds_since(t0);
  };
  offload_step();  // warm-up: buffers, handles
  inprocess_step();
  double offload_s = 0, inprocess_s = 0;
  for (auto _ : state) {
    const double t = offload_step();
    offload_s += t;
    inprocess_s += inprocess_step();
    state.SetIterationTime(t);
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["offload_ms"] = 1e3 * offload_s / n;
  state.counters["inprocess_ms"] = 1e3 * inprocess_s / n;
  state.counters["offload/inprocess"] = offload_s / inprocess_s;
}

void server_step(benchmark::State& state, transport::DataPlane plane) {
  if (const auto why = cuda_unavailable_reason(); !why.empty()) {
    state.SkipWithError(("CUDA unavailable: " + why).c_str());
    return;
  }
  try {
    run_server_step(state, plane);
  } catch (const std::exception& e) {  // a failed step is reported, not a crash of the run
    state.SkipWithError(e.what());
  }
}

}  // namespace

void register_server_step_benchmarks() {
  for (auto plane : {transport::DataPlane::cuda_ipc, transport::DataPlane::shm}) {
    benchmark::RegisterBenchmark(
        (std::string("server_step/gpt2_small/") + transport::data_plane_name(plane)).c_str(),
        [plane](benchmark::State& s) { server_step(s, plane); })
        ->UseManualTime()
        ->Iterations(5)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace muon::bench

// device_step/<plain|graphs>/<r>x<c>: the device Muon step (kernels/device_muon.hpp) on
// device-resident gradient, momentum and update buffers, against the cuBLAS bf16 GEMM reference
// of the same shape (bench/gemm_reference.hpp), measured in the same benchmark.
//
// Unlike muon_bench's cuda/ rows (Backend::orthogonalize from host memory, transfers included),
// nothing crosses PCIe here: this is what a server whose gradients already sit on its GPU pays.
// Each iteration runs one step (synchronized) and, outside the benchmark timer, one full
// reference run, order alternating. Counters:
//   ns_gflops          nominal NS flops 5 * (4 m^2 n + 2 m^3) / step time (momentum, finite
//                      check, normalization, scale included)
//   gemm_gflops        the same nominal flops / reference time
//   ns_rate/gemm_rate  reference time / step time (issue 6 asks for >= 0.6 at shapes >= 2048)
// `graphs` rows capture the Newton-Schulz sequence once per shape and replay it.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/gemm_reference.hpp"
#include "bench/gpu_bench.hpp"
#include "bench/model_shapes.hpp"
#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/device_muon.hpp"
#include "kernels/device_stream.hpp"

namespace muon::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kSteps = 5;

// n device floats of a cheap deterministic pseudo-random pattern in [-1, 1) (gradients; the rate
// does not depend on the values as long as they are finite and not denormal).
float* device_values(int64_t n, uint32_t seed) {
  std::vector<float> host(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : host) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
  void* p = nullptr;
  MUON_CUDA_CHECK(cudaMalloc(&p, sizeof(float) * host.size()));
  MUON_CUDA_CHECK(cudaMemcpy(p, host.data(), sizeof(float) * host.size(), cudaMemcpyHostToDevice));
  return static_cast<float*>(p);
}

void device_step(benchmark::State& state, const ModelShape& shape, bool graphs) {
  std::vector<float*> buffers;
  try {
    DeviceMuon dm({.device = 0, .capture_graphs = graphs});
    CublasGemmReference ref(shape.rows, shape.cols, kSteps, 0);
    const int64_t n = shape.rows * shape.cols;
    float* grad = device_values(n, 1);
    buffers.push_back(grad);
    float* momentum = device_values(n, 2);
    buffers.push_back(momentum);
    float* update = device_values(n, 3);
    buffers.push_back(update);
    DeviceStream stream;
    MuonOptions o;
    o.momentum = {MomentumConvention::sum, 0.95f, true};
    o.orthogonalize.schedule = "keller";
    o.orthogonalize.steps = kSteps;
    o.orthogonalize.scale_rule = ScaleRule::none;
    o.orthogonalize.precision = Precision::bf16;
    const MatrixShape ms{1, shape.rows, shape.cols};
    auto run_step = [&] {
      dm.step("bench", ms, grad, momentum, update, o, stream.get());
      stream.synchronize();
    };
    run_step();  // warm-up: workspaces, cuBLAS heuristics, the graph capture
    ref.run();
    double step_s = 0.0, ref_s = 0.0;
    int64_t i = 0;
    auto time_ref = [&] {
      state.PauseTiming();
      const auto t = Clock::now();
      ref.run();
      ref_s += std::chrono::duration<double>(Clock::now() - t).count();
      state.ResumeTiming();
    };
    for (auto _ : state) {
      const bool ref_first = (i++ % 2) == 1;
      if (ref_first) time_ref();
      const auto t = Clock::now();
      run_step();
      step_s += std::chrono::duration<double>(Clock::now() - t).count();
      if (!ref_first) time_ref();
    }
    const double flops = ns_nominal_flops(shape.rows, shape.cols, kSteps);
    state.counters["ns_gflops"] =
        benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["gemm_gflops"] = flops * static_cast<double>(i) / ref_s / 1e9;
    state.counters["ns_rate/gemm_rate"] = ref_s / step_s;
    state.SetLabel(shape_label(shape));
  } catch (const BackendUnavailable& e) {
    state.SkipWithError(("backend unavailable (no GPU?): " + std::string(e.what())).c_str());
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  for (float* p : buffers) MUON_CUDA_CHECK_NOTHROW(cudaFree(p));
}

}  // namespace

void register_device_step_benchmarks() {
  for (const ModelShape& shape : kModelShapes) {
    for (bool graphs : {false, true}) {
      const std::string name = std::string("device_step/") + (graphs ? "graphs/" : "plain/") +
                               std::to_string(shape.rows) + "x" + std::to_string(shape.cols);
      benchmark::RegisterBenchmark(
          name.c_str(), [shape, graphs](benchmark::State& st) { device_step(st, shape, graphs); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.5);
    }
  }
}

}  // namespace muon::bench

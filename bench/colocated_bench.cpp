// colocated/trainer_gemm/<trainer stream priority>: what a muon-offloadd on the trainer's own GPU
// costs the trainer's kernels (gpu-review F9, issue 19). The trainer: bf16 GEMMs (4096^3,
// cublasGemmEx, fp32 accumulate) on a stream of this process at the given priority, timed with
// events on that stream; the server: its own process on the same GPU, --backend cuda
// --stream-priority low, kept busy by a client thread of this process that pushes one 4096 x 4096
// fp32 gradient over cuda_ipc from device memory, commits and waits for the update, step after
// step. Both measured in one run:
//   alone_ms      the trainer's GEMMs, no server running
//   shared_ms     the same GEMMs while the server computes
//   shared/alone  the slowdown; issue 19's target: at most a few percent (<= 1.05)
//   server_steps  Muon steps the server finished during the shared window
// Stream priorities order kernels within one CUDA context; between processes the GPU time-slices
// unless MPS runs, so `high` shows whether raising the trainer's stream is enough on this machine.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu_bench.hpp"
#include "bench/server_process.hpp"
#include "client/client.hpp"
#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/device_probe.hpp"
#include "kernels/device_stream.hpp"

namespace muon::bench {
namespace {

constexpr int kGemmN = 4096;
constexpr int kGemmReps = 400;
constexpr int64_t kParamRows = 4096, kParamCols = 4096;

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw DeviceError(std::string(what) + " failed: cuBLAS status " + std::to_string(s));
  }
}

// The trainer's work: n x n x n bf16 GEMMs on its own stream at `priority`.
class TrainerGemms {
 public:
  TrainerGemms(int n, StreamPriority priority) : n_(n), stream_(priority) {
    const size_t bytes = sizeof(__nv_bfloat16) * static_cast<size_t>(n) * n;
    for (void** p : {&a_, &b_, &c_}) {
      MUON_CUDA_CHECK(cudaMalloc(p, bytes));
      MUON_CUDA_CHECK(cudaMemsetAsync(*p, 0x3c, bytes, stream_.get()));  // ~1.0 in bf16 halves
    }
    cublas_check(cublasCreate(&handle_), "cublasCreate");
    cublas_check(cublasSetStream(handle_, stream_.get()), "cublasSetStream");
    MUON_CUDA_CHECK(cudaEventCreate(&start_));
    MUON_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~TrainerGemms() {
    cublasDestroy(handle_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    for (void* p : {a_, b_, c_}) cudaFree(p);
  }
  TrainerGemms(const TrainerGemms&) = delete;
  TrainerGemms& operator=(const TrainerGemms&) = delete;

  /// Milliseconds the stream took for `reps` GEMMs (event to event on the trainer's stream).
  double run(int reps) {
    const float alpha = 1.0f, beta = 0.0f;
    MUON_CUDA_CHECK(cudaEventRecord(start_, stream_.get()));
    for (int i = 0; i < reps; ++i) {
      cublas_check(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, n_, n_, n_, &alpha, a_,
                                CUDA_R_16BF, n_, b_, CUDA_R_16BF, n_, &beta, c_, CUDA_R_16BF, n_,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    }
    MUON_CUDA_CHECK(cudaEventRecord(stop_, stream_.get()));
    MUON_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    MUON_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  int n_;
  DeviceStream stream_;
  cublasHandle_t handle_ = nullptr;
  void *a_ = nullptr, *b_ = nullptr, *c_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// A client thread keeping a co-located server's compute busy: push, commit, wait, repeat.
class BusyServer {
 public:
  BusyServer() : server_({"--backend", "cuda", "--stream-priority", "low", "--slot-kib", "4096"}) {
    thread_ = std::thread([this] { loop(); });
    // The first step done (buffers made, handles mapped) before anyone measures.
    while (steps_ == 0 && error_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~BusyServer() {
    stop_ = true;
    thread_.join();
  }
  BusyServer(const BusyServer&) = delete;
  BusyServer& operator=(const BusyServer&) = delete;
  int64_t steps() const { return steps_; }
  const std::string& error() const { return error_; }

 private:
  void loop() {
    try {
      MUON_CUDA_CHECK(cudaSetDevice(0));
      client::ClientConfig cfg;
      cfg.servers = {server_.socket()};
      cfg.data_plane = transport::DataPlane::cuda_ipc;
      cfg.op_timeout = std::chrono::minutes(2);
      client::Client c(cfg);
      client::ParameterRegistration r;
      r.name = "w";
      r.shape = {kParamRows, kParamCols};
      r.push = {{0, kParamRows * kParamCols}};
      r.want = {{0, kParamRows * kParamCols}};
      c.register_parameters({r});
      const size_t bytes = sizeof(float) * static_cast<size_t>(kParamRows * kParamCols);
      void *grad = nullptr, *update = nullptr;
      MUON_CUDA_CHECK(cudaMalloc(&grad, bytes));
      MUON_CUDA_CHECK(cudaMalloc(&update, bytes));
      std::vector<float> host(static_cast<size_t>(kParamRows * kParamCols));
      for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 97) * 0.01f - 0.4f;
      MUON_CUDA_CHECK(cudaMemcpy(grad, host.data(), bytes, cudaMemcpyHostToDevice));
      DeviceStream stream;
      for (int64_t step = 0; !stop_; ++step) {
        c.push_device("w", step, 0, grad, kParamRows * kParamCols, stream.get());
        c.commit("w", step);
        c.wait_update_device("w", step, update, stream.get());
        stream.synchronize();
        ++steps_;
      }
      cudaFree(grad);
      cudaFree(update);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  }

  BenchServer server_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> steps_{0};
  std::string error_;
  std::thread thread_;
};

void colocated(benchmark::State& state, StreamPriority priority) {
  if (const auto why = cuda_unavailable_reason(); !why.empty()) {
    state.SkipWithError(("CUDA unavailable: " + why).c_str());
    return;
  }
  try {
    MUON_CUDA_CHECK(cudaSetDevice(0));
    TrainerGemms trainer(kGemmN, priority);
    trainer.run(kGemmReps / 10);  // warm-up: cuBLAS heuristics, clocks
    double alone = 0, shared = 0;
    int64_t server_steps = 0;
    for (auto _ : state) {
      alone = trainer.run(kGemmReps);
      BusyServer busy;
      if (!busy.error().empty()) throw Error("the co-located server's client: " + busy.error());
      const int64_t before = busy.steps();
      shared = trainer.run(kGemmReps);
      server_steps = busy.steps() - before;
      state.SetIterationTime(shared / 1e3);
    }
    state.counters["alone_ms"] = alone;
    state.counters["shared_ms"] = shared;
    state.counters["shared/alone"] = shared / alone;
    state.counters["server_steps"] = static_cast<double>(server_steps);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

void register_colocated_benchmarks() {
  for (auto [name, priority] :
       {std::pair{"high", StreamPriority::high}, std::pair{"normal", StreamPriority::normal}}) {
    benchmark::RegisterBenchmark((std::string("colocated/trainer_gemm/") + name).c_str(),
                                 [priority](benchmark::State& s) { colocated(s, priority); })
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace muon::bench

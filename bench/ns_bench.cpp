// Newton-Schulz speed as a ratio against the same backend's plain GEMM rate on the same shapes,
// measured in the same run (architecture guide §9). Absolute times are printed by Google
// Benchmark but only the ratio is meant to be compared across machines.
//
// Benchmarks (name = <size>/<backend>/<what>/<rows>x<cols>, label = model and parameter):
//   <size>      small: GPT-2 small shapes, seconds each on a CPU.
//               large: Llama-3-8B shapes; on the CPU the heavy ones (kHeavyFlops) run one
//               iteration each (about a minute for 4096x14336 on 2 cores).
//               Select with --benchmark_filter='^small/' or '^large/'.
//   <backend>   cpu: OpenBLAS fp32, kCpuThreads threads (NS and reference alike).
//               cuda: make_backend("cuda") with bf16 products vs cuBLAS bf16 GEMM; compiled only
//               with MUON_HAVE_CUDA, skipped with an error message when no GPU is usable.
//   <what>      gemm_ref: the reference alone (gemm_reference.hpp): the 3 * steps plain GEMMs
//               of one NS run. Counter gemm_gflops = nominal flops / time.
//               ns_plain, ns_syrk, ns_gram, ns_auto: Backend::orthogonalize with that
//               NsAlgorithm (gram restarted every kDefaultGramRestart steps; auto, the default,
//               runs what its table chose, kernels/ns_choice.hpp: its warm-up call, always made,
//               measures the choice when the table has none), schedule keller, 5 steps,
//               ScaleRule::none. Counters:
//                 ns_gflops          nominal flops / NS time (Counter::kIsRate)
//                 gemm_gflops        nominal flops / time of the GEMM reference, run in the same
//                                    benchmark, paired with the NS calls (see run_ns)
//                 ns_rate/gemm_rate  ns_gflops / gemm_gflops = reference time / NS time over the
//                                    same iterations. 1.0 = as fast as the plain GEMMs of the
//                                    work; syrk/gram do fewer real flops, so they can exceed 1.
// Nominal flops of an r x c matrix (m = min, n = max): steps * (4 m^2 n + 2 m^3), the same for
// every algorithm. The NS time is the whole public call: finite check, copies, transpose of a
// tall matrix, Frobenius normalization, scale, and on CUDA the host<->device transfers; the
// reference is GEMMs only. Hence the ratio is what the trainer gets out of the GEMM rate.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/gemm_reference.hpp"
#include "bench/model_shapes.hpp"
#include "core/clock.hpp"
#include "core/error.hpp"
#include "kernels/backend.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using muon::bench::ns_nominal_flops;

constexpr int kSteps = 5;
constexpr int kCpuThreadsDefault = 2;  // override with MUON_BENCH_CPU_THREADS

int cpu_threads() {
  if (const char* v = std::getenv("MUON_BENCH_CPU_THREADS")) {
    const int n = std::atoi(v);
    if (n > 0) return n;
  }
  return kCpuThreadsDefault;
}

// GPT-2 small and Llama-3-8B parameter shapes, shared with muon_gpu_bench.
using Shape = muon::bench::ModelShape;
constexpr const auto& kShapes = muon::bench::kModelShapes;

// CPU runs above this many nominal flops (4096x4096 and the 14336 shapes, 2..5.5 TFLOP, tens of
// seconds each on 2 cores) get one iteration, no warm-up, and a bracketed reference (run_ns).
constexpr double kHeavyFlops = 5e11;

struct Algo {
  const char* name;
  muon::NsAlgorithm algorithm;
};
constexpr Algo kAlgos[] = {{"plain", muon::NsAlgorithm::plain},
                           {"syrk", muon::NsAlgorithm::syrk},
                           {"gram", muon::NsAlgorithm::gram},
                           {"auto", muon::NsAlgorithm::automatic}};

using muon::seconds_since;

std::vector<float> random_matrix(int64_t n) {
  std::mt19937 gen(2024);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

std::string label(const Shape& s) {
  return muon::bench::shape_label(s);
}

// The reference alone: its own rate, for reading next to the NS rows.
template <class Ref>
void run_gemm_ref(benchmark::State& state, Ref& ref, const Shape& shape, bool warmup) {
  if (warmup) ref.run();
  for (auto _ : state) ref.run();
  state.counters["gemm_gflops"] =
      benchmark::Counter(ref.flops() / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(label(shape));
}

// NS through the public Backend interface, each iteration paired with the reference, run outside
// the benchmark timer so that both see the same machine load:
//   interleaved (small shapes, GPU): one full reference run per iteration, order alternating.
//   bracketed (heavy CPU shapes, one iteration of up to a minute): one reference *step* right
//     before and one right after the NS call; the reference time is steps x their mean. Every
//     step is the same three products, so this is the full reference's time at 2/steps of its
//     cost, and it brackets the NS call against load drifting during it.
template <class Ref>
void run_ns(benchmark::State& state, muon::Backend& backend, Ref& ref, const Shape& shape,
            const muon::OrthogonalizeOptions& options, bool warmup, bool bracketed) {
  const muon::MatrixShape ms{1, shape.rows, shape.cols};
  const std::vector<float> in = random_matrix(ms.numel());
  std::vector<float> out(in.size());
  if (warmup) {  // workspaces, thread pools, cuBLAS handles
    backend.orthogonalize("bench", ms, in.data(), out.data(), options);
    ref.run();
  }
  double ns_s = 0.0, ref_s = 0.0;
  int64_t i = 0;
  // Times the reference outside the benchmark timer: `steps` steps, weighted by `weight`.
  auto time_ref = [&](int steps, double weight) {
    state.PauseTiming();
    const auto t = Clock::now();
    ref.run(steps);
    ref_s += weight * seconds_since(t);
    state.ResumeTiming();
  };
  const double half_steps = 0.5 * ref.steps();
  for (auto _ : state) {
    const bool ref_first = (i++ % 2) == 1;
    if (bracketed) {
      time_ref(1, half_steps);
    } else if (ref_first) {
      time_ref(-1, 1.0);
    }
    const auto t = Clock::now();
    backend.orthogonalize("bench", ms, in.data(), out.data(), options);
    ns_s += seconds_since(t);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    if (bracketed) {
      time_ref(1, half_steps);
    } else if (!ref_first) {
      time_ref(-1, 1.0);
    }
  }
  const double flops = ns_nominal_flops(shape.rows, shape.cols, options.steps);
  state.counters["ns_gflops"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["gemm_gflops"] = flops * static_cast<double>(state.iterations()) / ref_s / 1e9;
  state.counters["ns_rate/gemm_rate"] = ref_s / ns_s;
  state.SetLabel(label(shape));
}

muon::OrthogonalizeOptions ns_options(muon::NsAlgorithm algorithm, muon::Precision precision) {
  muon::OrthogonalizeOptions o;
  o.schedule = "keller";
  o.steps = kSteps;
  o.scale_rule = muon::ScaleRule::none;
  o.algorithm = algorithm;
  o.precision = precision;
  return o;
}

// Errors (no GPU, a failing device call) skip the benchmark with the message instead of aborting
// the whole run.
template <class F>
void guarded(benchmark::State& state, F&& body) {
  try {
    body();
  } catch (const muon::BackendUnavailable& e) {
    state.SkipWithError(("backend unavailable (no GPU?): " + std::string(e.what())).c_str());
  } catch (const muon::Error& e) {
    state.SkipWithError(e.what());
  }
}

std::string bench_name(const Shape& s, const char* backend, const std::string& what) {
  return std::string(s.large ? "large/" : "small/") + backend + "/" + what + "/" +
         std::to_string(s.rows) + "x" + std::to_string(s.cols);
}

// one_iteration: heavy CPU shapes. Otherwise at least 1 s of NS time (plus as much reference
// time), so that even the slowest GPT-2 shape gets a few paired iterations.
void configure(benchmark::internal::Benchmark* b, bool one_iteration) {
  b->UseRealTime()->Unit(benchmark::kMillisecond);
  if (one_iteration) {
    b->Iterations(1);
  } else {
    b->MinTime(1.0);
  }
}

void register_cpu() {
  for (const Shape& shape : kShapes) {
    // Heavy CPU shapes: one call costs up to a minute, so no warm-up and a single iteration;
    // first-touch of the workspaces is well under 1 % of such a call.
    const bool heavy = ns_nominal_flops(shape.rows, shape.cols, kSteps) > kHeavyFlops;
    const bool warmup = !heavy;
    configure(benchmark::RegisterBenchmark(
                  bench_name(shape, "cpu", "gemm_ref").c_str(),
                  [shape, warmup](benchmark::State& state) {
                    guarded(state, [&] {
                      muon::make_backend("cpu", {.cpu_threads = cpu_threads()});
                      muon::bench::CpuGemmReference ref(shape.rows, shape.cols, kSteps);
                      run_gemm_ref(state, ref, shape, warmup);
                    });
                  }),
              heavy);
    for (const Algo& algo : kAlgos) {
      configure(benchmark::RegisterBenchmark(
                    bench_name(shape, "cpu", std::string("ns_") + algo.name).c_str(),
                    [shape, algo, warmup, heavy](benchmark::State& state) {
                      guarded(state, [&] {
                        auto backend = muon::make_backend("cpu", {.cpu_threads = cpu_threads()});
                        muon::bench::CpuGemmReference ref(shape.rows, shape.cols, kSteps);
                        const bool automatic = algo.algorithm == muon::NsAlgorithm::automatic;
                        run_ns(state, *backend, ref, shape,
                               ns_options(algo.algorithm, muon::Precision::fp32),
                               warmup || automatic, heavy);
                      });
                    }),
                heavy);
    }
  }
}

#ifdef MUON_HAVE_CUDA
void register_cuda() {
  // Every shape takes milliseconds on a GPU: warm-up and Google Benchmark's own iteration count.
  for (const Shape& shape : kShapes) {
    configure(benchmark::RegisterBenchmark(
                  bench_name(shape, "cuda", "gemm_ref").c_str(),
                  [shape](benchmark::State& state) {
                    guarded(state, [&] {
                      muon::make_backend("cuda");  // same "no GPU" skip as the NS rows
                      muon::bench::CublasGemmReference ref(shape.rows, shape.cols, kSteps, 0);
                      run_gemm_ref(state, ref, shape, true);
                    });
                  }),
              false);
    for (const Algo& algo : kAlgos) {
      configure(benchmark::RegisterBenchmark(
                    bench_name(shape, "cuda", std::string("ns_") + algo.name).c_str(),
                    [shape, algo](benchmark::State& state) {
                      guarded(state, [&] {
                        auto backend = muon::make_backend("cuda");
                        muon::bench::CublasGemmReference ref(shape.rows, shape.cols, kSteps, 0);
                        run_ns(state, *backend, ref, shape,
                               ns_options(algo.algorithm, muon::Precision::bf16), true, false);
                      });
                    }),
                false);
    }
  }
}
#else
void register_cuda() {}  // built without CUDA: no GPU rows
#endif

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_cpu();
  register_cuda();
  muon::make_backend("cpu", {.cpu_threads = cpu_threads()});  // OpenBLAS thread count for context
  benchmark::AddCustomContext("openblas", muon::bench::openblas_description());
  benchmark::AddCustomContext("newton_schulz",
                              "schedule keller, " + std::to_string(kSteps) +
                                  " steps, scale_rule none; cpu fp32, cuda bf16 (fp32 accumulate)");
  benchmark::AddCustomContext("ratio",
                              "ns_rate/gemm_rate = GEMM-reference time / NS time, "
                              "same nominal flops steps*(4m^2n+2m^3), same run");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

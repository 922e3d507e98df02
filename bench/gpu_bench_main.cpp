// muon_gpu_bench entry point (see gpu_bench.hpp). `--ipc-export-child BYTES` runs the exporting
// side of the IPC benchmarks (the benchmark process starts it; CUDA refuses to open an IPC handle
// in the process that exported it).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>

#include "bench/gpu_bench.hpp"

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--ipc-export-child") == 0) {
    return muon::bench::ipc_export_child_main(std::strtoull(argv[2], nullptr, 10));
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  muon::bench::register_ipc_copy_benchmarks();
  muon::bench::register_device_step_benchmarks();
  muon::bench::register_server_step_benchmarks();
  muon::bench::register_colocated_benchmarks();
  benchmark::AddCustomContext("ipc",
                              "ipc_bw/d2d_bw = D2D time / IPC copy time, same bytes, "
                              "same stream, paired per iteration");
  benchmark::AddCustomContext("device_step",
                              "DeviceMuon::step, sum momentum + Nesterov, keller 5 steps, bf16 "
                              "(fp32 accumulate), scale_rule none; ns_rate/gemm_rate = cuBLAS "
                              "bf16 GEMM-reference time / step time, nominal flops "
                              "5*(4m^2n+2m^3)");
  benchmark::AddCustomContext("colocated",
                              "shared/alone = trainer bf16 GEMM time beside a busy server at "
                              "--stream-priority low / alone, same stream, same run");
  benchmark::RunSpecifiedBenchmarks();
  muon::bench::shutdown_ipc_copy_benchmarks();
  benchmark::Shutdown();
  return 0;
}

// muon_gpu_bench: the GPU data plane measured against references in the same run (architecture
// guide section 9). Each part registers its benchmarks; all skip with the reason without a GPU.
#pragma once

#include <cstdint>

namespace muon::bench {

/// ipc/copy_in/<MiB>: RemoteRing::copy_in into a ring another process exported vs cudaMemcpyAsync
/// device-to-device in this process, same bytes, same stream (ipc_copy_bench.cpp).
void register_ipc_copy_benchmarks();

/// Stops the exporting child and frees the IPC benchmarks' buffers; call before main returns
/// (while the CUDA runtime is still up).
void shutdown_ipc_copy_benchmarks();

/// The child side of the IPC benchmarks: exports a one-slot DeviceRing of `bytes`, prints its
/// descriptor as one JSON line on stdout, and exits when stdin reaches EOF. Returns the exit code.
int ipc_export_child_main(uint64_t bytes);

/// device_step/<plain|graphs>/<r>x<c>: DeviceMuon::step in bf16 on device buffers vs the cuBLAS
/// bf16 GEMM reference of the same shape (device_step_bench.cpp).
void register_device_step_benchmarks();

/// server_step/gpt2_small/<cuda_ipc|shm>: one optimizer step of GPT-2 small through a live
/// muon-offloadd on the CUDA backend from device buffers vs the same device Muon steps in process
/// (server_step_bench.cpp).
void register_server_step_benchmarks();

/// colocated/trainer_gemm/<high|normal>: a trainer's bf16 GEMMs on a stream of that priority,
/// alone and beside a busy muon-offloadd at --stream-priority low on the same GPU
/// (colocated_bench.cpp).
void register_colocated_benchmarks();

}  // namespace muon::bench

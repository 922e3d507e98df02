// Whether this process can use CUDA GPUs, with the reason when it cannot. GPU tests and
// benchmarks skip with this reason; the server's `auto` backend falls back to the CPU on it.
#pragma once

#include <string>

namespace muon {

/// "" when at least `min_devices` CUDA devices are usable, else why not, e.g.
/// "cudaGetDeviceCount failed: CUDA driver version is insufficient for CUDA runtime version" or
/// "needs 2 CUDA devices, 1 visible". Never throws. Defined only in CUDA builds.
std::string cuda_unavailable_reason(int min_devices = 1);

}  // namespace muon

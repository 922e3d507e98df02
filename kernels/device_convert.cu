// Device fills and fp32 -> bf16 narrowing (see device_convert.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/device_convert.hpp"
#include "kernels/bf16.hpp"

namespace muon {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 1 << 20;

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxGrid));
}

void check_args(const char* what, const void* a, const void* b, int64_t n) {
  if (n < 0) throw InvalidArgument(std::string(what) + ": negative count " + std::to_string(n));
  if (n > 0 && (a == nullptr || b == nullptr)) {
    throw InvalidArgument(std::string(what) + ": null device pointer");
  }
}

__global__ void __launch_bounds__(kThreads)
    fill_kernel(float* __restrict__ out, int64_t n, float value) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    out[i] = value;
  }
}

__global__ void __launch_bounds__(kThreads)
    narrow_kernel(const float* __restrict__ in, uint16_t* __restrict__ out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    out[i] = bf16_bits_from_f32_bits(__float_as_uint(in[i]));
  }
}

}  // namespace

void fill_device(float* out, int64_t n, float value, StreamHandle stream) {
  check_args("fill_device", out, out, n);
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, n, value);
  MUON_CUDA_CHECK(cudaGetLastError());
}

void narrow_to_bf16_device(const float* in, uint16_t* out, int64_t n, StreamHandle stream) {
  check_args("narrow_to_bf16_device", in, out, n);
  if (n == 0) return;
  narrow_kernel<<<grid_for(n), kThreads, 0, stream>>>(in, out, n);
  MUON_CUDA_CHECK(cudaGetLastError());
}

}  // namespace muon

// The other process of the CUDA IPC tests: opens what the test process exported and moves a
// pattern through it. Exit status 0 on success, 2 on a usage error, 3 on wrong bytes, 4 on an
// exception (message on stderr).
//   cuda_ipc_child region <region json> <seed>
//       copies the pattern into the exported region (opened at its allocation base + offset)
//   cuda_ipc_child ring-in <ring json> <slot> <bytes> <seed>
//       RemoteRing::copy_in of the pattern into the slot on its own stream
//   cuda_ipc_child ring-out <ring json> <slot> <bytes> <seed>
//       RemoteRing::copy_out of the slot, then checks it holds the pattern
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cuda_check.hpp"
#include "kernels/device_stream.hpp"
#include "tests/transport/ipc_pattern.hpp"
#include "transport/cuda_ipc.hpp"

using namespace muon;
using namespace muon::transport;

namespace {

// The pattern in this process' device memory.
void* device_pattern(size_t bytes, unsigned seed) {
  const auto host = muon::testing::ipc_pattern(bytes, seed);
  void* p = nullptr;
  MUON_CUDA_CHECK(cudaMalloc(&p, bytes));
  MUON_CUDA_CHECK(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice));
  return p;
}

int region(const std::string& json, unsigned seed) {
  const ExportedRegion r = region_from_json(nlohmann::json::parse(json));
  auto cache = make_cuda_ipc_cache();
  void* dst = open_region(r, *cache);
  if (open_region(r, *cache) != dst || cache->size() != 1) {
    std::fprintf(stderr, "cuda_ipc_child: the second open_region did not hit the cache\n");
    return 3;
  }
  void* src = device_pattern(r.bytes, seed);
  DeviceStream stream;
  MUON_CUDA_CHECK(cudaMemcpyAsync(dst, src, r.bytes, cudaMemcpyDefault, stream.get()));
  stream.synchronize();
  MUON_CUDA_CHECK(cudaFree(src));
  return 0;
}

int ring(const std::string& mode, const std::string& json, uint64_t slot, size_t bytes,
         unsigned seed) {
  const DeviceRingDescriptor d = ring_descriptor_from_json(nlohmann::json::parse(json));
  auto cache = make_cuda_ipc_cache();
  RemoteRing remote(d, *cache);
  DeviceStream stream;
  if (mode == "ring-in") {
    void* src = device_pattern(bytes, seed);
    remote.copy_in(slot, src, bytes, stream.get());
    stream.synchronize();
    MUON_CUDA_CHECK(cudaFree(src));
    return 0;
  }
  void* dst = nullptr;
  MUON_CUDA_CHECK(cudaMalloc(&dst, bytes));
  remote.copy_out(slot, dst, bytes, stream.get());
  stream.synchronize();
  std::vector<uint8_t> got(bytes);
  MUON_CUDA_CHECK(cudaMemcpy(got.data(), dst, bytes, cudaMemcpyDeviceToHost));
  MUON_CUDA_CHECK(cudaFree(dst));
  if (got != muon::testing::ipc_pattern(bytes, seed)) {
    std::fprintf(stderr, "cuda_ipc_child: slot %llu does not hold the pattern\n",
                 static_cast<unsigned long long>(slot));
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "region" && argc == 4) {
      return region(argv[2], static_cast<unsigned>(std::stoul(argv[3])));
    }
    if ((mode == "ring-in" || mode == "ring-out") && argc == 6) {
      return ring(mode, argv[2], std::stoull(argv[3]), std::stoull(argv[4]),
                  static_cast<unsigned>(std::stoul(argv[5])));
    }
    std::fprintf(stderr,
                 "usage: cuda_ipc_child region JSON SEED | ring-in|ring-out JSON SLOT BYTES "
                 "SEED\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_ipc_child: %s\n", e.what());
    return 4;
  }
}

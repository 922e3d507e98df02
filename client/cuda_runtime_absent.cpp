// client/cuda_runtime_loader.hpp in a client library built without CUDA: no runtime, and why.
#include "client/cuda_runtime_loader.hpp"

namespace muon::client {

bool cuda_runtime_loaded() {
  return false;
}

std::string cuda_runtime_origin() {
  return "";
}

std::string cuda_runtime_failure() {
  return "this client library was built without CUDA (rebuild with -DMUON_OFFLOAD_CUDA=ON on a "
         "machine with the CUDA toolkit)";
}

}  // namespace muon::client

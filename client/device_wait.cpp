#include "client/device_wait.hpp"

#include <thread>

#include "core/cuda_check.hpp"

namespace muon::client {
namespace {

template <class Query>
bool done_within(Query query, std::chrono::milliseconds timeout) noexcept {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const cudaError_t q = query();
    if (q != cudaErrorNotReady) {
      if (q != cudaSuccess) {
        detail::report_failed_call("cudaEventQuery/cudaStreamQuery", cudaGetErrorString(q),
                                   __FILE__, __LINE__);
      }
      return true;
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace

bool event_done_within(cudaEvent_t event, std::chrono::milliseconds timeout) noexcept {
  return event == nullptr || done_within([&] { return cudaEventQuery(event); }, timeout);
}

bool stream_idle_within(cudaStream_t stream, std::chrono::milliseconds timeout) noexcept {
  return done_within([&] { return cudaStreamQuery(stream); }, timeout);
}

}  // namespace muon::client

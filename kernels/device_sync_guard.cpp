#include "kernels/device_sync_guard.hpp"

namespace muon {
namespace {

// One per process: the daemon links muon_device_runtime statically once.
std::shared_mutex& device_sync_mutex() {
  static std::shared_mutex mutex;
  return mutex;
}

}  // namespace

std::shared_lock<std::shared_mutex> device_sync_scope() {
  return std::shared_lock<std::shared_mutex>(device_sync_mutex());
}

std::unique_lock<std::shared_mutex> capture_scope() {
  return std::unique_lock<std::shared_mutex>(device_sync_mutex());
}

}  // namespace muon

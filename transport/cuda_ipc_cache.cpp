#include "transport/cuda_ipc_cache.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace muon::transport {

IpcHandleCache::IpcHandleCache(std::unique_ptr<IpcOpener> opener) : opener_(std::move(opener)) {
  if (!opener_) throw InvalidArgument("IpcHandleCache needs an opener");
}

IpcHandleCache::~IpcHandleCache() {
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) opener_->close(open_.at(*it));
}

void* IpcHandleCache::open(const IpcHandleBytes& handle) {
  std::lock_guard lock(mutex_);
  if (auto it = open_.find(handle); it != open_.end()) return it->second;
  void* base = opener_->open(handle);
  open_.emplace(handle, base);
  order_.push_back(handle);
  return base;
}

bool IpcHandleCache::close(const IpcHandleBytes& handle) {
  std::lock_guard lock(mutex_);
  auto it = open_.find(handle);
  if (it == open_.end()) return false;
  opener_->close(it->second);
  open_.erase(it);
  order_.erase(std::find(order_.begin(), order_.end(), handle));
  return true;
}

size_t IpcHandleCache::size() const {
  std::lock_guard lock(mutex_);
  return open_.size();
}

}  // namespace muon::transport

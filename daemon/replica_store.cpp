#include "daemon/replica_store.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace muon::daemon {

namespace {

// Elements a replica may have (the wire's bound on a push's offset and count).
constexpr int64_t kMaxElements = int64_t{1} << 40;

// The outcomes a seal may name (Replica::outcome): a refused step's is its error code.
bool known_outcome(const std::string& o) {
  return !o.empty() && o.size() <= 64;
}

}  // namespace

void ReplicaStore::stage(const std::string& name, int source, transport::ChunkKind kind,
                         int64_t step, int64_t offset, std::span<const float> values) {
  if (kind != transport::ChunkKind::replica_momentum &&
      kind != transport::ChunkKind::replica_update) {
    throw InvalidArgument("replica of '" + name + "': a chunk of kind other than "
                          "replica_momentum or replica_update");
  }
  const auto end = offset + static_cast<int64_t>(values.size());
  if (offset < 0 || end > kMaxElements) {
    throw InvalidArgument("replica of '" + name + "': elements [" + std::to_string(offset) + ", " +
                          std::to_string(end) + ") out of range");
  }
  Staging& st = staging_[name];
  if (st.step != step || st.source != source) st = Staging{source, step, {}, {}, 0, 0};
  const bool momentum = kind == transport::ChunkKind::replica_momentum;
  auto& buf = momentum ? st.momentum : st.update;
  if (static_cast<int64_t>(buf.size()) < end) buf.resize(static_cast<size_t>(end));
  std::memcpy(buf.data() + offset, values.data(), values.size_bytes());
  (momentum ? st.momentum_elems : st.update_elems) += static_cast<int64_t>(values.size());
}

void ReplicaStore::seal(const transport::RegisterParam& m, int source) {
  const std::string who = "replica of '" + m.name + "' step " + std::to_string(m.replica_step);
  if (!known_outcome(m.replica_outcome)) {
    throw InvalidArgument(who + ": unknown outcome '" + m.replica_outcome + "'");
  }
  const int64_t numel = matrix_shape_from_dims(m.shape, m.name).numel();
  auto it = staging_.find(m.name);
  if (it == staging_.end() || it->second.step != m.replica_step || it->second.source != source) {
    throw InvalidArgument(who + ": sealed with no chunk of that step staged");
  }
  Staging& st = it->second;
  const bool wants_update = m.replica_outcome == "applied" || m.replica_outcome == "skipped";
  if (st.momentum_elems != numel || static_cast<int64_t>(st.momentum.size()) != numel) {
    throw InvalidArgument(who + ": " + std::to_string(st.momentum_elems) +
                          " momentum values staged for " + std::to_string(numel) + " elements");
  }
  if (st.update_elems != (wants_update ? numel : 0) ||
      static_cast<int64_t>(st.update.size()) != (wants_update ? numel : 0)) {
    throw InvalidArgument(who + ": " + std::to_string(st.update_elems) +
                          " update values staged for outcome '" + m.replica_outcome + "'");
  }
  Replica r;
  r.shape = m.shape;
  r.options = m.options;
  r.grad_dtype = m.grad_dtype;
  r.update_dtype = m.update_dtype;
  r.step = m.replica_step;
  r.outcome = m.replica_outcome;
  r.source = source;
  r.registrants = m.replica_registrants;
  r.momentum = std::move(st.momentum);
  r.update = std::move(st.update);
  staging_.erase(it);
  sealed_[m.name] = std::move(r);
}

std::optional<Replica> ReplicaStore::take(const std::string& name) {
  auto it = sealed_.find(name);
  if (it == sealed_.end()) return std::nullopt;
  Replica r = std::move(it->second);
  sealed_.erase(it);
  staging_.erase(name);
  return r;
}

const Replica* ReplicaStore::find(const std::string& name) const {
  auto it = sealed_.find(name);
  return it == sealed_.end() ? nullptr : &it->second;
}

}  // namespace muon::daemon

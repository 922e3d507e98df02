// The buddy's side of replication (docs/design.md, "Failover"): the copy of each parameter an
// owner of the pool streams here after every step it applied (daemon/pool/replicator.hpp), so that
// this server can take the parameter over when the owner is lost.
//
// A replica step arrives as chunks (the momentum after the step, numel fp32; the step's update,
// numel fp32, absent for a step that produced none) into a staging copy, then a seal names the
// step and its outcome: only then does the staged copy replace the sealed one. An owner lost
// mid-stream therefore leaves the last sealed step, whole: never a mix of two steps.
// No threads, no sockets: the Engine calls it on its io thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/muon_options.hpp"
#include "transport/messages.hpp"

namespace muon::daemon {

/// One parameter's replicated state: what its owner held after `step`.
struct Replica {
  std::vector<int64_t> shape;  ///< global shape as registered ([r, c] or [b, r, c])
  MuonOptions options;
  transport::DType grad_dtype = transport::DType::f32;
  transport::DType update_dtype = transport::DType::f32;
  int64_t step = -1;            ///< the owner's last applied step (-1: none yet)
  std::vector<float> momentum;  ///< fp32, numel values, after `step`
  /// fp32, numel values: the update of `step` (what its ranks receive); empty for outcome
  /// "registered" and for a refused step.
  std::vector<float> update;
  /// "registered" (no step replicated yet: the owner's state at registration), "applied",
  /// "skipped" (update zeros, momentum untouched) or a refused step's error code ("non_finite",
  /// "backend").
  std::string outcome = "registered";
  int source = -1;  ///< the plan id of the owner that sent it
  /// The owner's registrants and their ranges (empty from an owner that does not send them):
  /// a takeover's registration is complete with the first of them
  /// (Engine::registrants_from_replica).
  std::vector<transport::RegistrantRanges> registrants;
};

class ReplicaStore {
 public:
  /// A replica chunk of `name` for `step` from owner `source`: `values` (fp32) at element
  /// `offset` of the staged momentum (ChunkKind::replica_momentum) or update
  /// (ChunkKind::replica_update). A chunk of another step than the one being staged restarts
  /// the staging. Throws InvalidArgument for another kind or values past kMaxElements.
  void stage(const std::string& name, int source, transport::ChunkKind kind, int64_t step,
             int64_t offset, std::span<const float> values);
  /// Seals the staged step `m.replica_step` of `m.name` (transport::RegisterParam::replica):
  /// its momentum must cover exactly the shape's elements and its update none or all of them
  /// (none for outcome "registered" and refused steps). The staged copy becomes the replica.
  /// Throws InvalidArgument naming the parameter when nothing of that step was staged, the
  /// chunks do not cover the shape, or the outcome is unknown; the sealed replica is then kept.
  void seal(const transport::RegisterParam& m, int source);
  /// Takes the sealed replica of `name` out of the store (a takeover); nullopt when none.
  std::optional<Replica> take(const std::string& name);
  /// The sealed replica of `name`, or null.
  const Replica* find(const std::string& name) const;
  /// Sealed replicas by name (status).
  const std::map<std::string, Replica>& sealed() const { return sealed_; }

 private:
  struct Staging {
    int source = -1;
    int64_t step = -1;
    std::vector<float> momentum, update;
    int64_t momentum_elems = 0, update_elems = 0;  // values written (chunks never overlap)
  };
  std::map<std::string, Staging> staging_;
  std::map<std::string, Replica> sealed_;
};

}  // namespace muon::daemon

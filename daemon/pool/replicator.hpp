// The owner's side of replication (docs/design.md, "Failover"): after each step a parameter
// owned here applied, its momentum and the step's update go to the parameter's buddy server
// (plan servers[].buddy; daemon/replica_store.hpp keeps them there), and the Engine releases the
// update to the ranks only once the buddy answered that it holds them. So whatever step any rank
// has seen, the buddy holds the state after it: a takeover loses no step and applies none twice.
//
// Wire: a replica session (hello as transport::replica_rank(world_size, this server's id)) per
// buddy; per replicated step, the momentum as replica_momentum chunks and the update as
// replica_update chunks (fp32, the push's step is the replica step + 1: a push's step is never
// negative), then a RegisterParam with replica = true that seals them and names the owner's
// registrants with their ranges (a takeover's registration needs only the first of them); its
// register_ok is the buddy's acknowledgement.
//
// Threads: none of its own. Each buddy is reached through a PeerLink (daemon/pool/peer_link.hpp)
// on the server's io_context; a buddy's jobs go out in call order. A buddy that cannot be reached
// fails its jobs at once for retry_after (no step waits for a dead buddy's connect timeout), then
// is tried again.
#pragma once

#include "transport/asio.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/pool/peer_link.hpp"
#include "daemon/pool/pool_peers.hpp"
#include "transport/messages.hpp"

namespace muon::daemon {

/// How this server replicates to its buddies.
struct ReplicatorConfig {
  PoolPeers peers;
  std::chrono::milliseconds connect_timeout{500};
  std::chrono::milliseconds op_timeout{30000};
  /// After a failure toward a buddy, its jobs fail at once for this long.
  std::chrono::milliseconds retry_after{2000};
};

/// One replicated step of one parameter.
struct ReplicaJob {
  int target = -1;  ///< the buddy's plan id
  /// The seal: name, shape, dtypes, options; replica = true, replica_step, replica_outcome,
  /// replica_registrants.
  transport::RegisterParam seal;
  const float* momentum = nullptr;  ///< numel fp32; unchanged until the job's done ran
  const float* update = nullptr;    ///< numel fp32, or null (no update to replicate)
  int64_t numel = 0;
};

class Replicator {
 public:
  /// "" when the buddy holds the step, else why not (unreachable, refused).
  using Done = std::function<void(std::string error)>;

  /// Connects to a buddy when its first job comes, on `io` (the server's io_context, run by its
  /// one io thread, the only thread that may call the replicator). Throws InvalidArgument when
  /// config.peers.server_id is not in the pool.
  Replicator(ReplicatorConfig config, boost::asio::io_context& io);
  /// Closes every link; nothing owed is called any more.
  ~Replicator();
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  /// Streams `job` to its buddy and seals it; `done` runs later on the io thread. The job's
  /// buffers are read until then.
  void replicate(ReplicaJob job, Done done);
  /// Buddy `target` is known lost (its replica session toward this server broke): its jobs fail
  /// at once for retry_after, as after a failed job.
  void mark_down(int target);
  /// "server 2 (/run/.../b.sock)" for messages.
  std::string describe(int id) const;
  /// The server stops in order: each buddy link says goodbye (PeerLink::leave), nothing owed is
  /// called any more. The replicator is not used after this.
  void leave();

 private:
  /// The live link to `target`, made when there is none or it was lost.
  std::shared_ptr<PeerLink> link_to(int target);
  void later(std::function<void()> fn);

  ReplicatorConfig config_;
  boost::asio::io_context& io_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // expires with the replicator
  std::map<int, std::shared_ptr<PeerLink>> links_;
  std::map<int, std::chrono::steady_clock::time_point> down_until_;
};

}  // namespace muon::daemon

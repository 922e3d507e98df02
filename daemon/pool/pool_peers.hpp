// This server's place in its pool and how it reaches the other servers, as the relay (toward
// owners) and the replicator (toward buddies) share it: the plan's endpoints in id order, this
// server's id, the data plane toward a peer on this host and on another, the pool's token.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "daemon/pool/peer_link.hpp"
#include "transport/messages.hpp"

namespace muon::daemon {

/// muon-offloadd --pool-servers, --server-id, --auth-token-file; the planes the Engine picks.
struct PoolPeers {
  /// Every server of the plan in id order: Unix socket paths or "tcp://HOST:PORT".
  std::vector<std::string> endpoints;
  int server_id = 0;   ///< this server's plan id
  int world_size = 1;  ///< compute ranks of the job
  /// Data plane toward a peer over TCP (another host); a peer on a Unix socket (this host) is
  /// reached over shm, so a partial sum on a GPU server goes through host memory there.
  transport::DataPlane remote_plane = transport::DataPlane::shm;
  std::string auth_token;  ///< the pool's token (tcp endpoints)
  int device = 0;          ///< the CUDA device of this server (nccl toward another host)

  /// Throws InvalidArgument, naming `who` ("relay"), when server_id is not in endpoints.
  void check(const std::string& who) const;
  /// True when `id` is another server of the pool.
  bool is_peer(int id) const;
  /// "server 3 (tcp://h:29603)", for messages (no endpoint for an id outside the pool).
  std::string describe(int id) const;
  /// How a link to peer `id` says hello as `rank` (transport::relay_rank or replica_rank of this
  /// server; `relay` says which) from `client_name`, with its waits.
  PeerLinkConfig link_config(int id, int rank, bool relay, std::string client_name,
                             std::chrono::milliseconds connect_timeout,
                             std::chrono::milliseconds op_timeout) const;
};

}  // namespace muon::daemon

#include "daemon/pool/pool_peers.hpp"

#include "core/error.hpp"
#include "transport/endpoint.hpp"

namespace muon::daemon {

void PoolPeers::check(const std::string& who) const {
  if (server_id < 0 || server_id >= static_cast<int>(endpoints.size())) {
    throw InvalidArgument(who + ": server id " + std::to_string(server_id) +
                          " is not in the pool of " + std::to_string(endpoints.size()) +
                          " servers");
  }
}

bool PoolPeers::is_peer(int id) const {
  return id >= 0 && id < static_cast<int>(endpoints.size()) && id != server_id;
}

std::string PoolPeers::describe(int id) const {
  const bool known = id >= 0 && id < static_cast<int>(endpoints.size());
  return "server " + std::to_string(id) +
         (known ? " (" + endpoints[static_cast<size_t>(id)] + ")" : std::string());
}

PeerLinkConfig PoolPeers::link_config(int id, int rank, bool relay, std::string client_name,
                                      std::chrono::milliseconds connect_timeout,
                                      std::chrono::milliseconds op_timeout) const {
  PeerLinkConfig c;
  c.endpoint = endpoints.at(static_cast<size_t>(id));
  c.rank = rank;
  c.world_size = world_size;
  c.client_name = std::move(client_name);
  c.data_plane = transport::parse_endpoint(c.endpoint).is_tcp() ? remote_plane
                                                                : transport::DataPlane::shm;
  c.auth_token = auth_token;
  (relay ? c.relay_server : c.replica_server) = server_id;
  c.device = device;
  c.connect_timeout = connect_timeout;
  c.op_timeout = op_timeout;
  return c;
}

}  // namespace muon::daemon

// What the job's plan (`muon-offload plan`, plan/plan.hpp) says about the parameters one server
// of the pool serves: which ranks register each parameter here, and whether this server owns it
// or relays it.
//
// Paths (plan/plan.hpp). A parameter p has one owner server o. The compute ranks of a domain d
// push p to relays[d]: o itself in o's domain, a server of d elsewhere (the relay sums its
// domain's contributions and forwards one partial sum to o), or null when d has no server (the
// ranks push straight to o). So at o the registrants of p are the ranks that push to o directly
// plus one relay rank per relaying server (transport::relay_rank: world_size + server id, summed
// after the compute ranks, in server-id order); at a relay they are its domain's ranks.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace muon::daemon {

class PoolRoutes {
 public:
  /// One planned parameter as this server serves it.
  struct Route {
    std::vector<int> registrants;  ///< rank ids expected to register it here, ascending
    int owner = -1;                ///< the owner's server id
    bool relayed = false;          ///< true: this server relays it to the owner
    /// true: this server is the owner's buddy (servers[].buddy): it is registered here only
    /// when the owner was lost, by the owner's registrants, and owned here from its replica
    /// (daemon/replica_store.hpp).
    bool takeover = false;
  };

  /// Parses the plan's JSON text for server `server_id` (its `servers[].id`). `source` names the
  /// plan in messages. Throws InvalidArgument naming the field for a plan that is not JSON, lacks
  /// servers, domains, ranks or parameters, has a server id, rank or relay out of range, or does
  /// not list `server_id`; or names a buddy that is its own server, out of range, or relays a
  /// parameter of the server it buddies.
  PoolRoutes(const std::string& plan_json, int server_id, const std::string& source);
  /// Reads the plan from a file; InvalidArgument when it cannot be read, or as above.
  static PoolRoutes from_file(const std::string& path, int server_id);

  /// The route of `name` at this server; nullopt when the plan does not name the parameter (then
  /// every rank of the job registers it with whichever server it chose). Throws InvalidArgument
  /// when the plan routes the parameter through other servers only (the message names its owner).
  std::optional<Route> route(const std::string& name) const;

  int server_id() const { return server_id_; }
  int servers() const { return servers_; }
  /// Compute ranks of the plan (the job's world size).
  int world_size() const { return world_size_; }
  /// Parameters this server relays (their owners elsewhere).
  int relayed() const { return relayed_; }
  /// The buddy of server `id` (servers[].buddy, optional in the plan): -1 when none or `id` is
  /// out of range.
  int buddy_of(int id) const;
  /// The plan owner of `name`; -1 when the plan does not name it.
  int owner_of(const std::string& name) const;
  const std::string& source() const { return source_; }

 private:
  struct Entry {
    std::optional<Route> here;  // null: routed through other servers only
    int owner = -1;
  };
  std::string source_;
  int server_id_ = -1;
  int servers_ = 0;
  int world_size_ = 0;
  int relayed_ = 0;
  std::vector<int> buddies_;  // by server id, -1: none
  std::map<std::string, Entry> params_;
};

}  // namespace muon::daemon

#include "daemon/pool_routes.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "transport/messages.hpp"

namespace muon::daemon {
namespace {

using nlohmann::json;

// The array `key` of `j`; InvalidArgument naming it otherwise.
const json& array_of(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || !j.at(key).is_array()) {
    throw InvalidArgument(where + ": '" + key + "' must be an array");
  }
  return j.at(key);
}

// An integer in [lo, hi); InvalidArgument naming `what` otherwise.
int int_in(const json& v, int lo, int hi, const std::string& what) {
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() >= hi) {
    throw InvalidArgument(what + " must be an integer in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "), got " + v.dump());
  }
  return v.get<int>();
}

}  // namespace

PoolRoutes::PoolRoutes(const std::string& plan_json, int server_id, const std::string& source)
    : source_(source), server_id_(server_id) {
  const std::string where = "plan '" + source + "'";
  json doc;
  try {
    doc = json::parse(plan_json);
  } catch (const json::exception& e) {
    throw InvalidArgument(where + " is not JSON: " + e.what());
  }
  const auto& servers = array_of(doc, "servers", where);
  const auto& domains = array_of(doc, "domains", where);
  const auto& ranks = array_of(doc, "ranks", where);
  const auto& params = array_of(doc, "parameters", where);
  servers_ = static_cast<int>(servers.size());
  world_size_ = static_cast<int>(ranks.size());
  if (world_size_ < 1) throw InvalidArgument(where + " has no compute ranks");
  if (servers_ < 1 || servers_ > transport::kMaxRelayServers) {
    throw InvalidArgument(where + " must list 1.." + std::to_string(transport::kMaxRelayServers) +
                          " servers, has " + std::to_string(servers_));
  }
  for (int i = 0; i < servers_; ++i) {
    const auto& sv = servers[static_cast<size_t>(i)];
    if (!sv.is_object() || !sv.contains("id") ||
        int_in(sv.at("id"), 0, servers_, where + ": servers[" + std::to_string(i) + "].id") != i) {
      throw InvalidArgument(where + ": servers must be listed in id order 0.." +
                            std::to_string(servers_ - 1));
    }
  }
  buddies_.assign(static_cast<size_t>(servers_), -1);
  for (int i = 0; i < servers_; ++i) {
    const auto& sv = servers[static_cast<size_t>(i)];
    if (!sv.contains("buddy") || sv.at("buddy").is_null()) continue;
    const int b = int_in(sv.at("buddy"), 0, servers_, where + ": servers[" + std::to_string(i) +
                                                          "].buddy");
    if (b == i) {
      throw InvalidArgument(where + ": server " + std::to_string(i) + " is its own buddy");
    }
    buddies_[static_cast<size_t>(i)] = b;
  }
  if (server_id < 0 || server_id >= servers_) {
    throw InvalidArgument(where + " has servers 0.." + std::to_string(servers_ - 1) +
                          "; there is no server " + std::to_string(server_id));
  }
  // Each domain's compute ranks and servers.
  std::vector<std::vector<int>> domain_ranks, domain_servers;
  for (size_t d = 0; d < domains.size(); ++d) {
    const std::string what = where + ": domains[" + std::to_string(d) + "]";
    std::vector<int> rs, ss;
    for (const auto& r : array_of(domains[d], "compute_ranks", what)) {
      rs.push_back(int_in(r, 0, world_size_, what + ".compute_ranks[]"));
    }
    for (const auto& sv : array_of(domains[d], "servers", what)) {
      ss.push_back(int_in(sv, 0, servers_, what + ".servers[]"));
    }
    domain_ranks.push_back(std::move(rs));
    domain_servers.push_back(std::move(ss));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    const std::string what = where + ": parameters[" + std::to_string(i) + "]";
    if (!p.is_object() || !p.contains("name") || !p.at("name").is_string() ||
        !p.contains("owner")) {
      throw InvalidArgument(what + " needs a name and an owner");
    }
    const std::string name = p.at("name").get<std::string>();
    const int owner = int_in(p.at("owner"), 0, servers_, what + ".owner");
    const auto& relays = array_of(p, "relays", what);
    if (relays.size() != domain_ranks.size()) {
      throw InvalidArgument(what + ".relays has " + std::to_string(relays.size()) +
                            " entries for " + std::to_string(domain_ranks.size()) + " domains");
    }
    Entry e;
    e.owner = owner;
    Route at_owner{{}, owner, false};
    for (size_t d = 0; d < relays.size(); ++d) {
      const int relay =
          relays[d].is_null() ? -1 : int_in(relays[d], 0, servers_, what + ".relays[]");
      const auto& rs = domain_ranks[d];
      if (relay < 0 || relay == owner) {  // straight to the owner
        at_owner.registrants.insert(at_owner.registrants.end(), rs.begin(), rs.end());
        continue;
      }
      const auto& ss = domain_servers[d];
      if (std::find(ss.begin(), ss.end(), relay) == ss.end()) {
        throw InvalidArgument(what + ".relays[" + std::to_string(d) + "] = server " +
                              std::to_string(relay) + " is not a server of domain " +
                              std::to_string(d));
      }
      if (rs.empty()) continue;  // a relay for no rank forwards nothing
      if (relay == buddies_[static_cast<size_t>(owner)]) {
        throw InvalidArgument(what + " ('" + name + "'): server " + std::to_string(relay) +
                              " relays it for domain " + std::to_string(d) +
                              " and is the buddy of its owner, server " + std::to_string(owner) +
                              ": a buddy must relay none of its owner's parameters");
      }
      at_owner.registrants.push_back(transport::relay_rank(world_size_, relay));
      if (relay == server_id) e.here = Route{rs, owner, true};
    }
    if (buddies_[static_cast<size_t>(owner)] == server_id) {
      // Registered here only after the owner was lost: by the owner's registrants.
      e.here = at_owner;
      e.here->takeover = true;
    }
    if (owner == server_id) e.here = std::move(at_owner);
    if (e.here) {
      auto& rg = e.here->registrants;
      std::sort(rg.begin(), rg.end());
      rg.erase(std::unique(rg.begin(), rg.end()), rg.end());
      if (rg.empty()) throw InvalidArgument(what + " ('" + name + "') has no compute rank");
      if (e.here->relayed) ++relayed_;
    }
    if (!params_.emplace(name, std::move(e)).second) {
      throw InvalidArgument(where + " names parameter '" + name + "' twice");
    }
  }
}

PoolRoutes PoolRoutes::from_file(const std::string& path, int server_id) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument("cannot read plan '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return PoolRoutes(text.str(), server_id, path);
}

int PoolRoutes::buddy_of(int id) const {
  return id >= 0 && id < servers_ ? buddies_[static_cast<size_t>(id)] : -1;
}

int PoolRoutes::owner_of(const std::string& name) const {
  const auto it = params_.find(name);
  return it == params_.end() ? -1 : it->second.owner;
}

std::optional<PoolRoutes::Route> PoolRoutes::route(const std::string& name) const {
  const auto it = params_.find(name);
  if (it == params_.end()) return std::nullopt;
  if (!it->second.here) {
    throw InvalidArgument("plan '" + source_ + "' does not route parameter '" + name +
                          "' through server " + std::to_string(server_id_) +
                          " (its owner is server " + std::to_string(it->second.owner) +
                          "; ranks push it to their domain's relay or to the owner)");
  }
  return it->second.here;
}

}  // namespace muon::daemon

#include "client/client.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "client/auth_token_source.hpp"
#include "client/device_copy.hpp"
#include "transport/endpoint.hpp"

namespace muon::client {

Client::Client(ClientConfig config) : config_(std::move(config)) {
  if (config_.servers.empty()) throw InvalidArgument("client: no server socket given");
  if (config_.world_size < 1 || config_.rank < 0 || config_.rank >= config_.world_size) {
    throw InvalidArgument("client: rank " + std::to_string(config_.rank) + " outside world size " +
                          std::to_string(config_.world_size));
  }
  set_job(config_.job, config_.resume);  // its checks
  resolve_endpoint_settings();
  if (config_.connect_on_first_use) {
    lazy_ = *config_.connect_on_first_use;
  } else {
    const char* scope = std::getenv("MUON_OFFLOAD_SERVERS_SCOPE");
    lazy_ = scope != nullptr && std::strcmp(scope, "global") == 0;
  }
  connections_.resize(config_.servers.size());
  if (!lazy_) {
    for (size_t i = 0; i < connections_.size(); ++i) connection(i);
  }
}

void Client::resolve_endpoint_settings() {
  token_ = auth_token_for(config_.auth_token, config_.servers);
  remote_ = config_.remote_data_plane;
  if (!remote_ && transport::any_tcp_endpoint(config_.servers)) {
    if (const char* env = std::getenv("MUON_OFFLOAD_REMOTE_DATA_PLANE"); env && *env) {
      try {
        remote_ = transport::parse_data_plane(env);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(e.message() + " (from MUON_OFFLOAD_REMOTE_DATA_PLANE)");
      }
    }
  }
}

Client::~Client() {
  connections_.clear();  // joins the reader threads before the members their callbacks use go
}

Connection& Client::connection(size_t i) {
  auto& slot = connections_.at(i);
  if (!slot) slot = connect(i);
  return *slot;
}

std::unique_ptr<Connection> Client::connect(size_t i) {
  const auto& path = config_.servers.at(i);
  const bool tcp = transport::parse_endpoint(path).is_tcp();
  auto c = std::make_unique<Connection>(
      path, config_.rank, config_.world_size,
      config_.name.empty() ? "rank " + std::to_string(config_.rank) : config_.name,
      config_.connect_timeout, config_.op_timeout, tcp && remote_ ? *remote_ : config_.data_plane,
      token_);
  c->set_update_callback(
      [this](const std::string& name, int64_t step) { on_update_complete(name, step); });
  return c;
}

Connection& Client::live_connection(size_t i) {
  auto& slot = connections_.at(i);
  if (!slot || slot->lost_reason().empty()) return connection(i);
  // Until the new one is open the lost one stays: what its hello said survives a crash
  // (survival()) is still there for the error when the server is gone for good.
  auto fresh = connect(i);
  slot = std::move(fresh);  // the lost one joins its reader thread here
  return *slot;
}

bool Client::left_behind(size_t i) const {
  const auto& slot = connections_.at(i);
  if (!slot || slot->lost_reason().empty()) return false;
  return std::none_of(params_.begin(), params_.end(), [i](const auto& kv) {
    return kv.second.server == static_cast<int>(i);
  });
}

void Client::on_update_complete(const std::string& name, int64_t step) {
  UpdateCallback cb;
  {
    std::lock_guard lk(callback_mu_);
    arrivals_[{name, step}] = std::chrono::steady_clock::now();
    // Updates nobody waits for (callback-only users) must not pile up.
    constexpr size_t kMaxArrivals = 4096;
    while (arrivals_.size() > kMaxArrivals) arrivals_.erase(arrivals_.begin());
    cb = callback_;
  }
  if (cb) cb(name, step);
}

const ParameterRegistration& Client::registration(const std::string& name) const {
  auto it = params_.find(name);
  if (it == params_.end()) throw InvalidArgument("parameter '" + name + "' is not registered");
  return it->second;
}

Connection& Client::owner(const std::string& name) {
  return connection(static_cast<size_t>(registration(name).server));
}

transport::RegisterParam register_message(const ParameterRegistration& p) {
  transport::RegisterParam m;
  m.name = p.name;
  m.shape = p.shape;
  m.grad_dtype = p.grad_dtype;
  m.update_dtype = p.update_dtype;
  m.options = p.options;
  m.push = p.push;
  m.want = p.want;
  return m;
}

void Client::register_parameters(const std::vector<ParameterRegistration>& params) {
  std::vector<std::pair<size_t, uint32_t>> sent;
  for (const auto& p : params) {
    if (p.server < 0 || p.server >= static_cast<int>(connections_.size())) {
      throw InvalidArgument("parameter '" + p.name + "': owner server index " +
                            std::to_string(p.server) + " but " +
                            std::to_string(connections_.size()) + " server(s) configured");
    }
    // Packed: every chunk of this rank is addressed by packed position, so a column block (a
    // row range x a column range: one range per row) is one push and one update.
    transport::RegisterParam m = register_message(p);
    m.job = config_.job;
    m.resume = config_.resume;
    m.packed = true;
    auto& c = live_connection(static_cast<size_t>(p.server));
    c.expect_updates(p.name, p.want, transport::dtype_bytes(p.update_dtype), true);
    sent.emplace_back(static_cast<size_t>(p.server), c.send_register(m));
    params_[p.name] = p;
    push_sets_.erase(p.name);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    connections_[sent[i].first]->wait_register(sent[i].second, params[i].name);
  }
}

void Client::set_job(std::string job, bool resume) {
  if (job.size() > transport::kMaxJob) {
    throw InvalidArgument("job identity of " + std::to_string(job.size()) + " bytes; at most " +
                          std::to_string(transport::kMaxJob));
  }
  config_.job = std::move(job);
  config_.resume = resume;
}

const RangeSet& Client::push_set(const std::string& name) {
  auto it = push_sets_.find(name);
  if (it != push_sets_.end()) return it->second;
  const auto& reg = registration(name);
  int64_t numel = 1;
  for (auto d : reg.shape) numel *= d;
  return push_sets_
      .emplace(name, RangeSet::disjoint(reg.push, numel, "parameter '" + name + "': push"))
      .first->second;
}

void Client::for_each_piece(const std::string& name, int64_t offset, int64_t count,
                            const std::function<void(int64_t, int64_t, int64_t)>& piece) {
  const auto& reg = registration(name);
  const int64_t esize = static_cast<int64_t>(transport::dtype_bytes(reg.grad_dtype));
  const auto& set = push_set(name);
  const auto& ranges = set.ranges();
  // A chunk addresses one push range by element here: cut the data at range boundaries, and
  // refuse (naming the element) what lies outside every push range.
  int64_t pos = offset;
  const int64_t end = offset + count;
  while (pos < end) {
    auto it = std::upper_bound(ranges.begin(), ranges.end(), pos,
                               [](int64_t off, const transport::Range& r) { return off < r.begin; });
    if (it == ranges.begin() || std::prev(it)->end <= pos) {
      throw InvalidArgument("parameter '" + name + "': element " + std::to_string(pos) +
                            " is outside the push ranges this rank registered");
    }
    const int64_t n = std::min(end, std::prev(it)->end) - pos;
    piece(pos, *set.packed_offset(pos, n), n);
    window_.bytes_pushed += n * esize;
    pos += n;
  }
}

void Client::push(const std::string& name, int64_t step, int64_t offset, const void* data,
                  int64_t count) {
  const size_t esize = transport::dtype_bytes(registration(name).grad_dtype);
  const auto* bytes = static_cast<const std::byte*>(data);
  for_each_piece(name, offset, count, [&](int64_t pos, int64_t packed, int64_t n) {
    window_.push_frames +=
        owner(name).push(name, step, packed, bytes + (pos - offset) * static_cast<int64_t>(esize),
                         n, esize, transport::ChunkKind::gradient);
  });
}

void Client::check_packed(const std::string& name, int64_t packed, int64_t count) {
  const auto& set = push_set(name);
  if (count < 0 || packed < 0 || packed > set.elements() - count) {
    throw InvalidArgument("parameter '" + name + "': packed elements [" + std::to_string(packed) +
                          ", " + std::to_string(packed + count) + ") are not inside the " +
                          std::to_string(set.elements()) + " elements this rank pushes");
  }
  window_.bytes_pushed +=
      count * static_cast<int64_t>(transport::dtype_bytes(registration(name).grad_dtype));
}

void Client::push_packed(const std::string& name, int64_t step, int64_t packed, const void* data,
                         int64_t count) {
  check_packed(name, packed, count);
  if (count == 0) return;
  const size_t esize = transport::dtype_bytes(registration(name).grad_dtype);
  window_.push_frames += owner(name).push(name, step, packed, static_cast<const std::byte*>(data),
                                          count, esize, transport::ChunkKind::gradient);
}

namespace {

// A device push over host shared memory is staged through the host: `count` elements of
// `esize` bytes copied from device memory (ordered after `stream`).
std::vector<std::byte> staged_on_host(const void* device_data, int64_t count, size_t esize,
                                      StreamHandle stream) {
  std::vector<std::byte> host(static_cast<size_t>(std::max<int64_t>(count, 0)) * esize);
  copy_device_to_host(host.data(), device_data, host.size(), stream);
  return host;
}

}  // namespace

void Client::push_device(const std::string& name, int64_t step, int64_t offset,
                         const void* device_data, int64_t count, StreamHandle stream) {
  const size_t esize = transport::dtype_bytes(registration(name).grad_dtype);
  Connection& c = owner(name);
  if (count > 0) require_device_memory(device_data, "push_device of '" + name + "'");
  if (c.data_plane() == transport::DataPlane::shm) {
    const auto host = staged_on_host(device_data, count, esize, stream);
    push(name, step, offset, host.data(), count);
    return;
  }
  const auto* bytes = static_cast<const std::byte*>(device_data);
  for_each_piece(name, offset, count, [&](int64_t pos, int64_t packed, int64_t n) {
    window_.push_frames +=
        c.push_device(name, step, packed, bytes + (pos - offset) * static_cast<int64_t>(esize), n,
                      esize, transport::ChunkKind::gradient, stream);
  });
}

void Client::push_packed_device(const std::string& name, int64_t step, int64_t packed,
                                const void* device_data, int64_t count, StreamHandle stream) {
  const size_t esize = transport::dtype_bytes(registration(name).grad_dtype);
  Connection& c = owner(name);
  if (count > 0) require_device_memory(device_data, "push_device of '" + name + "'");
  if (c.data_plane() == transport::DataPlane::shm) {
    const auto host = staged_on_host(device_data, count, esize, stream);
    push_packed(name, step, packed, host.data(), count);
    return;
  }
  check_packed(name, packed, count);
  if (count == 0) return;
  window_.push_frames +=
      c.push_device(name, step, packed, static_cast<const std::byte*>(device_data), count, esize,
                    transport::ChunkKind::gradient, stream);
}

StreamHandle Client::push_stream(const std::string& name) {
  return owner(name).push_stream();
}

void Client::commit(const std::string& name, int64_t step) {
  owner(name).commit(name, step);
}

void Client::flush() {
  for (size_t i = 0; i < connections_.size(); ++i) {
    if (connections_[i] && !left_behind(i)) connections_[i]->flush();
  }
}

bool Client::wait_update(const std::string& name, int64_t step, void* dst) {
  return timed_wait(name, step, [&](Connection& c) {
    return c.wait_update(name, step, static_cast<std::byte*>(dst));
  });
}

size_t Client::want_bytes(const ParameterRegistration& reg) const {
  int64_t want = 0;
  for (const auto& r : reg.want) want += r.size();
  return static_cast<size_t>(want) * transport::dtype_bytes(reg.update_dtype);
}

bool Client::wait_update_device(const std::string& name, int64_t step, void* device_dst,
                                StreamHandle stream) {
  const size_t bytes = want_bytes(registration(name));
  // Checked before anything is taken: a failure here leaves the update held.
  if (bytes > 0) require_device_memory(device_dst, "wait_update_device of '" + name + "'");
  if (owner(name).data_plane() != transport::DataPlane::shm) {
    return timed_wait(name, step, [&](Connection& c) {
      return c.wait_update_device(name, step, static_cast<std::byte*>(device_dst), stream);
    });
  }
  // Host shared memory: the staging buffer outlives the copy (copy_host_to_device waits).
  std::vector<std::byte> host(bytes);
  const bool applied = wait_update(name, step, host.data());
  copy_host_to_device(device_dst, host.data(), bytes, stream);
  return applied;
}

bool Client::timed_wait(const std::string& name, int64_t step,
                        const std::function<bool(Connection&)>& wait) {
  using std::chrono::steady_clock;
  Connection& c = owner(name);
  const auto t0 = steady_clock::now();
  bool applied = false;
  try {
    applied = wait(c);
  } catch (...) {
    window_.exposed_wait_s += std::chrono::duration<double>(steady_clock::now() - t0).count();
    throw;
  }
  const auto t1 = steady_clock::now();
  window_.exposed_wait_s += std::chrono::duration<double>(t1 - t0).count();
  ++window_.parameters;
  // When the update completed: as the reader thread recorded it, or (its callback not run yet)
  // no later than now.
  auto arrived = t1;
  {
    std::lock_guard lk(callback_mu_);
    const auto key = std::make_pair(name, step);
    if (auto it = arrivals_.find(key); it != arrivals_.end()) arrived = std::min(it->second, t1);
    // This step and the earlier ones of the parameter are taken.
    auto first = arrivals_.lower_bound({name, INT64_MIN});
    arrivals_.erase(first, arrivals_.upper_bound(key));
  }
  if (window_.slowest_parameter.empty() || arrived >= latest_arrival_) {
    latest_arrival_ = arrived;
    window_.slowest_parameter = name;
  }
  return applied;
}

StepStats Client::report_step(int64_t step) {
  StepStats stats = std::move(window_);
  stats.step = step;
  window_ = StepStats{};
  latest_arrival_ = {};
  transport::StepReport r;
  r.step = step;
  r.exposed_wait_ns = static_cast<int64_t>(stats.exposed_wait_s * 1e9);
  r.bytes_pushed = stats.bytes_pushed;
  r.parameters = stats.parameters;
  r.slowest_parameter = stats.slowest_parameter;
  last_stats_ = stats;
  for (size_t i = 0; i < connections_.size(); ++i) {
    if (connections_[i] && !left_behind(i)) connections_[i]->send_step_report(r);
  }
  return stats;
}

bool Client::update_ready(const std::string& name, int64_t step) {
  return owner(name).update_ready(name, step);
}

UpdateState Client::update_state(const std::string& name, int64_t step) {
  return owner(name).update_state(name, step);
}

void Client::set_update_callback(UpdateCallback cb) {
  std::lock_guard lk(callback_mu_);
  callback_ = std::move(cb);
}

std::vector<float> Client::fetch_momentum(const std::string& name, int64_t* last_step,
                                          int64_t after_step) {
  const auto& reg = registration(name);
  int64_t numel = 1;
  for (auto d : reg.shape) numel *= d;
  return owner(name).fetch_momentum(name, numel, last_step, after_step);
}

void Client::load_momentum(const std::string& name, int64_t step, const float* values) {
  const auto& reg = registration(name);
  int64_t numel = 1;
  for (auto d : reg.shape) numel *= d;
  // Momentum is fp32 whatever the gradient dtype: it travels as fp32 chunks.
  owner(name).push(name, step, 0, reinterpret_cast<const std::byte*>(values), numel, 4,
                   transport::ChunkKind::momentum);
}

std::string Client::snapshot(int server, const std::string& path) {
  return connection(static_cast<size_t>(server)).snapshot(path);
}

transport::HealthOk Client::health(int server) {
  return connection(static_cast<size_t>(server)).health();
}

std::optional<std::pair<int, std::string>> Client::lost_peer() {
  std::optional<std::pair<int, std::string>> first;
  for (auto& c : connections_) {
    if (!c) continue;
    for (auto& [rank, what] : c->lost_peers()) {
      if (!first || rank < first->first) first.emplace(rank, what);
    }
  }
  return first;
}

Client::ServerSurvival Client::survival(int server) {
  if (server < 0 || server >= static_cast<int>(connections_.size())) {
    throw InvalidArgument("server index " + std::to_string(server) + " but " +
                          std::to_string(connections_.size()) + " server(s) configured");
  }
  ServerSurvival out;
  if (auto& c = connections_[static_cast<size_t>(server)]) {
    out.lost = !c->lost_reason().empty();
    out.snapshot = c->snapshot_config();
  }
  return out;
}

void Client::reconnect() {
  connections_.clear();
  resolve_endpoint_settings();
  connections_.resize(config_.servers.size());
  if (!lazy_) {
    for (size_t i = 0; i < connections_.size(); ++i) connection(i);
  }
  std::vector<ParameterRegistration> all;
  for (const auto& [name, p] : params_) all.push_back(p);
  register_parameters(all);
}

}  // namespace muon::client

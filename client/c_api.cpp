// The C ABI of client/muon_client.h over muon::client::Client.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "client/c_abi_args.hpp"
#include "client/c_abi_status.hpp"
#include "client/client.hpp"
#include "client/cuda_runtime_loader.hpp"
#include "client/device_copy.hpp"
#include "client/muon_client.h"
#include "core/error_code.hpp"
#include "daemon/socket_path.hpp"
#include "kernels/muon_option_fields.hpp"

struct muon_client {
  std::unique_ptr<muon::client::Client> impl;
};

namespace {

using muon::capi::dims;
using muon::capi::options;
using muon::capi::ranges;

thread_local muon::capi::CAbiStatus g_last;

// Runs `f` with this library's last-failure record (client/c_abi_status.hpp).
template <class F>
int guarded(F&& f) {
  return muon::capi::guarded(g_last, std::forward<F>(f));
}

// InvalidArgument unless dst_bytes is the parameter's packed want ranges in the update dtype.
void check_update_bytes(muon_client& c, const char* name, int64_t dst_bytes) {
  const auto& reg = c.impl->registration(name);
  int64_t want = 0;
  for (const auto& r : reg.want) want += r.size();
  const int64_t need = want * static_cast<int64_t>(muon::transport::dtype_bytes(reg.update_dtype));
  if (dst_bytes != need) {
    throw muon::InvalidArgument("parameter '" + std::string(name) + "': update buffer of " +
                                std::to_string(dst_bytes) + " bytes, need " + std::to_string(need));
  }
}

}  // namespace

extern "C" {

const char* muon_last_error(void) {
  return g_last.message.c_str();
}

int muon_last_error_code(void) {
  return static_cast<int>(g_last.code);
}

const char* muon_last_error_param(void) {
  return g_last.param.c_str();
}

int64_t muon_last_error_step(void) {
  return g_last.step;
}

int muon_last_error_rank(void) {
  return g_last.rank;
}

const char* muon_error_code_name(int code) {
  const auto c = muon::error_code_from_int(code);
  return c ? muon::error_code_name(*c).data() : nullptr;
}

const char* muon_options_schema(void) {
  static const std::string schema = muon::options_schema_json();
  return schema.c_str();
}

const char* muon_default_socket_path(void) {
  thread_local std::string path;
  path = muon::daemon::default_socket_path();
  return path.c_str();
}

int muon_client_create(const char* const* servers, int n_servers, int rank, int world_size,
                       const char* name, int64_t connect_timeout_ms, int64_t op_timeout_ms,
                       muon_client** out) {
  return muon_client_create_ex(servers, n_servers, rank, world_size, name, connect_timeout_ms,
                               op_timeout_ms, nullptr, out);
}

int muon_client_has_cuda(void) {
  return muon::client::built_with_cuda() ? 1 : 0;
}

const char* muon_client_cuda_runtime(void) {
  static const std::string origin = muon::client::cuda_runtime_origin();
  g_last = {};
  if (origin.empty()) {
    g_last.fail(MUON_ERR_UNAVAILABLE, muon::ErrorCode::unavailable,
                muon::client::cuda_runtime_failure());
  }
  return origin.c_str();
}

int muon_client_create_ex(const char* const* servers, int n_servers, int rank, int world_size,
                          const char* name, int64_t connect_timeout_ms, int64_t op_timeout_ms,
                          const char* data_plane, muon_client** out) {
  return muon_client_create_auth(servers, n_servers, rank, world_size, name, connect_timeout_ms,
                                 op_timeout_ms, data_plane, nullptr, out);
}

int muon_client_create_auth(const char* const* servers, int n_servers, int rank, int world_size,
                            const char* name, int64_t connect_timeout_ms, int64_t op_timeout_ms,
                            const char* data_plane, const char* auth_token, muon_client** out) {
  return guarded([&] {
    if (!out || !servers || n_servers < 1)
      throw muon::InvalidArgument("muon_client_create: no server");
    muon::client::ClientConfig cfg;
    for (int i = 0; i < n_servers; ++i) cfg.servers.emplace_back(servers[i]);
    cfg.rank = rank;
    cfg.world_size = world_size;
    cfg.name = name ? name : "";
    if (connect_timeout_ms > 0) cfg.connect_timeout = std::chrono::milliseconds(connect_timeout_ms);
    if (op_timeout_ms > 0) cfg.op_timeout = std::chrono::milliseconds(op_timeout_ms);
    if (data_plane && *data_plane) cfg.data_plane = muon::transport::parse_data_plane(data_plane);
    if (auth_token) cfg.auth_token = auth_token;
    auto c = std::make_unique<muon_client>();
    c->impl = std::make_unique<muon::client::Client>(std::move(cfg));
    *out = c.release();
    return MUON_OK;
  });
}

void muon_client_destroy(muon_client* c) {
  delete c;
}

int muon_client_set_job(muon_client* c, const char* job, int resume) {
  return guarded([&] {
    if (!c) throw muon::InvalidArgument("muon_client_set_job: null client");
    c->impl->set_job(job ? job : "", resume != 0);
    return MUON_OK;
  });
}

int muon_client_register(muon_client* c, const char* name, const int64_t* shape, int ndim,
                         const char* grad_dtype, const char* update_dtype, const char* options_json,
                         const int64_t* push_ranges, int n_push, const int64_t* want_ranges,
                         int n_want, int server) {
  return guarded([&] {
    if (!c || !name) throw muon::InvalidArgument("muon_client_register: null argument");
    muon::client::ParameterRegistration r;
    r.name = name;
    r.shape = dims(shape, ndim);
    r.grad_dtype = muon::transport::parse_dtype(grad_dtype ? grad_dtype : "f32");
    r.update_dtype = muon::transport::parse_dtype(update_dtype ? update_dtype : "f32");
    r.options = options(options_json);
    r.push = ranges(push_ranges, n_push, "push ranges");
    r.want = ranges(want_ranges, n_want, "want ranges");
    r.server = server;
    c->impl->register_parameters({r});
    return MUON_OK;
  });
}

int muon_client_push(muon_client* c, const char* name, int64_t step, int64_t offset,
                     const void* data, int64_t count) {
  return guarded([&] {
    if (!c || !name || (count > 0 && !data))
      throw muon::InvalidArgument("muon_client_push: null argument");
    c->impl->push(name, step, offset, data, count);
    return MUON_OK;
  });
}

int muon_client_push_device(muon_client* c, const char* name, int64_t step, int64_t offset,
                            const void* device_ptr, int64_t count, void* cuda_stream) {
  return guarded([&] {
    if (!c || !name || (count > 0 && !device_ptr))
      throw muon::InvalidArgument("muon_client_push_device: null argument");
    c->impl->push_device(name, step, offset, device_ptr, count,
                         static_cast<muon::StreamHandle>(cuda_stream));
    return MUON_OK;
  });
}

int muon_client_push_packed(muon_client* c, const char* name, int64_t step, int64_t packed,
                            const void* data, int64_t count) {
  return guarded([&] {
    if (!c || !name || (count > 0 && !data))
      throw muon::InvalidArgument("muon_client_push_packed: null argument");
    c->impl->push_packed(name, step, packed, data, count);
    return MUON_OK;
  });
}

int muon_client_push_packed_device(muon_client* c, const char* name, int64_t step, int64_t packed,
                                   const void* device_ptr, int64_t count, void* cuda_stream) {
  return guarded([&] {
    if (!c || !name || (count > 0 && !device_ptr))
      throw muon::InvalidArgument("muon_client_push_packed_device: null argument");
    c->impl->push_packed_device(name, step, packed, device_ptr, count,
                                static_cast<muon::StreamHandle>(cuda_stream));
    return MUON_OK;
  });
}

int muon_client_push_stream(muon_client* c, const char* name, void** cuda_stream) {
  return guarded([&] {
    if (!c || !name || !cuda_stream)
      throw muon::InvalidArgument("muon_client_push_stream: null argument");
    *cuda_stream = c->impl->push_stream(name);
    return MUON_OK;
  });
}

int muon_client_commit(muon_client* c, const char* name, int64_t step) {
  return guarded([&] {
    if (!c || !name) throw muon::InvalidArgument("muon_client_commit: null argument");
    c->impl->commit(name, step);
    return MUON_OK;
  });
}

int muon_client_wait_update(muon_client* c, const char* name, int64_t step, void* dst,
                            int64_t dst_bytes, int* applied) {
  return guarded([&] {
    if (!c || !name || !dst) throw muon::InvalidArgument("muon_client_wait_update: null argument");
    check_update_bytes(*c, name, dst_bytes);
    const bool ok = c->impl->wait_update(name, step, dst);
    if (applied) *applied = ok ? 1 : 0;
    return MUON_OK;
  });
}

int muon_client_wait_update_device(muon_client* c, const char* name, int64_t step, void* device_dst,
                                   int64_t dst_bytes, void* cuda_stream, int* applied) {
  return guarded([&] {
    if (!c || !name || !device_dst)
      throw muon::InvalidArgument("muon_client_wait_update_device: null argument");
    check_update_bytes(*c, name, dst_bytes);
    const bool ok = c->impl->wait_update_device(name, step, device_dst,
                                                static_cast<muon::StreamHandle>(cuda_stream));
    if (applied) *applied = ok ? 1 : 0;
    return MUON_OK;
  });
}

int muon_client_update_ready(muon_client* c, const char* name, int64_t step) {
  return guarded([&] { return c->impl->update_ready(name, step) ? 1 : 0; });
}

int muon_client_update_state(muon_client* c, const char* name, int64_t step) {
  return guarded([&] { return static_cast<int>(c->impl->update_state(name, step)); });
}

int muon_client_fetch_momentum(muon_client* c, const char* name, float* dst, int64_t numel,
                               int64_t* last_step) {
  return muon_client_fetch_momentum_after(c, name, -1, dst, numel, last_step);
}

int muon_client_fetch_momentum_after(muon_client* c, const char* name, int64_t after_step,
                                     float* dst, int64_t numel, int64_t* last_step) {
  return guarded([&] {
    auto m = c->impl->fetch_momentum(name, last_step, after_step);
    if (static_cast<int64_t>(m.size()) != numel) {
      throw muon::InvalidArgument("parameter '" + std::string(name) + "' has " +
                                  std::to_string(m.size()) + " elements, buffer holds " +
                                  std::to_string(numel));
    }
    std::memcpy(dst, m.data(), m.size() * sizeof(float));
    return MUON_OK;
  });
}

int muon_client_load_momentum(muon_client* c, const char* name, int64_t step, const float* src,
                              int64_t numel) {
  return guarded([&] {
    const auto& reg = c->impl->registration(name);
    int64_t n = 1;
    for (auto d : reg.shape) n *= d;
    if (n != numel) {
      throw muon::InvalidArgument("parameter '" + std::string(name) + "' has " + std::to_string(n) +
                                  " elements, got " + std::to_string(numel));
    }
    c->impl->load_momentum(name, step, src);
    return MUON_OK;
  });
}

int muon_client_snapshot(muon_client* c, int server, const char* path) {
  return guarded([&] {
    c->impl->snapshot(server, path ? path : "");
    return MUON_OK;
  });
}

int muon_client_lost_peer(muon_client* c, int* rank, char* message, int64_t message_len) {
  return guarded([&] {
    if (!c || !rank) throw muon::InvalidArgument("muon_client_lost_peer: null client or rank");
    const auto lost = c->impl->lost_peer();
    *rank = lost ? lost->first : -1;
    if (message && message_len > 0) {
      const std::string text = lost ? lost->second : "";
      const size_t n = std::min(text.size(), static_cast<size_t>(message_len - 1));
      std::memcpy(message, text.data(), n);
      message[n] = '\0';
    }
    return MUON_OK;
  });
}

int muon_client_snapshot_config(muon_client* c, int server, char* path, int64_t path_len,
                                int64_t* every, int* lost) {
  return guarded([&] {
    if (!c || !every || !lost) {
      throw muon::InvalidArgument("muon_client_snapshot_config: null client, every or lost");
    }
    const auto s = c->impl->survival(server);
    *lost = s.lost ? 1 : 0;
    *every = s.snapshot ? s.snapshot->second : -1;
    if (path && path_len > 0) {
      const std::string text = s.snapshot ? s.snapshot->first : "";
      const size_t n = std::min(text.size(), static_cast<size_t>(path_len - 1));
      std::memcpy(path, text.data(), n);
      path[n] = '\0';
    }
    return MUON_OK;
  });
}

int muon_client_reconnect(muon_client* c) {
  return guarded([&] {
    c->impl->reconnect();
    return MUON_OK;
  });
}

int muon_client_report_step(muon_client* c, int64_t step, double* exposed_wait_s,
                            int64_t* bytes_pushed, int* parameters, char* slowest,
                            int64_t slowest_len) {
  return guarded([&] {
    if (!c) throw muon::InvalidArgument("muon_client_report_step: null client");
    const auto stats = c->impl->report_step(step);
    if (exposed_wait_s) *exposed_wait_s = stats.exposed_wait_s;
    if (bytes_pushed) *bytes_pushed = stats.bytes_pushed;
    if (parameters) *parameters = stats.parameters;
    if (slowest && slowest_len > 0) {
      const size_t n =
          std::min(stats.slowest_parameter.size(), static_cast<size_t>(slowest_len - 1));
      std::memcpy(slowest, stats.slowest_parameter.data(), n);
      slowest[n] = '\0';
    }
    return MUON_OK;
  });
}

int muon_client_last_push_frames(muon_client* c, int64_t* push_frames) {
  return guarded([&] {
    if (!c || !push_frames) throw muon::InvalidArgument("muon_client_last_push_frames: null argument");
    *push_frames = c->impl->last_step_stats().push_frames;
    return MUON_OK;
  });
}

}  // extern "C"

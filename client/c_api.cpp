// The C ABI of client/muon_client.h over muon::client::Client.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "client/client.hpp"
#include "client/device_copy.hpp"
#include "client/muon_client.h"
#include "core/error_code.hpp"
#include "kernels/muon_option_fields.hpp"
#include "kernels/backend.hpp"

struct muon_client {
  std::unique_ptr<muon::client::Client> impl;
};

namespace {

using muon::ErrorCode;

thread_local std::string g_last_error;
thread_local ErrorCode g_last_code = ErrorCode::none;

int fail(int status, ErrorCode code, const std::string& message) {
  g_last_error = message;
  g_last_code = code;
  return status;
}

// Runs `f`, mapping exceptions to a MUON_ERR_* status, an ErrorCode and a message.
template <class F>
int guarded(F&& f) {
  try {
    g_last_error.clear();
    g_last_code = ErrorCode::none;
    return f();
  } catch (const muon::client::ServerError& e) {
    switch (e.code) {
      case ErrorCode::non_finite:
        return fail(MUON_ERR_NONFINITE, e.code, e.what());
      case ErrorCode::peer_lost:
        return fail(MUON_ERR_PEER_LOST, e.code, e.what());
      case ErrorCode::timeout:
        return fail(MUON_ERR_TIMEOUT, e.code, e.what());
      default:
        // The code's name also travels in the message, for callers that read it from there.
        return fail(MUON_ERR_SERVER, e.code,
                    std::string(e.what()) + " (server error code: " +
                        std::string(muon::error_code_name(e.code)) + ")");
    }
  } catch (const muon::client::ConnectionLost& e) {
    return fail(MUON_ERR_CONNECTION, ErrorCode::connection_lost, e.what());
  } catch (const muon::client::Timeout& e) {
    return fail(MUON_ERR_TIMEOUT, ErrorCode::timeout, e.what());
  } catch (const muon::NonFiniteError& e) {
    return fail(MUON_ERR_NONFINITE, ErrorCode::non_finite, e.what());
  } catch (const muon::InvalidArgument& e) {
    return fail(MUON_ERR_INVALID, ErrorCode::invalid_argument, e.what());
  } catch (const muon::DeviceError& e) {
    return fail(MUON_ERR_DEVICE, ErrorCode::device, e.what());
  } catch (const muon::BackendUnavailable& e) {
    return fail(MUON_ERR_UNAVAILABLE, ErrorCode::unavailable, e.what());
  } catch (const std::exception& e) {
    return fail(MUON_ERR_INTERNAL, ErrorCode::internal, e.what());
  }
}

std::vector<muon::transport::Range> ranges(const int64_t* flat, int n, const char* what) {
  if (n < 0 || (n > 0 && flat == nullptr)) {
    throw muon::InvalidArgument(std::string(what) + ": bad range array");
  }
  std::vector<muon::transport::Range> out;
  for (int i = 0; i < n; ++i) out.push_back({flat[2 * i], flat[2 * i + 1]});
  return out;
}

// The caller's options over the defaults (missing fields keep them, unknown ones are refused):
// kernels/muon_option_fields.hpp.
muon::MuonOptions options(const char* json_text) {
  using nlohmann::json;
  if (!json_text || !*json_text) return {};
  json user;
  try {
    user = json::parse(json_text);
  } catch (const json::exception& e) {
    throw muon::InvalidArgument(std::string("options are not valid JSON: ") + e.what());
  }
  return muon::options_from_json_object(user, muon::OptionKeys::overrides);
}

std::vector<int64_t> dims(const int64_t* shape, int ndim) {
  if (ndim < 0 || ndim > 8 || (ndim > 0 && !shape)) throw muon::InvalidArgument("bad shape array");
  return std::vector<int64_t>(shape, shape + ndim);
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
  return g_last_error.c_str();
}

int muon_last_error_code(void) {
  return static_cast<int>(g_last_code);
}

const char* muon_error_code_name(int code) {
  const auto c = muon::error_code_from_int(code);
  return c ? muon::error_code_name(*c).data() : nullptr;
}

const char* muon_options_schema(void) {
  static const std::string schema = muon::options_schema_json();
  return schema.c_str();
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

int muon_client_fetch_momentum(muon_client* c, const char* name, float* dst, int64_t numel,
                               int64_t* last_step) {
  return guarded([&] {
    auto m = c->impl->fetch_momentum(name, last_step);
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

int muon_local_update(const char* name, const int64_t* shape, int ndim, const char* options_json,
                      const float* grad, float* momentum, float* update, int threads) {
  return guarded([&] {
    thread_local std::unique_ptr<muon::Backend> backend;
    thread_local int backend_threads = -1;
    if (!backend || backend_threads != threads) {
      muon::BackendConfig bc;
      bc.cpu_threads = threads;
      backend = muon::make_backend("cpu", bc);
      backend_threads = threads;
    }
    const std::string n = name ? name : "?";
    const auto s = muon::matrix_shape_from_dims(dims(shape, ndim), n);
    const bool applied = backend->muon_update(n, s, grad, momentum, update, options(options_json));
    return applied ? 0 : 1;
  });
}

}  // extern "C"

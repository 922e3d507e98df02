// Shared by the client-facing tests (tests/daemon/test_client_api.cpp, tests/client): one-parameter
// registrations, configs, gradients and the in-process reference (CPU backend, the server's
// thread count).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/client.hpp"
#include "kernels/backend.hpp"
#include "scenario.hpp"
#include "server_process.hpp"

namespace muon::testing {

inline client::ParameterRegistration one_param(const std::string& name, std::vector<int64_t> shape,
                                               transport::DType grad = transport::DType::f32,
                                               transport::DType update = transport::DType::f32) {
  client::ParameterRegistration r;
  r.name = name;
  r.shape = shape;
  int64_t n = 1;
  for (auto d : shape) n *= d;
  r.push = {{0, n}};
  r.want = {{0, n}};
  r.grad_dtype = grad;
  r.update_dtype = update;
  r.options.momentum.mu = 0.9f;
  return r;
}

inline client::ClientConfig config_for(const std::string& socket,
                                       transport::DataPlane plane = transport::DataPlane::shm,
                                       int rank = 0, int world_size = 1) {
  client::ClientConfig cfg;
  cfg.servers = {socket};
  cfg.rank = rank;
  cfg.world_size = world_size;
  cfg.connect_timeout = std::chrono::milliseconds(5000);
  cfg.op_timeout = std::chrono::milliseconds(20000);
  cfg.data_plane = plane;
  return cfg;
}

inline std::vector<float> gradient(int64_t n, int64_t step, int rank = 0, int pi = 0) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) g[i] = grad_value(pi, step, rank, i);
  return g;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// One step of `name` through `c`: pushes g whole, commits, waits; returns the update.
inline std::vector<float> run_step(client::Client& c, const std::string& name, int64_t step,
                                   const std::vector<float>& g) {
  c.push(name, step, 0, g.data(), static_cast<int64_t>(g.size()));
  c.commit(name, step);
  std::vector<float> u(g.size());
  c.wait_update(name, step, u.data());
  return u;
}

// Registers `name` (one_param, `shape`) through `c` and runs steps 0 and 1 of gradient(),
// expecting each update applied; returns the two updates.
inline std::vector<std::vector<float>> two_steps(client::Client& c, const std::string& name,
                                                 std::vector<int64_t> shape) {
  c.register_parameters({one_param(name, shape)});
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<std::vector<float>> out;
  for (int64_t step = 0; step < 2; ++step) {
    const auto g = gradient(n, step);
    c.push(name, step, 0, g.data(), n);
    c.commit(name, step);
    std::vector<float> u(static_cast<size_t>(n));
    EXPECT_TRUE(c.wait_update(name, step, u.data()));
    out.push_back(std::move(u));
  }
  return out;
}

// Momentum and update per step with the CPU backend (one rank).
struct Reference {
  explicit Reference(const client::ParameterRegistration& r) : reg(r) {
    BackendConfig bc;
    bc.cpu_threads = kThreads;
    backend = make_backend("cpu", bc);
    shape = matrix_shape_from_dims(r.shape, r.name);
    momentum.assign(static_cast<size_t>(shape.numel()), 0.0f);
  }
  std::vector<float> step(const std::vector<float>& g) {
    std::vector<float> u(g.size());
    backend->muon_update(reg.name, shape, g.data(), momentum.data(), u.data(), reg.options);
    return u;
  }
  client::ParameterRegistration reg;
  std::unique_ptr<Backend> backend;
  MatrixShape shape;
  std::vector<float> momentum;
};

}  // namespace muon::testing

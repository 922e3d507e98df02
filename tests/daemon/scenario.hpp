// A deterministic training scenario shared by the test client processes and the test driver:
// which parameters exist, how each rank shards them, and the gradient every rank pushes at every
// step. The driver recomputes the expected updates in process with the same kernels and compares
// them bitwise with what the clients received from the server.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "client/client.hpp"
#include "kernels/backend.hpp"

namespace muon::testing {

struct ScenarioParam {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<int64_t> row_splits;
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

/// GPT-like set: a wide and a tall matrix, an expert stack and a fused QKV with row splits.
inline std::vector<ScenarioParam> scenario_params() {
  return {{"blocks.0.mlp.w1", {64, 96}, {}},
          {"blocks.0.mlp.w2", {96, 64}, {}},
          {"blocks.0.moe.experts", {3, 32, 40}, {}},
          {"blocks.0.attn.qkv", {96, 32}, {32, 32, 32}}};
}

inline MuonOptions scenario_options(const ScenarioParam& p) {
  MuonOptions o;
  o.momentum.mu = 0.9f;
  o.orthogonalize.row_splits = p.row_splits;
  return o;
}

/// The element ranges rank `rank` of `world` pushes for a parameter under a sharding mode:
///   replicated   every rank pushes everything (data parallel: world contributors per element)
///   rows         contiguous row blocks, one per rank (uneven when rows % world != 0)
///   flat_uneven  flat ranges with uneven cut points; rank 0 gets the smallest piece
///   empty        rank 0 pushes nothing; the others split the elements (needs world >= 2)
///   halves       two contributors per element: each element pushed by ranks r and r+1 (mod w)
inline std::vector<transport::Range> push_ranges(const std::string& mode, const ScenarioParam& p,
                                                 int rank, int world) {
  const int64_t n = p.numel();
  auto cut = [&](const std::vector<double>& fractions) {
    std::vector<int64_t> points{0};
    double acc = 0;
    for (double f : fractions) {
      acc += f;
      points.push_back(std::min(n, static_cast<int64_t>(acc * static_cast<double>(n))));
    }
    points.back() = n;
    return points;
  };
  if (mode == "replicated") return {{0, n}};
  if (mode == "rows" || mode == "flat_uneven" || mode == "empty") {
    std::vector<double> f;
    int parts = world;
    int first = 0;
    if (mode == "empty") {
      if (world < 2) return {{0, n}};
      if (rank == 0) return {};
      parts = world - 1;
      first = 1;
    }
    for (int i = 0; i < parts; ++i) {
      f.push_back(mode == "flat_uneven" ? (i + 1.0) / (parts * (parts + 1) / 2.0) : 1.0 / parts);
    }
    auto pts = cut(f);
    if (mode == "rows") {
      const int64_t row = p.shape.back();
      for (auto& x : pts) x = (x / row) * row;
      pts.back() = n;
    }
    const int i = rank - first;
    if (pts[i] == pts[i + 1]) return {};
    return {{pts[i], pts[i + 1]}};
  }
  if (mode == "halves") {
    if (world < 2) return {{0, n}};
    auto pts = cut(std::vector<double>(world, 1.0 / world));
    std::vector<transport::Range> out;
    for (int b : {rank, (rank + world - 1) % world}) {
      if (pts[b] < pts[b + 1]) out.push_back({pts[b], pts[b + 1]});
    }
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
    return out;
  }
  throw std::invalid_argument("unknown sharding mode " + mode);
}

/// Gradient value that rank `rank` pushes for element `i` of parameter `pi` at `step`:
/// a hash mapped to [-1, 1), scaled differently per parameter.
inline float grad_value(int pi, int64_t step, int rank, int64_t i) {
  uint64_t x = (static_cast<uint64_t>(pi) * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(step + 1) * 0xBF58476D1CE4E5B9ull) ^
               (static_cast<uint64_t>(rank + 7) * 0x94D049BB133111EBull) ^ static_cast<uint64_t>(i);
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  const float u = static_cast<float>(x >> 40) / static_cast<float>(1ull << 24);  // [0, 1)
  return (2.0f * u - 1.0f) * (1.0f + 0.5f * static_cast<float>(pi));
}

/// The reduced gradient the server must form: per element, the sum over contributing ranks in
/// ascending rank order, starting from -0 (the exact additive identity).
inline std::vector<float> reduced_gradient(const std::string& mode, int pi, const ScenarioParam& p,
                                           int64_t step, int world) {
  std::vector<float> g(static_cast<size_t>(p.numel()), -0.0f);  // as the server: -0 + x == x
  for (int r = 0; r < world; ++r) {
    for (const auto& range : push_ranges(mode, p, r, world)) {
      for (int64_t i = range.begin; i < range.end; ++i) g[i] += grad_value(pi, step, r, i);
    }
  }
  return g;
}

/// Expected updates for steps [0, steps): updates[step][param] (all elements), using the CPU
/// backend with `threads` OpenBLAS threads, the same as the server under test.
/// From `resize_at_step` on, the job has `world_after` ranks (a restart at another size).
inline std::vector<std::vector<std::vector<float>>> reference_updates(
    const std::string& mode, int world, int steps, int threads, int64_t resize_at_step = -1,
    int world_after = 0, const char* kind = "cpu") {
  BackendConfig bc;
  bc.cpu_threads = threads;
  auto backend = make_backend(kind, bc);
  const auto params = scenario_params();
  std::vector<std::vector<float>> momentum;
  for (const auto& p : params) momentum.emplace_back(static_cast<size_t>(p.numel()), 0.0f);
  std::vector<std::vector<std::vector<float>>> out(static_cast<size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    for (size_t pi = 0; pi < params.size(); ++pi) {
      const auto& p = params[pi];
      const int w = resize_at_step >= 0 && s >= resize_at_step ? world_after : world;
      auto g = reduced_gradient(mode, static_cast<int>(pi), p, s, w);
      std::vector<float> u(g.size());
      backend->muon_update(p.name, matrix_shape_from_dims(p.shape, p.name), g.data(),
                           momentum[pi].data(), u.data(), scenario_options(p));
      out[s].push_back(std::move(u));
    }
  }
  return out;
}

}  // namespace muon::testing

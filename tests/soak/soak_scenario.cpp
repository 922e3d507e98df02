#include "tests/soak/soak_scenario.hpp"

#include <xxhash.h>

#include "core/error.hpp"

namespace muon::soak {

std::vector<SoakParam> soak_params(const std::string& set) {
  if (set == "small") {
    return {{{"blocks.0.mlp.w1", {64, 96}, {}}, "replicated"},
            {{"blocks.0.mlp.w2", {96, 64}, {}}, "rows"},
            {{"blocks.0.moe.experts", {3, 32, 40}, {}}, "flat_uneven"},
            {{"blocks.0.attn.qkv", {96, 32}, {32, 32, 32}}, "halves"}};
  }
  if (set == "gpt2") {
    return {{{"h.0.attn.c_attn", {2304, 768}, {768, 768, 768}}, "rows"},
            {{"h.0.attn.c_proj", {768, 768}, {}}, "replicated"},
            {{"h.0.mlp.c_fc", {3072, 768}, {}}, "flat_uneven"},
            {{"h.0.mlp.c_proj", {768, 3072}, {}}, "halves"},
            {{"h.0.moe.experts", {4, 256, 768}, {}}, "replicated"}};
  }
  throw InvalidArgument("unknown soak parameter set '" + set + "' (expected small or gpt2)");
}

MuonOptions soak_options(const SoakParam& p) {
  MuonOptions o;
  o.momentum.mu = 0.9f;
  o.orthogonalize.row_splits = p.param.row_splits;
  return o;
}

uint64_t update_hash(const float* values, int64_t count) {
  return XXH3_64bits(values, static_cast<size_t>(count) * sizeof(float));
}

ReferenceRun::ReferenceRun(std::vector<SoakParam> params, int world, int threads)
    : params_(std::move(params)), world_(world) {
  BackendConfig bc;
  bc.cpu_threads = threads;
  backend_ = make_backend("cpu", bc);
  for (const auto& p : params_) momentum_.emplace_back(static_cast<size_t>(p.param.numel()), 0.0f);
}

std::vector<uint64_t> ReferenceRun::next_step() {
  std::vector<uint64_t> hashes;
  for (size_t pi = 0; pi < params_.size(); ++pi) {
    const auto& p = params_[pi];
    const auto g =
        testing::reduced_gradient(p.sharding, static_cast<int>(pi), p.param, steps_done_, world_);
    update_.resize(g.size());
    backend_->muon_update(p.param.name, matrix_shape_from_dims(p.param.shape, p.param.name),
                          g.data(), momentum_[pi].data(), update_.data(), soak_options(p));
    hashes.push_back(update_hash(update_.data(), static_cast<int64_t>(update_.size())));
  }
  ++steps_done_;
  return hashes;
}

}  // namespace muon::soak

// The parameter shapes the benchmarks run on: GPT-2 small and Llama-3-8B, as the checkpoints
// store them (GPT-2: HF Conv1D [in, out]; Llama: [out, in]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace muon::bench {

struct ModelShape {
  const char* model;
  const char* param;
  int64_t rows;
  int64_t cols;
  bool large;  ///< Llama-3-8B: benchmark names start with "large/"
};

inline constexpr ModelShape kModelShapes[] = {
    {"gpt2", "attn.c_proj", 768, 768, false},
    {"gpt2", "attn.c_attn", 768, 2304, false},
    {"gpt2", "mlp.c_fc", 768, 3072, false},
    {"gpt2", "mlp.c_proj", 3072, 768, false},
    {"llama3_8b", "q_proj,o_proj", 4096, 4096, true},
    {"llama3_8b", "k_proj,v_proj", 1024, 4096, true},
    {"llama3_8b", "gate_proj,up_proj", 14336, 4096, true},
    {"llama3_8b", "down_proj", 4096, 14336, true},
};

/// One named Muon matrix of a model.
struct NamedMatrix {
  std::string name;
  int64_t rows, cols;
};

/// GPT-2 small (124M): 12 blocks x (attn.c_attn 768x2304, attn.c_proj 768x768, mlp.c_fc
/// 768x3072, mlp.c_proj 3072x768) = 48 Muon matrices, in backward order (last block first).
inline std::vector<NamedMatrix> gpt2_small_matrices() {
  std::vector<NamedMatrix> m;
  for (int b = 11; b >= 0; --b) {
    const std::string p = "h." + std::to_string(b) + ".";
    m.push_back({p + "mlp.c_proj", 3072, 768});
    m.push_back({p + "mlp.c_fc", 768, 3072});
    m.push_back({p + "attn.c_proj", 768, 768});
    m.push_back({p + "attn.c_attn", 768, 2304});
  }
  return m;
}

/// "gpt2 attn.c_proj": the benchmark label.
inline std::string shape_label(const ModelShape& s) {
  return std::string(s.model) + " " + s.param;
}

}  // namespace muon::bench

// The parameter shapes the benchmarks run on: GPT-2 small and Llama-3-8B, as the checkpoints
// store them (GPT-2: HF Conv1D [in, out]; Llama: [out, in]).
#pragma once

#include <cstdint>
#include <string>

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

/// "gpt2 attn.c_proj": the benchmark label.
inline std::string shape_label(const ModelShape& s) {
  return std::string(s.model) + " " + s.param;
}

}  // namespace muon::bench

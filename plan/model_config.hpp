// A model as the planner sees it (schema "muon-offload-model/1", files in configs/models/): the
// public hyperparameters, the matrices Muon updates and the tensors left to AdamW. Shapes are
// written as expressions over the hyperparameters, so each file shows how they are derived:
//
//   { "schema": "muon-offload-model/1",
//     "name": "Llama-3-8B",
//     "source": "https://huggingface.co/meta-llama/Meta-Llama-3-8B (config.json)",
//     "hyperparameters": { "hidden_size": 4096, "num_attention_heads": 32, ... },   // as published
//     "derived": { "head_dim": "hidden_size/num_attention_heads" },   // what the config implies
//     "active_experts": "num_experts_per_tok",            // MoE only: experts each token uses
//     "muon": [
//       { "name": "model.layers.{layer}.self_attn.q_proj.weight",
//         "shape": ["num_attention_heads*head_dim", "hidden_size"],
//         "layers": "num_hidden_layers" },
//       { "name": "model.layers.{layer}.mlp.experts.gate_proj.weight",
//         "shape": ["moe_intermediate_size", "hidden_size"], "batch": "num_experts",
//         "expert": true, "layers": "num_hidden_layers" },
//       { "name": "transformer.h.{layer}.attn.c_attn.weight", "shape": ["3*n_embd", "n_embd"],
//         "row_blocks": 3, "layers": "n_layer" } ],
//     "adamw": [ { "name": "model.embed_tokens.weight", "shape": ["vocab_size", "hidden_size"] },
//                ... ] }
//
// An expression is an integer, or a string of integers and hyperparameter names joined by '*'
// and '/' (left to right; a division must be exact). "layers" repeats an entry for
// layer = first_layer .. first_layer+layers-1 and requires "{layer}" in the name. Muon shapes are
// [rows, cols] in nn.Linear [out, in] orientation (the Newton-Schulz cost does not depend on it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace muon::plan {

/// One parameter registered with the offload servers: `batch` independent rows x cols matrices
/// (MoE experts stacked), each optionally split into `row_blocks` equal row blocks (fused QKV)
/// that are orthogonalized separately.
struct MuonMatrix {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t batch = 1;
  int64_t row_blocks = 1;
  bool expert = false;  ///< a routed expert batch: each token uses active_experts of `batch`

  int64_t elements() const { return batch * rows * cols; }
};

/// One tensor the trainer keeps under AdamW (embeddings, head, norms, biases, routers).
struct AdamwTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t elements() const;
};

struct ModelConfig {
  std::string name;
  std::string source;
  /// Integer hyperparameters and derived values (the names expressions may use); other values
  /// (floats, strings, lists) are kept as JSON text.
  std::map<std::string, int64_t> hyperparameters;
  std::map<std::string, std::string> other_hyperparameters;
  int64_t active_experts = 0;      ///< 0 for dense models
  std::vector<MuonMatrix> muon;    ///< expanded: one entry per layer
  std::vector<AdamwTensor> adamw;  ///< expanded: one entry per layer

  /// Elements of all Muon matrices.
  int64_t muon_params() const;
  int64_t adamw_params() const;
  int64_t total_params() const { return muon_params() + adamw_params(); }
  /// Parameters each token touches: all, except expert batches count active_experts/batch of
  /// their elements. The training-FLOP estimate is 6 x active_params() per token.
  int64_t active_params() const;
};

/// The schema string this reader accepts.
inline constexpr std::string_view kModelSchema = "muon-offload-model/1";

/// Parses a model description. `origin` prefixes errors. Throws InvalidArgument naming the line
/// and column (JSON syntax) or the field path ("muon[2].shape[0]") and the reason: an unknown
/// hyperparameter in an expression, an inexact division, a non-positive dimension, a row split
/// that does not divide the rows, "{layer}" without "layers" or the reverse, a duplicate name.
ModelConfig parse_model_config(std::string_view text, std::string_view origin = "model config");

/// Reads and parses a file. Throws InvalidArgument when it cannot be read or parsed.
ModelConfig load_model_config(const std::string& path);

/// Evaluates an expression string over integer hyperparameters (see the file comment); throws
/// InvalidArgument with `what` and the reason.
int64_t evaluate_expression(std::string_view expression,
                            const std::map<std::string, int64_t>& variables,
                            const std::string& what);

}  // namespace muon::plan

// Model configs (configs/models/*.json): shapes derived from the public hyperparameters, Muon
// parameter counts against the architecture guide's table, exact totals against the published
// parameter counts, and errors that name the field.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "plan/model_config.hpp"

using namespace muon;
using namespace muon::plan;

namespace {

ModelConfig model(const std::string& file) {
  return load_model_config(std::string(MUON_MODEL_CONFIGS) + "/" + file);
}

const MuonMatrix& find(const ModelConfig& m, const std::string& name) {
  for (const auto& x : m.muon) {
    if (x.name == name) return x;
  }
  throw std::runtime_error("no matrix " + name);
}

void expect_config_error(const std::string& text, const std::string& needle) {
  try {
    parse_model_config(text, "m.json");
    FAIL() << "expected an error mentioning: " << needle;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

std::string config_with(const std::string& muon, const std::string& extra = "") {
  return R"({"schema": "muon-offload-model/1", "name": "t",
             "hyperparameters": {"hidden": 64, "heads": 4, "layers": 2}, )" +
         extra + R"("muon": [)" + muon + "]}";
}

}  // namespace

// Architecture guide, section 1: Muon params 6.98 B, 6.53 B, 68.5 B (within 1 %).
TEST(ModelConfig, MuonCountsMatchTheArchitectureGuide) {
  EXPECT_NEAR(model("llama3_8b.json").muon_params() / 6.98e9, 1.0, 0.01);
  EXPECT_NEAR(model("qwen2_5_7b.json").muon_params() / 6.53e9, 1.0, 0.01);
  EXPECT_NEAR(model("llama3_70b.json").muon_params() / 68.5e9, 1.0, 0.01);
}

// Exact totals as the model cards / safetensors indices count them.
TEST(ModelConfig, TotalsMatchThePublishedParameterCounts) {
  EXPECT_EQ(model("gpt2_124m.json").total_params(), 124'439'808);
  EXPECT_EQ(model("llama3_8b.json").total_params(), 8'030'261'248);
  EXPECT_EQ(model("llama3_8b.json").muon_params(), 6'979'321'856);
  EXPECT_EQ(model("qwen2_5_7b.json").total_params(), 7'615'616'512);
  EXPECT_EQ(model("llama3_70b.json").total_params(), 70'553'706'496);
  const ModelConfig moe = model("qwen3_30b_a3b.json");
  EXPECT_EQ(moe.total_params(), 30'532'122'624);  // "30.5B in total"
  EXPECT_EQ(moe.active_params(), 3'353'032'704);  // "3.3B activated"
}

TEST(ModelConfig, ShapesAreDerivedFromTheHyperparameters) {
  const ModelConfig l8 = model("llama3_8b.json");
  EXPECT_EQ(l8.muon.size(), 7u * 32u);
  EXPECT_EQ(l8.hyperparameters.at("head_dim"), 128);
  const auto& k = find(l8, "model.layers.31.self_attn.k_proj.weight");
  EXPECT_EQ(k.rows, 8 * 128);
  EXPECT_EQ(k.cols, 4096);
  const auto& down = find(l8, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(down.rows, 4096);
  EXPECT_EQ(down.cols, 14336);
  EXPECT_EQ(l8.other_hyperparameters.at("rope_theta"), "500000.0");
  EXPECT_EQ(l8.active_params(), l8.total_params());

  const ModelConfig gpt2 = model("gpt2_124m.json");
  const auto& qkv = find(gpt2, "transformer.h.11.attn.c_attn.weight");
  EXPECT_EQ(qkv.rows, 2304);
  EXPECT_EQ(qkv.cols, 768);
  EXPECT_EQ(qkv.row_blocks, 3);

  const ModelConfig moe = model("qwen3_30b_a3b.json");
  const auto& up = find(moe, "model.layers.47.mlp.experts.up_proj.weight");
  EXPECT_EQ(up.batch, 128);
  EXPECT_EQ(up.rows, 768);
  EXPECT_EQ(up.cols, 2048);
  EXPECT_TRUE(up.expert);
  EXPECT_EQ(moe.active_experts, 8);
  EXPECT_EQ(find(moe, "model.layers.0.self_attn.q_proj.weight").rows, 4096);  // 32 x 128 > hidden
  EXPECT_EQ(moe.muon.size(), 7u * 48u);
}

TEST(ModelConfig, ExpressionsMultiplyAndDivideExactly) {
  const std::map<std::string, int64_t> v{{"a", 6}, {"b", 4}};
  EXPECT_EQ(evaluate_expression("a*b/3", v, "x"), 8);
  EXPECT_EQ(evaluate_expression(" 2 * a ", v, "x"), 12);
  EXPECT_THROW(evaluate_expression("a/b", v, "x"), InvalidArgument);
  EXPECT_THROW(evaluate_expression("a+b", v, "x"), InvalidArgument);
  EXPECT_THROW(evaluate_expression("c", v, "x"), InvalidArgument);
  EXPECT_THROW(evaluate_expression("", v, "x"), InvalidArgument);
}

TEST(ModelConfig, MalformedInputNamesTheLineOrField) {
  EXPECT_EQ(
      parse_model_config(config_with(R"({"name": "w", "shape": ["hidden", 32]})")).muon_params(),
      64 * 32);
  expect_config_error("{\n\"schema\": \"muon-offload-model/1\",\n\"name\": 3,,\n}",
                      "m.json, line 3, column 11: JSON syntax error while parsing object key");
  expect_config_error(R"({"schema": "muon-offload-model/9", "name": "t", "hyperparameters": {},
                          "muon": []})",
                      "m.json: schema: 'muon-offload-model/9' is not supported");
  expect_config_error(
      config_with(R"({"name": "w", "shape": ["hiden", 32]})"),
      "m.json: muon[0].shape[0]: expression 'hiden': unknown hyperparameter 'hiden'");
  expect_config_error(config_with(R"({"name": "w", "shape": ["hidden/3", 32]})"),
                      "muon[0].shape[0]: expression 'hidden/3': 64 / 3 is not exact");
  expect_config_error(config_with(R"({"name": "w", "shape": [64]})"),
                      "muon[0].shape: a Muon matrix has 2 dimensions");
  expect_config_error(config_with(R"({"name": "w", "shape": [0, 4]})"),
                      "muon[0].shape[0]: dimension 0 must be in [1, 2^40]");
  expect_config_error(config_with(R"({"name": "w", "shape": [64, 4], "row_blocks": 3})"),
                      "muon[0].row_blocks: 3 does not divide the 64 rows");
  expect_config_error(config_with(R"({"name": "w.{layer}", "shape": [64, 4]})"),
                      "muon[0].name: uses {layer} but the entry has no \"layers\"");
  expect_config_error(config_with(R"({"name": "w", "shape": [64, 4], "layers": "layers"})"),
                      "muon[0].name: must contain {layer} when \"layers\" is given");
  expect_config_error(config_with(R"({"name": "w.{layer}", "shape": [64, 4], "layers": 2},
                                     {"name": "w.1", "shape": [4, 4]})"),
                      "muon[1].name: 'w.1' is listed twice");
  expect_config_error(config_with(R"({"name": "e", "shape": [4, 4], "batch": 8, "expert": true})"),
                      "muon[0].expert: an expert batch needs the model's \"active_experts\"");
  expect_config_error(config_with(R"({"name": "w", "shape": [4, 4], "rows": 4})"),
                      "muon[0].rows: unknown field");
  expect_config_error(
      config_with(R"({"name": "w", "shape": [4, 4]})", R"("derived": {"hidden": 3}, )"),
      "derived.hidden: is already a hyperparameter");
  EXPECT_THROW(load_model_config("/nonexistent/model.json"), InvalidArgument);
}

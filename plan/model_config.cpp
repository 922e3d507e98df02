#include "plan/model_config.hpp"

#include <cctype>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "topology/json_fields.hpp"

namespace muon::plan {
namespace {

using topology::JsonArray;
using topology::JsonDocument;
using topology::JsonFields;

constexpr int64_t kMaxDim = int64_t{1} << 40;

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) throw InvalidArgument(what + ": value overflows");
  return out;
}

// An expression field: a JSON integer, or a string expression.
int64_t expression_value(const topology::Json& v, const std::map<std::string, int64_t>& vars,
                         const std::string& path) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) return evaluate_expression(v.get<std::string>(), vars, path);
  throw InvalidArgument(path + ": expected an integer or an expression string, got " +
                        topology::json_type_name(v));
}

int64_t positive_field(const JsonFields& f, const std::string& key,
                       const std::map<std::string, int64_t>& vars, const std::string& origin) {
  const std::string path = origin + ": " + f.path_of(key);
  const int64_t x = expression_value(f.at(key), vars, path);
  if (x <= 0 || x > kMaxDim) {
    throw InvalidArgument(path + ": " + std::to_string(x) + " must be in [1, 2^40]");
  }
  return x;
}

std::vector<int64_t> shape_field(const JsonFields& f, const std::map<std::string, int64_t>& vars,
                                 const std::string& origin) {
  const JsonArray shape = f.array("shape");
  std::vector<int64_t> out;
  for (size_t i = 0; i < shape.size(); ++i) {
    const std::string path = origin + ": " + shape.path_of(i);
    const int64_t x = expression_value(shape.at(i), vars, path);
    if (x <= 0 || x > kMaxDim) {
      throw InvalidArgument(path + ": dimension " + std::to_string(x) + " must be in [1, 2^40]");
    }
    out.push_back(x);
  }
  return out;
}

// Layer range of an entry and the names it expands to.
std::vector<std::string> expand_names(const JsonFields& f,
                                      const std::map<std::string, int64_t>& vars,
                                      const std::string& origin) {
  const std::string name = f.string("name");
  if (name.empty()) f.fail("name", "must not be empty");
  const auto at = name.find("{layer}");
  if (!f.has("layers")) {
    if (at != std::string::npos) f.fail("name", "uses {layer} but the entry has no \"layers\"");
    if (f.has("first_layer")) f.fail("first_layer", "needs \"layers\"");
    return {name};
  }
  if (at == std::string::npos) f.fail("name", "must contain {layer} when \"layers\" is given");
  const int64_t layers = positive_field(f, "layers", vars, origin);
  const int64_t first = f.has("first_layer") ? f.integer("first_layer", 0, 1 << 20) : 0;
  std::vector<std::string> out;
  for (int64_t l = first; l < first + layers; ++l) {
    std::string n = name;
    for (auto pos = n.find("{layer}"); pos != std::string::npos; pos = n.find("{layer}")) {
      n.replace(pos, 7, std::to_string(l));
    }
    out.push_back(std::move(n));
  }
  return out;
}

}  // namespace

int64_t AdamwTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t ModelConfig::muon_params() const {
  int64_t n = 0;
  for (const auto& m : muon) n += m.elements();
  return n;
}

int64_t ModelConfig::adamw_params() const {
  int64_t n = 0;
  for (const auto& t : adamw) n += t.elements();
  return n;
}

int64_t ModelConfig::active_params() const {
  int64_t n = adamw_params();
  for (const auto& m : muon) {
    n += m.expert && active_experts > 0 ? m.elements() / m.batch * active_experts : m.elements();
  }
  return n;
}

int64_t evaluate_expression(std::string_view expression,
                            const std::map<std::string, int64_t>& variables,
                            const std::string& what) {
  const std::string text(expression);
  auto fail = [&](const std::string& why) -> int64_t {
    throw InvalidArgument(what + ": expression '" + text + "': " + why);
  };
  size_t pos = 0;
  auto skip = [&] {
    while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  };
  auto term = [&]() -> int64_t {
    skip();
    if (pos >= text.size()) return fail("expected a number or a hyperparameter name");
    const size_t start = pos;
    if (std::isdigit(static_cast<unsigned char>(text[pos]))) {
      while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
      const std::string digits = text.substr(start, pos - start);
      if (digits.size() > 15) return fail("number " + digits + " is too large");
      return std::stoll(digits);
    }
    while (pos < text.size() &&
           (std::isalnum(static_cast<unsigned char>(text[pos])) || text[pos] == '_')) {
      ++pos;
    }
    if (pos == start) return fail(std::string("unexpected character '") + text[pos] + "'");
    const std::string name = text.substr(start, pos - start);
    const auto it = variables.find(name);
    if (it == variables.end()) return fail("unknown hyperparameter '" + name + "'");
    return it->second;
  };
  int64_t value = term();
  for (skip(); pos < text.size(); skip()) {
    const char op = text[pos++];
    if (op != '*' && op != '/') return fail(std::string("unexpected character '") + op + "'");
    const int64_t rhs = term();
    if (op == '*') {
      value = checked_mul(value, rhs, what);
    } else {
      if (rhs == 0 || value % rhs != 0) {
        return fail(std::to_string(value) + " / " + std::to_string(rhs) + " is not exact");
      }
      value /= rhs;
    }
  }
  return value;
}

ModelConfig parse_model_config(std::string_view text, std::string_view origin_view) {
  const std::string origin(origin_view);
  const JsonDocument doc(text, origin);
  const JsonFields root = doc.root();
  root.only({"schema", "name", "source", "notes", "hyperparameters", "derived", "active_experts",
             "muon", "adamw"});
  const std::string schema = root.string("schema");
  if (schema != kModelSchema) {
    root.fail("schema", "'" + schema + "' is not supported (this reader knows '" +
                            std::string(kModelSchema) + "')");
  }
  ModelConfig config;
  config.name = root.string("name");
  if (root.has("source")) config.source = root.string("source");
  if (root.has("notes")) (void)root.string("notes");

  const JsonFields hp = root.object("hyperparameters");
  for (const auto& key : hp.keys()) {
    const auto& v = hp.at(key);
    if (v.is_number_integer()) {
      config.hyperparameters[key] = v.get<int64_t>();
    } else {
      config.other_hyperparameters[key] = v.dump();
    }
  }
  if (root.has("derived")) {
    // Values the public config leaves implicit (head_dim = hidden_size / num_attention_heads),
    // evaluated in file order; each may use the ones before it.
    const JsonFields derived = root.object("derived");
    for (const auto& key : derived.keys()) {
      if (config.hyperparameters.count(key) || config.other_hyperparameters.count(key)) {
        derived.fail(key, "is already a hyperparameter");
      }
      config.hyperparameters[key] = expression_value(derived.at(key), config.hyperparameters,
                                                     origin + ": " + derived.path_of(key));
    }
  }
  const auto& vars = config.hyperparameters;
  if (root.has("active_experts")) {
    config.active_experts = positive_field(root, "active_experts", vars, origin);
  }

  std::set<std::string> names;
  auto claim = [&](const JsonFields& f, const std::string& n) {
    if (!names.insert(n).second) f.fail("name", "'" + n + "' is listed twice");
  };
  const JsonArray muon = root.array("muon");
  if (muon.size() == 0) root.fail("muon", "must list at least one matrix");
  for (size_t i = 0; i < muon.size(); ++i) {
    const JsonFields f = muon.object(i);
    f.only({"name", "shape", "layers", "first_layer", "batch", "row_blocks", "expert", "note"});
    const auto shape = shape_field(f, vars, origin);
    if (shape.size() != 2) {
      f.fail("shape",
             "a Muon matrix has 2 dimensions [rows, cols] (batch goes in \"batch\"), "
             "got " +
                 std::to_string(shape.size()));
    }
    MuonMatrix m;
    m.rows = shape[0];
    m.cols = shape[1];
    if (f.has("batch")) m.batch = positive_field(f, "batch", vars, origin);
    if (f.has("row_blocks")) m.row_blocks = positive_field(f, "row_blocks", vars, origin);
    if (m.rows % m.row_blocks != 0) {
      f.fail("row_blocks", std::to_string(m.row_blocks) + " does not divide the " +
                               std::to_string(m.rows) + " rows");
    }
    if (f.has("expert")) m.expert = f.boolean("expert");
    if (m.expert && config.active_experts == 0) {
      f.fail("expert", "an expert batch needs the model's \"active_experts\"");
    }
    if (m.expert && config.active_experts > m.batch) {
      f.fail("batch", "active_experts " + std::to_string(config.active_experts) +
                          " exceeds the batch of " + std::to_string(m.batch));
    }
    if (f.has("note")) (void)f.string("note");
    for (auto& n : expand_names(f, vars, origin)) {
      claim(f, n);
      m.name = n;
      config.muon.push_back(m);
    }
  }
  if (root.has("adamw")) {
    const JsonArray adamw = root.array("adamw");
    for (size_t i = 0; i < adamw.size(); ++i) {
      const JsonFields f = adamw.object(i);
      f.only({"name", "shape", "layers", "first_layer", "note"});
      const auto shape = shape_field(f, vars, origin);
      if (shape.empty()) f.fail("shape", "must have at least one dimension");
      if (f.has("note")) (void)f.string("note");
      for (auto& n : expand_names(f, vars, origin)) {
        claim(f, n);
        config.adamw.push_back({n, shape});
      }
    }
  }
  return config;
}

ModelConfig load_model_config(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    throw InvalidArgument("cannot read model config '" + path +
                          "' (a muon-offload-model/1 JSON file, e.g. "
                          "configs/models/llama3_8b.json)");
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace muon::plan

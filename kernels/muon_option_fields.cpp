#include "kernels/muon_option_fields.hpp"

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/error.hpp"
#include "kernels/ns_schedule.hpp"
#include "kernels/scale_rule.hpp"

namespace muon {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(std::string_view field, const std::string& what) {
  throw InvalidArgument("field '" + std::string(field) + "' " + what);
}

// ---- typed readers of one JSON value (the messages are those of the wire since v1) ----------

std::string read_string(std::string_view field, const json& v, size_t max_len = 64) {
  if (!v.is_string()) fail(field, "must be a string");
  auto s = v.get<std::string>();
  if (s.size() > max_len) fail(field, "is longer than " + std::to_string(max_len));
  return s;
}

template <class Parse>
auto read_name(std::string_view field, const json& v, Parse&& parse) {
  const auto s = read_string(field, v);
  try {
    return parse(s);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("field '" + std::string(field) + "': " + e.message());
  }
}

int64_t read_integer(std::string_view field, const json& v, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) fail(field, "must be an integer");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) {
    fail(field, "= " + std::to_string(x) + " is outside [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
  }
  return x;
}

double read_number(std::string_view field, const json& v) {
  if (!v.is_number()) fail(field, "must be a number");
  return v.get<double>();
}

// A float field: a number within float's finite range (a larger one would become inf, which
// JSON writes as null and nothing can read back, e.g. from a snapshot).
float read_float(std::string_view field, const json& v) {
  const double x = read_number(field, v);
  if (!(std::abs(x) <= std::numeric_limits<float>::max())) {
    fail(field, "= " + json(x).dump() + " is outside the range of a float");
  }
  return static_cast<float>(x);
}

bool read_bool(std::string_view field, const json& v) {
  if (!v.is_boolean()) fail(field, "must be true or false");
  return v.get<bool>();
}

std::vector<int64_t> read_integer_list(std::string_view field, const json& v) {
  if (!v.is_array()) fail(field, "must be an array");
  if (v.size() > 4096) fail(field, "has more than 4096 entries");
  std::vector<int64_t> out;
  for (const auto& e : v) {
    if (!e.is_number_integer()) fail(field, "must hold integers");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

std::vector<double> read_number_list(std::string_view field, const json& v) {
  if (!v.is_array()) fail(field, "must be an array");
  if (v.size() > 16) fail(field, "has more than 16 entries");
  std::vector<double> out;
  for (const auto& e : v) {
    if (!e.is_number()) fail(field, "must hold numbers");
    out.push_back(e.get<double>());
  }
  return out;
}

std::vector<std::string> schedule_names() {
  std::vector<std::string> out;
  for (const auto& s : ns_schedules()) out.push_back(s.name);
  return out;
}

std::vector<std::string> scale_rule_names() {
  std::vector<std::string> out;
  for (auto r : {ScaleRule::keller, ScaleRule::match_adamw, ScaleRule::sqrt_max,
                 ScaleRule::unit_rms, ScaleRule::none}) {
    out.emplace_back(scale_rule_name(r));
  }
  return out;
}

// The table. Each row: name, group, type, CLI flag, doc, choices, get, set.
const OptionField kFields[] = {
    {"momentum", OptionGroup::momentum, OptionType::string, "",
     "Momentum convention: sum (M <- mu*M + G; Moonlight, dion, DMuon), ema (M <- lerp(M, G, "
     "1 - mu); Keller's reference, torch.optim.Muon, Megatron), none (client-held momentum: the "
     "input is orthogonalized as it is; alias client)",
     momentum_convention_names,
     [](const MuonOptions& o) { return json(momentum_convention_name(o.momentum.convention)); },
     [](MuonOptions& o, const json& v) {
       o.momentum.convention = read_name("momentum", v, parse_momentum_convention);
     }},
    {"mu", OptionGroup::momentum, OptionType::number, "",
     "Momentum coefficient, in [0, 1); a double, as the trainer gives it (the lerp weight 1 - mu "
     "is formed in double and rounded once, as torch does)",
     nullptr, [](const MuonOptions& o) { return json(o.momentum.mu); },
     [](MuonOptions& o, const json& v) {
       // A double, but within float's range: the kernels round it to float.
       const double x = read_number("mu", v);
       if (!(std::abs(x) <= std::numeric_limits<float>::max())) {
         fail("mu", "= " + json(x).dump() + " is outside the range of a float");
       }
       o.momentum.mu = x;
     }},
    {"nesterov", OptionGroup::momentum, OptionType::boolean, "",
     "Nesterov look-ahead input to Newton-Schulz (sum: G + mu*M; ema: lerp(G, M, mu))", nullptr,
     [](const MuonOptions& o) { return json(o.momentum.nesterov); },
     [](MuonOptions& o, const json& v) { o.momentum.nesterov = read_bool("nesterov", v); }},
    {"schedule", OptionGroup::orthogonalize, OptionType::string, "--schedule",
     "Newton-Schulz coefficient schedule or alias (see `muon-offload schedules`)",
     schedule_names, [](const MuonOptions& o) { return json(o.orthogonalize.schedule); },
     [](MuonOptions& o, const json& v) { o.orthogonalize.schedule = read_string("schedule", v); }},
    {"steps", OptionGroup::orthogonalize, OptionType::integer, "--steps",
     "Newton-Schulz steps; 0: the schedule's default", nullptr,
     [](const MuonOptions& o) { return json(o.orthogonalize.steps); },
     [](MuonOptions& o, const json& v) {
       o.orthogonalize.steps = static_cast<int>(read_integer("steps", v, 0, 100));
     }},
    {"coefficients", OptionGroup::orthogonalize, OptionType::number_list, "--coefficients",
     "a,b,c: one quintic X <- aX + (bA + cA^2)X for every step instead of the schedule "
     "(torch.optim.Muon's ns_coefficients; steps 0 means 5); empty: the schedule's",
     nullptr, [](const MuonOptions& o) { return json(o.orthogonalize.coefficients); },
     [](MuonOptions& o, const json& v) {
       o.orthogonalize.coefficients = read_number_list("coefficients", v);
     },
     /*required=*/false},
    {"eps", OptionGroup::orthogonalize, OptionType::number, "--eps",
     "Guard of the Frobenius normalization (see eps_mode)", nullptr,
     [](const MuonOptions& o) { return json(o.orthogonalize.eps); },
     [](MuonOptions& o, const json& v) { o.orthogonalize.eps = read_float("eps", v); }},
    {"eps_mode", OptionGroup::orthogonalize, OptionType::string, "--eps-mode",
     "scale_invariant: X / ||X||_F, eps only guards a zero matrix (default); add: X / (||X||_F "
     "+ eps) (Keller); clamp: X / max(||X||_F, eps) (torch.optim.Muon, NVIDIA)",
     eps_mode_names,
     [](const MuonOptions& o) { return json(eps_mode_name(o.orthogonalize.eps_mode)); },
     [](MuonOptions& o, const json& v) {
       o.orthogonalize.eps_mode = read_name("eps_mode", v, parse_eps_mode);
     }},
    {"scale", OptionGroup::orthogonalize, OptionType::string, "--scale",
     "Scale rule: keller max(1, r/c)^0.5, match_adamw 0.2 sqrt(max(r, c)), sqrt_max "
     "sqrt(max(r, c)), unit_rms sqrt(r/c), none 1; r, c of the row block",
     scale_rule_names,
     [](const MuonOptions& o) { return json(scale_rule_name(o.orthogonalize.scale_rule)); },
     [](MuonOptions& o, const json& v) {
       o.orthogonalize.scale_rule = read_name("scale", v, parse_scale_rule);
     }},
    {"extra_scale", OptionGroup::orthogonalize, OptionType::number, "--extra-scale",
     "Extra factor times the scale rule", nullptr,
     [](const MuonOptions& o) { return json(o.orthogonalize.extra_scale); },
     [](MuonOptions& o, const json& v) {
       o.orthogonalize.extra_scale = read_number("extra_scale", v);
     }},
    {"row_splits", OptionGroup::orthogonalize, OptionType::integer_list, "--split",
     "Row blocks orthogonalized separately (fused QKV), e.g. 1024,256,256; must add up to the "
     "rows; empty: one block",
     nullptr, [](const MuonOptions& o) { return json(o.orthogonalize.row_splits); },
     [](MuonOptions& o, const json& v) {
       o.orthogonalize.row_splits = read_integer_list("row_splits", v);
     }},
    {"algorithm", OptionGroup::orthogonalize, OptionType::string, "--algorithm",
     "plain (3 GEMMs/step), syrk (symmetric products), gram (Gram-space iteration restarted "
     "every gram_restart steps; for cols >> rows), auto (the fastest exact one for the shape, "
     "measured once per machine)",
     ns_algorithm_names,
     [](const MuonOptions& o) { return json(ns_algorithm_name(o.orthogonalize.algorithm)); },
     [](MuonOptions& o, const json& v) {
       o.orthogonalize.algorithm = read_name("algorithm", v, parse_ns_algorithm);
     }},
    {"gram_restart", OptionGroup::orthogonalize, OptionType::integer, "--gram-restart",
     "Steps between restarts of the gram iteration (X formed, X X^T recomputed; Dao-AILab "
     "Gram Newton-Schulz); 0 never restarts (less exact)",
     nullptr, [](const MuonOptions& o) { return json(o.orthogonalize.gram_restart); },
     [](MuonOptions& o, const json& v) {
       o.orthogonalize.gram_restart = static_cast<int>(read_integer("gram_restart", v, 0, 100));
     },
     /*required=*/false},
    {"precision", OptionGroup::orthogonalize, OptionType::string, "--precision",
     "default (the backend's: fp32 on CPU, bf16 on CUDA), fp32, bf16 (CUDA only), torch_bf16 "
     "(torch.optim.Muon's bf16 rounding points, CPU only, for parity checks)",
     precision_names,
     [](const MuonOptions& o) { return json(precision_name(o.orthogonalize.precision)); },
     [](MuonOptions& o, const json& v) {
       o.orthogonalize.precision = read_name("precision", v, parse_precision);
     }},
    {"nonfinite", OptionGroup::orthogonalize, OptionType::string, "--nonfinite",
     "A gradient with NaN or Inf: error (refuse the step, momentum untouched) or skip (a zero "
     "update, momentum untouched)",
     nonfinite_policy_names,
     [](const MuonOptions& o) { return json(nonfinite_policy_name(o.orthogonalize.nonfinite)); },
     [](MuonOptions& o, const json& v) {
       o.orthogonalize.nonfinite = read_name("nonfinite", v, parse_nonfinite_policy);
     }},
};

std::string known_fields() {
  std::string s;
  for (const auto& f : kFields) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

int64_t parse_integer_text(std::string_view field, std::string_view text) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    fail(field, "must be an integer, got '" + std::string(text) + "'");
  }
  return v;
}

double parse_number_text(std::string_view field, std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size()) {
    fail(field, "must be a number, got '" + s + "'");
  }
  return x;
}

// Comma-separated text as a JSON array, each part read by `parse`.
template <class Parse>
json list_from_text(std::string_view field, std::string_view text, Parse&& parse) {
  json v = json::array();
  size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    v.push_back(parse(field, text.substr(start, comma - start)));
    start = comma + 1;
  }
  return v;
}

}  // namespace

std::string_view option_type_name(OptionType type) {
  switch (type) {
    case OptionType::string:
      return "string";
    case OptionType::integer:
      return "integer";
    case OptionType::number:
      return "number";
    case OptionType::boolean:
      return "boolean";
    case OptionType::integer_list:
      return "integer_list";
    case OptionType::number_list:
      return "number_list";
  }
  return "?";
}

std::span<const OptionField> muon_option_fields() {
  return kFields;
}

const OptionField* find_option_field(std::string_view name) {
  for (const auto& f : kFields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

nlohmann::json options_to_json_object(const MuonOptions& options) {
  json j = json::object();
  for (const auto& f : kFields) j[std::string(f.name)] = f.get(options);
  return j;
}

MuonOptions options_from_json_object(const nlohmann::json& object, OptionKeys keys) {
  if (!object.is_object()) throw InvalidArgument("options must be a JSON object");
  MuonOptions o;
  if (keys == OptionKeys::overrides) {
    for (auto it = object.begin(); it != object.end(); ++it) {
      if (!find_option_field(it.key())) {
        throw InvalidArgument("unknown option '" + it.key() + "' (known: " + known_fields() + ")");
      }
    }
  }
  for (const auto& f : kFields) {
    const auto it = object.find(std::string(f.name));
    if (it == object.end()) {
      if (keys == OptionKeys::all_required && f.required) {
        throw InvalidArgument("missing field '" + std::string(f.name) + "'");
      }
      continue;
    }
    f.set(o, *it);
  }
  return o;
}

void set_option_from_text(MuonOptions& options, const OptionField& field, std::string_view text) {
  json v;
  switch (field.type) {
    case OptionType::string:
      v = std::string(text);
      break;
    case OptionType::integer:
      v = parse_integer_text(field.name, text);
      break;
    case OptionType::number:
      v = parse_number_text(field.name, text);
      break;
    case OptionType::boolean:
      if (text == "true" || text == "1") {
        v = true;
      } else if (text == "false" || text == "0") {
        v = false;
      } else {
        fail(field.name, "must be true or false, got '" + std::string(text) + "'");
      }
      break;
    case OptionType::integer_list:
      v = list_from_text(field.name, text, parse_integer_text);
      break;
    case OptionType::number_list:
      v = list_from_text(field.name, text, parse_number_text);
      break;
  }
  field.set(options, v);
}

std::string option_default_text(const OptionField& field) {
  const json v = field.get(MuonOptions{});
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    std::string s;
    for (const auto& e : v) s += (s.empty() ? "" : ",") + e.dump();
    return s;
  }
  return v.dump();
}

std::string options_schema_json() {
  json out = json::array();
  const MuonOptions defaults;
  for (const auto& f : kFields) {
    json choices = nullptr;
    if (f.choices) choices = f.choices();
    out.push_back({{"name", f.name},
                   {"group", f.group == OptionGroup::momentum ? "momentum" : "orthogonalize"},
                   {"type", option_type_name(f.type)},
                   {"default", f.get(defaults)},
                   {"choices", choices},
                   {"cli_flag", f.cli_flag.empty() ? json(nullptr) : json(f.cli_flag)},
                   {"doc", f.doc}});
  }
  return out.dump();
}

}  // namespace muon

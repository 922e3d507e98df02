// The one table of MuonOptions fields. The wire codec (transport/messages.cpp), the CLI flags of
// `muon-offload orthogonalize`, the C ABI's options JSON (client/c_api.cpp) and the Python
// keywords (muon_options_schema() in client/muon_client.h) all read it, so a field's name, type,
// default, accepted names and documentation are written once.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/muon_options.hpp"

namespace muon {

/// The JSON type of a field's value.
enum class OptionType { string, integer, number, boolean, integer_list, number_list };

/// "string", "integer", "number", "boolean", "integer_list" or "number_list" (the schema's type
/// names).
std::string_view option_type_name(OptionType type);

/// Which part of MuonOptions a field belongs to.
enum class OptionGroup { momentum, orthogonalize };

/// One field of MuonOptions.
struct OptionField {
  std::string_view name;      ///< JSON key on the wire and in the C ABI; the Python keyword
  OptionGroup group;
  OptionType type;
  std::string_view cli_flag;  ///< the flag of `muon-offload orthogonalize`; "" when none
  std::string_view doc;       ///< one line: meaning, formula, sources
  /// The accepted names of a string field (canonical ones; a schedule also takes its aliases);
  /// nullptr when any value of the type is accepted.
  std::vector<std::string> (*choices)();
  /// The field's value in `options`, as JSON.
  nlohmann::json (*get)(const MuonOptions& options);
  /// Sets the field from a JSON value; throws InvalidArgument "field '<name>' ..." naming what is
  /// wrong (type, range, unknown name with the list of known ones).
  void (*set)(MuonOptions& options, const nlohmann::json& value);
  /// Whether the wire (OptionKeys::all_required) needs it; false for a field added later whose
  /// absence means its default (coefficients: a peer that predates it runs the schedule).
  bool required = true;
};

/// Every field, in the order of the documentation: momentum, mu, nesterov, schedule, steps,
/// coefficients, eps, eps_mode, scale, extra_scale, row_splits, algorithm, gram_restart, precision,
/// nonfinite.
std::span<const OptionField> muon_option_fields();

/// The field called `name`, or nullptr.
const OptionField* find_option_field(std::string_view name);

/// The options as a JSON object holding every field.
nlohmann::json options_to_json_object(const MuonOptions& options);

/// How options_from_json_object treats the keys of its object.
enum class OptionKeys {
  /// every required field must be present; unknown keys are ignored (the wire, snapshots)
  all_required,
  /// missing fields keep MuonOptions' defaults; an unknown key is refused (user input: the C
  /// ABI, configs)
  overrides,
};

/// Options from a JSON object. Throws InvalidArgument naming the field ("field 'mu' must be a
/// number", "missing field 'eps'", "unknown option 'lr' (known: momentum, mu, ...)") or
/// "options must be a JSON object".
MuonOptions options_from_json_object(const nlohmann::json& object, OptionKeys keys);

/// Sets `field` from command-line text (CLI flags): strings as they are, integers and numbers
/// parsed in full ("1e-7"), booleans "true"/"false"/"1"/"0", integer and number lists comma-separated
/// ("1024,256,256", "3.4445,-4.775,2.0315"). Throws InvalidArgument naming the field.
void set_option_from_text(MuonOptions& options, const OptionField& field, std::string_view text);

/// The default value of `field` as command-line text (what set_option_from_text reads back).
std::string option_default_text(const OptionField& field);

/// The schema of every field as a JSON array of objects {"name", "group" ("momentum" or
/// "orthogonalize"), "type" (option_type_name), "default" (JSON value), "choices" (array of
/// names, or null), "cli_flag" (or null), "doc"}: what Python derives its keywords from.
std::string options_schema_json();

}  // namespace muon

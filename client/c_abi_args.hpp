// Argument decoding shared by the C ABIs: options JSON over the defaults, shapes, ranges.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/muon_option_fields.hpp"
#include "kernels/range_set.hpp"

namespace muon::capi {

/// The caller's options JSON object over MuonOptions' defaults (NULL or "": the defaults; missing
/// fields keep them, unknown ones are refused: kernels/muon_option_fields.hpp). Throws
/// InvalidArgument.
inline MuonOptions options(const char* json_text) {
  using nlohmann::json;
  if (!json_text || !*json_text) return {};
  json user;
  try {
    user = json::parse(json_text);
  } catch (const json::exception& e) {
    throw InvalidArgument(std::string("options are not valid JSON: ") + e.what());
  }
  return options_from_json_object(user, OptionKeys::overrides);
}

/// A tensor shape of `ndim` (0..8) dims. Throws InvalidArgument.
inline std::vector<int64_t> dims(const int64_t* shape, int ndim) {
  if (ndim < 0 || ndim > 8 || (ndim > 0 && !shape)) throw InvalidArgument("bad shape array");
  return std::vector<int64_t>(shape, shape + ndim);
}

/// `n` ranges from a flat [begin0, end0, begin1, end1, ...] array. Throws InvalidArgument.
inline std::vector<Range> ranges(const int64_t* flat, int n, const char* what) {
  if (n < 0 || (n > 0 && flat == nullptr)) {
    throw InvalidArgument(std::string(what) + ": bad range array");
  }
  std::vector<Range> out;
  for (int i = 0; i < n; ++i) out.push_back({flat[2 * i], flat[2 * i + 1]});
  return out;
}

}  // namespace muon::capi

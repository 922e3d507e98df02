#include "daemon/plan_calibration.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.hpp"

namespace muon::daemon {
namespace {

using nlohmann::json;

int64_t positive(const json& v, const std::string& what) {
  if (!v.is_number_integer() || v.get<int64_t>() < 1) {
    throw InvalidArgument(what + " must be a positive integer, got " + v.dump());
  }
  return v.get<int64_t>();
}

}  // namespace

std::vector<PlannedMatrix> planned_matrices(const std::string& plan_json, int server_id,
                                            const std::string& source) {
  const std::string where = "plan '" + source + "'";
  const json doc = json::parse(plan_json, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) throw InvalidArgument(where + " is not a JSON object");
  OrthogonalizeOptions base;
  if (doc.contains("settings")) {
    const json& s = doc.at("settings");
    if (s.contains("schedule")) {
      if (!s.at("schedule").is_string()) {
        throw InvalidArgument(where + ": settings.schedule must be a string");
      }
      base.schedule = s.at("schedule").get<std::string>();
    }
    if (s.contains("ns_steps")) {
      base.steps = static_cast<int>(positive(s.at("ns_steps"), where + ": settings.ns_steps"));
    }
  }
  std::vector<PlannedMatrix> out;
  if (!doc.contains("parameters") || !doc.at("parameters").is_array()) return out;
  const json& params = doc.at("parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    const json& p = params[i];
    const std::string what = where + ": parameters[" + std::to_string(i) + "]";
    if (!p.is_object() || !p.contains("shape") || !p.contains("name") ||
        !p.at("name").is_string() || !p.contains("owner") || !p.at("owner").is_number_integer() ||
        p.at("owner").get<int64_t>() != server_id) {
      continue;  // another server's, or no shape given
    }
    const json& dims = p.at("shape");
    if (!dims.is_array() || dims.size() < 2 || dims.size() > 3) {
      throw InvalidArgument(what + ".shape must be [rows, cols] or [batch, rows, cols]");
    }
    PlannedMatrix m;
    m.name = p.at("name").get<std::string>();
    const size_t first = dims.size() - 2;
    m.shape.batch = first == 1 ? positive(dims[0], what + ".shape[0]") : 1;
    m.shape.rows = positive(dims[first], what + ".shape");
    m.shape.cols = positive(dims[first + 1], what + ".shape");
    m.options.orthogonalize = base;
    const int64_t blocks =
        p.contains("row_blocks") ? positive(p.at("row_blocks"), what + ".row_blocks") : 1;
    if (blocks > 1) {
      if (m.shape.rows % blocks != 0) {
        throw InvalidArgument(what + ".row_blocks " + std::to_string(blocks) +
                              " does not divide its " + std::to_string(m.shape.rows) + " rows");
      }
      m.options.orthogonalize.row_splits.assign(static_cast<size_t>(blocks), m.shape.rows / blocks);
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<PlannedMatrix> planned_matrices_from_file(const std::string& path, int server_id) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument("cannot read plan '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return planned_matrices(text.str(), server_id, path);
}

}  // namespace muon::daemon

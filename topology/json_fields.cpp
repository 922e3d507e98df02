#include "topology/json_fields.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace muon::topology {

const char* json_type_name(const Json& value) {
  if (value.is_number_integer()) return "integer";
  if (value.is_number_float()) return "number";
  if (value.is_string()) return "string";
  if (value.is_boolean()) return "boolean";
  if (value.is_array()) return "array";
  if (value.is_object()) return "object";
  if (value.is_null()) return "null";
  return "value";
}

JsonFields::JsonFields(const Json& value, std::string origin, std::string path)
    : value_(&value), origin_(std::move(origin)), path_(std::move(path)) {}

void JsonFields::only(std::initializer_list<std::string_view> known) const {
  for (const auto& [key, v] : value_->items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (auto k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      fail(key, "unknown field (known here: " + list + ")");
    }
  }
}

bool JsonFields::has(const std::string& key) const {
  return value_->contains(key);
}

std::vector<std::string> JsonFields::keys() const {
  std::vector<std::string> out;
  for (const auto& [key, v] : value_->items()) out.push_back(key);
  return out;
}

const Json& JsonFields::at(const std::string& key) const {
  auto it = value_->find(key);
  if (it == value_->end()) fail(key, "missing field");
  return *it;
}

std::string JsonFields::string(const std::string& key) const {
  const Json& v = at(key);
  if (!v.is_string()) type_error(key, "a string");
  return v.get<std::string>();
}

int64_t JsonFields::integer(const std::string& key, int64_t lo, int64_t hi) const {
  const Json& v = at(key);
  if (!v.is_number_integer()) type_error(key, "an integer");
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)
                        ? INT64_MAX
                        : v.get<int64_t>();
  if (x < lo || x > hi) {
    fail(key, std::to_string(x) + " is out of range [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "]");
  }
  return x;
}

double JsonFields::number(const std::string& key, double lo, double hi) const {
  const Json& v = at(key);
  if (!v.is_number()) type_error(key, "a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    fail(key, std::to_string(x) + " is out of range [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "]");
  }
  return x;
}

bool JsonFields::boolean(const std::string& key) const {
  const Json& v = at(key);
  if (!v.is_boolean()) type_error(key, "true or false");
  return v.get<bool>();
}

JsonFields JsonFields::object(const std::string& key) const {
  const Json& v = at(key);
  if (!v.is_object()) type_error(key, "an object");
  return JsonFields(v, origin_, path_of(key));
}

JsonArray JsonFields::array(const std::string& key) const {
  const Json& v = at(key);
  if (!v.is_array()) type_error(key, "an array");
  return JsonArray(v, origin_, path_of(key));
}

std::string JsonFields::path_of(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

void JsonFields::fail(const std::string& key, const std::string& message) const {
  throw InvalidArgument(origin_ + ": " + path_of(key) + ": " + message);
}

void JsonFields::type_error(const std::string& key, const char* expected) const {
  fail(key, std::string("expected ") + expected + ", got " + json_type_name(at(key)));
}

JsonArray::JsonArray(const Json& value, std::string origin, std::string path)
    : value_(&value), origin_(std::move(origin)), path_(std::move(path)) {}

JsonFields JsonArray::object(size_t i) const {
  const Json& v = (*value_)[i];
  if (!v.is_object()) fail(i, std::string("expected an object, got ") + json_type_name(v));
  return JsonFields(v, origin_, path_of(i));
}

std::string JsonArray::path_of(size_t i) const {
  return path_ + "[" + std::to_string(i) + "]";
}

void JsonArray::fail(size_t i, const std::string& message) const {
  throw InvalidArgument(origin_ + ": " + path_of(i) + ": " + message);
}

JsonDocument::JsonDocument(std::string_view text, std::string origin) : origin_(std::move(origin)) {
  try {
    value_ = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    // e.byte is the 1-based offset of the offending character; turn it into line:column.
    const size_t byte = std::min<size_t>(e.byte == 0 ? 0 : e.byte - 1, text.size());
    size_t line = 1, column = 1;
    for (size_t i = 0; i < byte; ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    std::string what = e.what();
    // nlohmann's text: "[json.exception.parse_error.101] parse error at line 3, column 5: ...".
    const auto colon = what.find(": ", what.find("parse error"));
    if (colon != std::string::npos) what = what.substr(colon + 2);
    // "syntax error while parsing value - ..." reads as "JSON syntax error while parsing ...".
    what = what.rfind("syntax error ", 0) == 0 ? what.substr(12) : ": " + what;
    throw InvalidArgument(origin_ + ", line " + std::to_string(line) + ", column " +
                          std::to_string(column) + ": JSON syntax error" + what);
  }
  if (!value_.is_object()) {
    throw InvalidArgument(origin_ + ": expected a JSON object at the top level, got " +
                          json_type_name(value_));
  }
}

}  // namespace muon::topology

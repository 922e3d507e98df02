// Typed, path-aware access to a parsed JSON document, so that every reader of a versioned file
// (topology descriptions, model configs) reports a bad input the same way:
//   "<origin>: hosts[1].gpus[3].numa_node: expected an integer, got string"
//   "<origin>, line 12, column 5: JSON syntax error while parsing value - ..."
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace muon::topology {

/// Objects keep their keys in file order, so errors and derived values follow the file.
using Json = nlohmann::ordered_json;

class JsonArray;

/// One JSON object and where it sits in its document. Cheap to copy; borrows the document.
class JsonFields {
 public:
  JsonFields(const Json& value, std::string origin, std::string path);

  /// Throws InvalidArgument naming the first key that is not in `known` (and listing `known`).
  void only(std::initializer_list<std::string_view> known) const;
  bool has(const std::string& key) const;
  std::vector<std::string> keys() const;

  /// The value at `key`, which must be present; throws "missing field" otherwise.
  const Json& at(const std::string& key) const;
  std::string string(const std::string& key) const;
  /// An integer in [lo, hi]; a float, a string or an out-of-range value is an error.
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) const;
  /// A number (integer or float) in [lo, hi].
  double number(const std::string& key, double lo, double hi) const;
  bool boolean(const std::string& key) const;
  JsonFields object(const std::string& key) const;
  JsonArray array(const std::string& key) const;

  /// "hosts[1].gpus[3].numa_node" for key "numa_node" of this object.
  std::string path_of(const std::string& key) const;
  /// Throws InvalidArgument "<origin>: <path_of(key)>: <message>".
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

 private:
  [[noreturn]] void type_error(const std::string& key, const char* expected) const;
  const Json* value_;
  std::string origin_;
  std::string path_;
};

/// A JSON array field; its elements are reached by index.
class JsonArray {
 public:
  JsonArray(const Json& value, std::string origin, std::string path);
  size_t size() const { return value_->size(); }
  const Json& at(size_t i) const { return (*value_)[i]; }
  /// Element `i`, which must be an object.
  JsonFields object(size_t i) const;
  /// "hosts[1]" for element 1 of "hosts".
  std::string path_of(size_t i) const;
  [[noreturn]] void fail(size_t i, const std::string& message) const;

 private:
  const Json* value_;
  std::string origin_;
  std::string path_;
};

/// A parsed document. Throws InvalidArgument "<origin>, line L, column C: JSON syntax error ..."
/// when `text` is not JSON, and "<origin>: expected a JSON object at the top level" when it is
/// not an object.
class JsonDocument {
 public:
  JsonDocument(std::string_view text, std::string origin);
  JsonFields root() const { return JsonFields(value_, origin_, ""); }

 private:
  Json value_;
  std::string origin_;
};

/// "integer", "string", "array", ... for error messages.
const char* json_type_name(const Json& value);

}  // namespace muon::topology

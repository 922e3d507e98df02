// The input format of the registration harness (fuzz_registration.cpp), shared with the seed
// writer. Little-endian:
//
//   i8   world_size             (signed: 0 and negatives are inputs too)
//   i64  batch, i64 rows, i64 cols
//   u8   dtypes                 bit 0: grad bf16, bit 1: update bf16
//   u8   n_calls, then n_calls add() calls, each:
//     i8  rank
//     u8  spec changes          bit 0: other name, bit 1: other rows, bit 2: other grad dtype,
//                               bit 3: other mu (the spec must then be refused)
//     u8  n_push, u8 n_want     (each taken modulo 64)
//     (n_push + n_want) x (i64 begin, i64 end)
//   the rest                    options as JSON for options_from_json (empty: default options)
//
// The JSON comes last and unprefixed so that mutations inside it shift nothing else. When the
// bytes run out inside the calls, the calls read so far are kept and the options are the default.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "transport/messages.hpp"

namespace muon::fuzz {

/// One PendingRegistration::add() call.
struct RegistrationCall {
  int rank = 0;
  uint8_t spec_changes = 0;
  std::vector<transport::Range> push, want;
};

/// A whole registration-harness input.
struct RegistrationInput {
  int world_size = 1;
  int64_t batch = 1, rows = 0, cols = 0;
  uint8_t dtypes = 0;
  std::string options_json;  ///< empty: default options
  std::vector<RegistrationCall> calls;
};

/// Reads little-endian integers from a byte span; every read fails once the bytes run out.
class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  template <class T>
  std::optional<T> get() {
    if (bytes_.size() - pos_ < sizeof(T)) return std::nullopt;
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));  // x86-64 and aarch64 are little-endian
    pos_ += sizeof(T);
    return v;
  }
  /// Every byte not read yet.
  std::string rest() {
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), bytes_.size() - pos_);
    pos_ = bytes_.size();
    return s;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

/// Parses an input; nullopt when even the fixed header is incomplete.
inline std::optional<RegistrationInput> parse_registration_input(std::span<const uint8_t> bytes) {
  ByteReader r(bytes);
  RegistrationInput in;
  const auto ws = r.get<int8_t>();
  const auto b = r.get<int64_t>(), rows = r.get<int64_t>(), cols = r.get<int64_t>();
  const auto dtypes = r.get<uint8_t>();
  const auto n_calls = r.get<uint8_t>();
  if (!ws || !b || !rows || !cols || !dtypes || !n_calls) return std::nullopt;
  in.world_size = *ws;
  in.batch = *b;
  in.rows = *rows;
  in.cols = *cols;
  in.dtypes = *dtypes;
  for (int c = 0; c < *n_calls; ++c) {
    const auto rank = r.get<int8_t>();
    const auto changes = r.get<uint8_t>();
    const auto n_push = r.get<uint8_t>(), n_want = r.get<uint8_t>();
    if (!rank || !changes || !n_push || !n_want) return in;
    RegistrationCall call{*rank, *changes, {}, {}};
    for (int i = 0; i < (*n_push % 64) + (*n_want % 64); ++i) {
      const auto begin = r.get<int64_t>(), end = r.get<int64_t>();
      if (!begin || !end) return in;
      (i < *n_push % 64 ? call.push : call.want).push_back({*begin, *end});
    }
    in.calls.push_back(std::move(call));
  }
  in.options_json = r.rest();
  return in;
}

/// Serializes an input (the seed writer's side of parse_registration_input).
inline std::vector<uint8_t> serialize(const RegistrationInput& in) {
  std::vector<uint8_t> out;
  auto put = [&out](auto v) {
    uint8_t buf[sizeof v];
    std::memcpy(buf, &v, sizeof v);
    out.insert(out.end(), buf, buf + sizeof v);
  };
  put(static_cast<int8_t>(in.world_size));
  put(in.batch);
  put(in.rows);
  put(in.cols);
  put(in.dtypes);
  put(static_cast<uint8_t>(in.calls.size()));
  for (const auto& c : in.calls) {
    put(static_cast<int8_t>(c.rank));
    put(c.spec_changes);
    put(static_cast<uint8_t>(c.push.size()));
    put(static_cast<uint8_t>(c.want.size()));
    for (const auto* list : {&c.push, &c.want}) {
      for (const auto& g : *list) {
        put(g.begin);
        put(g.end);
      }
    }
  }
  out.insert(out.end(), in.options_json.begin(), in.options_json.end());
  return out;
}

}  // namespace muon::fuzz

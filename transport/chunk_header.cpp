// The binary codec of data-chunk frames (layout: transport/chunk_header.hpp).
#include "transport/chunk_header.hpp"
#include "transport/shm_credits.hpp"

#include <cstring>
#include <string>

#include "transport/messages.hpp"

namespace muon::transport {
namespace {

constexpr int64_t kMaxChunkStep = int64_t{1} << 53;
constexpr int64_t kMaxChunkElements = int64_t{1} << 40;
constexpr size_t kMaxChunkName = 512;
constexpr uint8_t kFlagLast = 1;
constexpr uint8_t kFlagApplied = 2;

// Little-endian writers and readers over a byte string.
template <class T>
void put(std::string& out, size_t at, T v) {
  const auto u = static_cast<std::make_unsigned_t<T>>(v);
  for (size_t i = 0; i < sizeof(T); ++i) out[at + i] = static_cast<char>((u >> (8 * i)) & 0xff);
}
template <class T>
T get(const std::string& in, size_t at) {
  std::make_unsigned_t<T> u = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    u |= static_cast<std::make_unsigned_t<T>>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  }
  return static_cast<T>(u);
}

// The fields both chunk messages share, as they travel.
struct Wire {
  ChunkKind kind = ChunkKind::gradient;
  uint8_t flags = 0;
  uint32_t param_id = kNoParamId;
  std::string name;
  uint32_t slot = 0;
  uint32_t attempt = 0;
  int64_t step = 0, offset = 0, count = 0;
};

std::string write(const Wire& w) {
  std::string out(kChunkHeaderBytes + w.name.size(), '\0');
  put<uint32_t>(out, 0, kChunkMagic);
  put<uint8_t>(out, 4, static_cast<uint8_t>(w.kind));
  put<uint8_t>(out, 5, w.flags);
  put<uint16_t>(out, 6, static_cast<uint16_t>(w.name.size()));
  put<uint32_t>(out, 8, w.name.empty() ? w.param_id : kNoParamId);
  put<uint32_t>(out, 12, w.slot);
  put<uint32_t>(out, 16, w.attempt);
  put<int64_t>(out, 24, w.step);
  put<int64_t>(out, 32, w.offset);
  put<int64_t>(out, 40, w.count);
  if (!w.name.empty()) std::memcpy(out.data() + kChunkHeaderBytes, w.name.data(), w.name.size());
  return out;
}

[[noreturn]] void fail(const char* message, const std::string& what) {
  throw ProtocolError(std::string(message) + ": " + what);
}

void check_range(const char* message, const char* field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    fail(message, "field '" + std::string(field) + "' = " + std::to_string(v) + " is outside [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
}

Wire read(const std::string& p, const char* message, int64_t min_step, uint8_t allowed_flags) {
  if (p.size() < kChunkHeaderBytes) {
    fail(message, "payload of " + std::to_string(p.size()) + " bytes is shorter than the " +
                      std::to_string(kChunkHeaderBytes) + "-byte chunk header");
  }
  const auto magic = get<uint32_t>(p, 0);
  if (magic != kChunkMagic)
    fail(message, "not a chunk header (bad magic " + std::to_string(magic) + ")");
  Wire w;
  const auto kind = get<uint8_t>(p, 4);
  if (kind > static_cast<uint8_t>(ChunkKind::replica_update)) {
    fail(message, "field 'kind' = " + std::to_string(kind) + " is not a chunk kind (0..3)");
  }
  w.kind = static_cast<ChunkKind>(kind);
  w.flags = get<uint8_t>(p, 5);
  if ((w.flags & ~allowed_flags) != 0) {
    fail(message, "field 'flags' = " + std::to_string(w.flags) + " sets unknown bits");
  }
  const auto name_bytes = get<uint16_t>(p, 6);
  if (p.size() != kChunkHeaderBytes + name_bytes) {
    fail(message, "payload of " + std::to_string(p.size()) + " bytes is not the header and the " +
                      std::to_string(name_bytes) + "-byte name it announces");
  }
  if (name_bytes > kMaxChunkName) fail(message, "field 'name' is longer than 512 bytes");
  w.param_id = get<uint32_t>(p, 8);
  if ((name_bytes > 0) == (w.param_id != kNoParamId)) {
    fail(message, "a chunk names its parameter by param_id or by name, exactly one (param_id " +
                      std::to_string(w.param_id) + ", " + std::to_string(name_bytes) +
                      " name bytes)");
  }
  if (w.param_id != kNoParamId && w.param_id >= kMaxParamIds) {
    fail(message, "field 'param_id' = " + std::to_string(w.param_id) + " is outside [0, " +
                      std::to_string(kMaxParamIds) + ")");
  }
  w.name = p.substr(kChunkHeaderBytes);
  w.slot = get<uint32_t>(p, 12);
  check_range(message, "slot", w.slot, 0, 1 << 16);
  w.attempt = get<uint32_t>(p, 16);
  check_range(message, "attempt", w.attempt, 0, int64_t{1} << 30);
  if (get<uint32_t>(p, 20) != 0) fail(message, "reserved header bytes 20..23 must be 0");
  w.step = get<int64_t>(p, 24);
  check_range(message, "step", w.step, min_step, kMaxChunkStep);
  w.offset = get<int64_t>(p, 32);
  check_range(message, "offset", w.offset, 0, kMaxChunkElements);
  w.count = get<int64_t>(p, 40);
  check_range(message, "count", w.count, 0, kMaxChunkElements);
  return w;
}

}  // namespace

std::string encode(const Push& m) {
  return write({m.kind, 0, m.param_id, m.param_id == kNoParamId ? m.name : "", m.slot, m.attempt,
                m.step, m.offset, m.count});
}
std::string encode(const Update& m) {
  const uint8_t flags = (m.last ? kFlagLast : 0) | (m.applied ? kFlagApplied : 0);
  return write({m.kind, flags, m.param_id, m.param_id == kNoParamId ? m.name : "", m.slot, 0,
                m.step, m.offset, m.count});
}
std::string encode(const SlotAck& m) {
  std::string out(kSlotAckBytes, '\0');
  put<uint32_t>(out, 0, kSlotAckMagic);
  put<uint32_t>(out, 4, m.slot);
  return out;
}

template <>
Push decode<Push>(const std::string& p) {
  const Wire w = read(p, "push", 0, 0);
  Push m;
  m.param_id = w.param_id;
  m.name = w.name;
  m.step = w.step;
  m.offset = w.offset;
  m.count = w.count;
  m.slot = w.slot;
  m.kind = w.kind;
  m.attempt = w.attempt;
  return m;
}
template <>
Update decode<Update>(const std::string& p) {
  const Wire w = read(p, "update", -1, kFlagLast | kFlagApplied);  // -1: never-stepped momentum
  if (w.attempt != 0) fail("update", "field 'attempt' must be 0");
  Update m;
  m.param_id = w.param_id;
  m.name = w.name;
  m.step = w.step;
  m.offset = w.offset;
  m.count = w.count;
  m.slot = w.slot;
  m.kind = w.kind;
  m.last = (w.flags & kFlagLast) != 0;
  m.applied = (w.flags & kFlagApplied) != 0;
  return m;
}
template <>
SlotAck decode<SlotAck>(const std::string& p) {
  if (p.size() != kSlotAckBytes) {
    fail("slot_ack", "payload of " + std::to_string(p.size()) + " bytes, expected " +
                         std::to_string(kSlotAckBytes));
  }
  if (get<uint32_t>(p, 0) != kSlotAckMagic) fail("slot_ack", "bad magic");
  const auto slot = get<uint32_t>(p, 4);
  if (slot != kWakeSlot) check_range("slot_ack", "slot", slot, 0, 1 << 16);
  return {slot};
}

}  // namespace muon::transport

#include "transport/cuda_ipc_handle.hpp"

#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "transport/hex_bytes.hpp"

namespace muon::transport {
namespace {

const nlohmann::json& field(const nlohmann::json& j, const char* object, const char* name) {
  if (!j.is_object()) throw InvalidArgument(std::string(object) + ": not a JSON object");
  auto it = j.find(name);
  if (it == j.end()) throw InvalidArgument(std::string(object) + ": field '" + name + "' missing");
  return *it;
}

uint64_t unsigned_field(const nlohmann::json& j, const char* object, const char* name) {
  const auto& v = field(j, object, name);
  // Parsed text gives unsigned numbers; JSON built in C++ from an int gives signed ones.
  if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() >= 0) {
    return static_cast<uint64_t>(v.get<int64_t>());
  }
  if (!v.is_number_unsigned()) {
    throw InvalidArgument(std::string(object) + ": field '" + name +
                          "' must be a non-negative integer");
  }
  return v.get<uint64_t>();
}

IpcHandleBytes handle_field(const nlohmann::json& v, const std::string& what) {
  if (!v.is_string()) throw InvalidArgument(what + " must be a hex string");
  return ipc_handle_from_hex(v.get_ref<const std::string&>(), what);
}

std::vector<IpcHandleBytes> handle_list(const nlohmann::json& j, const char* name,
                                        uint64_t expected) {
  const auto& v = field(j, "device ring", name);
  if (!v.is_array() || v.size() != expected) {
    throw InvalidArgument("device ring: field '" + std::string(name) + "' must list " +
                          std::to_string(expected) + " event handles (one per slot)");
  }
  std::vector<IpcHandleBytes> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out.push_back(
        handle_field(v[i], "device ring: " + std::string(name) + "[" + std::to_string(i) + "]"));
  }
  return out;
}

nlohmann::json hex_list(const std::vector<IpcHandleBytes>& handles) {
  auto out = nlohmann::json::array();
  for (const auto& h : handles) out.push_back(ipc_handle_to_hex(h));
  return out;
}

}  // namespace

std::string ipc_handle_to_hex(const IpcHandleBytes& handle) {
  return to_hex(handle);
}

IpcHandleBytes ipc_handle_from_hex(std::string_view text, std::string_view what) {
  return from_hex<kIpcHandleBytes>(text, what);
}

nlohmann::json ring_descriptor_to_json(const DeviceRingDescriptor& ring) {
  return {{"memory", ipc_handle_to_hex(ring.memory)},
          {"slots", ring.slots},
          {"slot_bytes", ring.slot_bytes},
          {"ready", hex_list(ring.ready)},
          {"free", hex_list(ring.free)}};
}

DeviceRingDescriptor ring_descriptor_from_json(const nlohmann::json& j) {
  DeviceRingDescriptor ring;
  ring.memory = handle_field(field(j, "device ring", "memory"), "device ring: memory");
  ring.slots = unsigned_field(j, "device ring", "slots");
  ring.slot_bytes = unsigned_field(j, "device ring", "slot_bytes");
  if (ring.slots == 0 || ring.slot_bytes == 0) {
    throw InvalidArgument("device ring: slots and slot_bytes must be positive");
  }
  if (ring.slot_bytes > std::numeric_limits<uint64_t>::max() / ring.slots) {
    throw InvalidArgument("device ring: slots * slot_bytes overflows 64 bits");
  }
  ring.ready = handle_list(j, "ready", ring.slots);
  ring.free = handle_list(j, "free", ring.slots);
  return ring;
}

nlohmann::json region_to_json(const ExportedRegion& region) {
  return {{"memory", ipc_handle_to_hex(region.memory)},
          {"offset", region.offset},
          {"bytes", region.bytes}};
}

ExportedRegion region_from_json(const nlohmann::json& j) {
  ExportedRegion r;
  r.memory = handle_field(field(j, "exported region", "memory"), "exported region: memory");
  r.offset = unsigned_field(j, "exported region", "offset");
  r.bytes = unsigned_field(j, "exported region", "bytes");
  if (r.offset > std::numeric_limits<uint64_t>::max() - r.bytes) {
    throw InvalidArgument("exported region: offset + bytes overflows 64 bits");
  }
  return r;
}

}  // namespace muon::transport

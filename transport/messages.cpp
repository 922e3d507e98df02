#include "transport/messages.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/muon_option_fields.hpp"
#include "transport/shm_segment.hpp"

namespace muon::transport {
namespace {

using json = nlohmann::json;

// Reads fields of one message's JSON object, each checked for presence and type.
class Reader {
 public:
  Reader(const std::string& payload, const char* message) : message_(message) {
    try {
      j_ = json::parse(payload);
    } catch (const json::exception& e) {
      fail("payload is not valid JSON (" + std::string(e.what()) + ")");
    }
    if (!j_.is_object()) fail("payload must be a JSON object");
  }
  explicit Reader(json j, const char* message) : j_(std::move(j)), message_(message) {
    if (!j_.is_object()) fail("must be a JSON object");
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw ProtocolError(std::string(message_) + ": " + what);
  }
  const json& field(const char* name) const {
    auto it = j_.find(name);
    if (it == j_.end()) fail("missing field '" + std::string(name) + "'");
    return *it;
  }
  bool has(const char* name) const { return j_.contains(name); }

  std::string str(const char* name, size_t max_len = 4096) const {
    const auto& f = field(name);
    if (!f.is_string()) fail("field '" + std::string(name) + "' must be a string");
    auto s = f.get<std::string>();
    if (s.size() > max_len)
      fail("field '" + std::string(name) + "' is longer than " + std::to_string(max_len));
    return s;
  }
  std::string str_or(const char* name, const std::string& def) const {
    return has(name) ? str(name) : def;
  }
  int64_t i64(const char* name, int64_t lo = std::numeric_limits<int64_t>::min(),
              int64_t hi = std::numeric_limits<int64_t>::max()) const {
    const auto& f = field(name);
    if (!f.is_number_integer()) fail("field '" + std::string(name) + "' must be an integer");
    const int64_t v = f.get<int64_t>();
    if (v < lo || v > hi) {
      fail("field '" + std::string(name) + "' = " + std::to_string(v) + " is outside [" +
           std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return v;
  }
  int64_t i64_or(const char* name, int64_t def, int64_t lo = std::numeric_limits<int64_t>::min(),
                 int64_t hi = std::numeric_limits<int64_t>::max()) const {
    return has(name) ? i64(name, lo, hi) : def;
  }
  double num(const char* name) const {
    const auto& f = field(name);
    if (!f.is_number()) fail("field '" + std::string(name) + "' must be a number");
    return f.get<double>();
  }
  // A float field: a number within float's finite range (a larger one would become inf, which
  // encode() writes as null and nothing can read back, e.g. from a snapshot).
  float f32(const char* name) const {
    const double v = num(name);
    if (!(std::abs(v) <= std::numeric_limits<float>::max())) {
      fail("field '" + std::string(name) + "' = " + json(v).dump() +
           " is outside the range of a float");
    }
    return static_cast<float>(v);
  }
  bool boolean(const char* name) const {
    const auto& f = field(name);
    if (!f.is_boolean()) fail("field '" + std::string(name) + "' must be true or false");
    return f.get<bool>();
  }
  bool bool_or(const char* name, bool def) const { return has(name) ? boolean(name) : def; }
  const json& array(const char* name, size_t max_len) const {
    const auto& f = field(name);
    if (!f.is_array()) fail("field '" + std::string(name) + "' must be an array");
    if (f.size() > max_len)
      fail("field '" + std::string(name) + "' has more than " + std::to_string(max_len) +
           " entries");
    return f;
  }
  // Wraps a parser from kernels/ (which throws InvalidArgument) into a ProtocolError.
  template <class F>
  auto parse_name(const char* name, F&& parse) const {
    try {
      return parse(str(name, 64));
    } catch (const InvalidArgument& e) {
      fail("field '" + std::string(name) + "': " + e.message());
    }
  }

 private:
  json j_;
  const char* message_;
};

// Entries of a push / want list on the wire, and the ranges they may expand to (a column block
// of the largest matrices has one range per row: 53248 for a 405B model's FFN).
constexpr size_t kMaxRanges = 4096;
constexpr size_t kMaxExpandedRanges = size_t{1} << 20;
constexpr int64_t kMaxElements = int64_t{1} << 40;
// Registrants a replica seal may name: every compute rank of the largest world size a hello
// takes (2^20) and every relay (kMaxRelayServers).
constexpr size_t kMaxRegistrants = (size_t{1} << 20) + kMaxRelayServers;

// A push / want list: [begin, end) pairs and [begin, end, rows, pitch] blocks (RangeBlock),
// expanded here into ranges, in order.
std::vector<Range> read_ranges(const Reader& r, const char* name) {
  std::vector<RangeBlock> blocks;
  const std::string field = "field '" + std::string(name) + "'";
  for (const auto& e : r.array(name, kMaxRanges)) {
    const bool ints = e.is_array() && std::all_of(e.begin(), e.end(), [](const json& v) {
      return v.is_number_integer();
    });
    if (!ints || (e.size() != 2 && e.size() != 4)) {
      r.fail(field + " must hold [begin, end) integer pairs or [begin, end, rows, pitch] blocks");
    }
    Range g{e[0].get<int64_t>(), e[1].get<int64_t>()};
    if (g.begin < 0 || g.end < g.begin || g.end > kMaxElements) {
      r.fail(field + " holds an invalid range [" + std::to_string(g.begin) + ", " +
             std::to_string(g.end) + ")");
    }
    blocks.push_back(e.size() == 2 ? RangeBlock{g, 1, 0}
                                   : RangeBlock{g, e[2].get<int64_t>(), e[3].get<int64_t>()});
  }
  try {
    return ranges_of(blocks, kMaxExpandedRanges, kMaxElements, field);
  } catch (const InvalidArgument& e) {
    r.fail(e.message());
  }
}

// Runs of equal, equally spaced ranges go as one block (a column shard's rows).
json ranges_json(const std::vector<Range>& rs) {
  json a = json::array();
  for (const auto& b : blocks_of(rs)) {
    if (b.rows == 1) {
      a.push_back({b.first.begin, b.first.end});
    } else {
      a.push_back({b.first.begin, b.first.end, b.rows, b.pitch});
    }
  }
  return a;
}

// Commit attempt: optional (absent: 0, the first try).
uint32_t read_attempt(const Reader& r) {
  return static_cast<uint32_t>(r.i64_or("attempt", 0, 0, int64_t{1} << 30));
}

// MuonOptions inside a message: the field table's codec, its InvalidArgument as a ProtocolError
// naming the message.
MuonOptions read_options(const json& object, const char* message) {
  try {
    return options_from_json_object(object, OptionKeys::all_required);
  } catch (const InvalidArgument& e) {
    throw ProtocolError(std::string(message) + ": " + e.message());
  }
}

}  // namespace

std::string message_type_name(uint16_t type) {
  static const char* names[] = {"?",          "error",     "hello",          "hello_ok",
                                "health",     "health_ok", "register_param", "register_ok",
                                "push",       "push_ack",  "commit",         "update",
                                "update_ack", "snapshot",  "snapshot_ok",    "state_fetch",
                                "goodbye",    "status",    "status_ok",      "step_report"};
  if (type >= 1 && type < sizeof(names) / sizeof(names[0])) return names[type];
  return "type " + std::to_string(type);
}

const char* data_plane_name(DataPlane d) {
  switch (d) {
    case DataPlane::cuda_ipc:
      return "cuda_ipc";
    case DataPlane::nccl:
      return "nccl";
    default:
      return "shm";
  }
}

DataPlane parse_data_plane(const std::string& name) {
  if (name == "shm") return DataPlane::shm;
  if (name == "cuda_ipc") return DataPlane::cuda_ipc;
  if (name == "nccl") return DataPlane::nccl;
  throw InvalidArgument("unknown data plane '" + name + "' (expected shm, cuda_ipc or nccl)");
}

std::string options_to_json(const MuonOptions& options) {
  return options_to_json_object(options).dump();
}
MuonOptions options_from_json(const std::string& s) {
  json j;
  try {
    j = json::parse(s);
  } catch (const json::exception& e) {
    throw ProtocolError("options: payload is not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object()) throw ProtocolError("options: payload must be a JSON object");
  return read_options(j, "options");
}

// ---- encode ----
std::string encode(const Hello& m) {
  json j{{"rank", m.rank}, {"world_size", m.world_size}, {"client", m.client}};
  if (m.data_plane != DataPlane::shm) j["data_plane"] = data_plane_name(m.data_plane);
  if (!m.token.empty()) j["token"] = m.token;
  if (m.relay_server >= 0) j["relay_server"] = m.relay_server;
  if (m.replica_server >= 0) j["replica_server"] = m.replica_server;
  return j.dump();
}
uint64_t push_chunk_bytes(const HelloOk& ok) {
  return ok.data_plane == DataPlane::shm ? std::min(ok.slot_bytes, kShmChunkBytes) : ok.slot_bytes;
}

std::string encode(const HelloOk& m) {
  json j{{"session", m.session},   {"server_version", m.server_version},
         {"shm_name", m.shm_name}, {"tx_slots", m.tx_slots},
         {"rx_slots", m.rx_slots}, {"slot_bytes", m.slot_bytes}};
  if (m.data_plane != DataPlane::shm) j["data_plane"] = data_plane_name(m.data_plane);
  if (m.tx_ring) j["tx_ring"] = ring_descriptor_to_json(*m.tx_ring);
  if (m.rx_ring) j["rx_ring"] = ring_descriptor_to_json(*m.rx_ring);
  if (m.nccl_tx_id) j["nccl_tx_id"] = nccl_id_to_hex(*m.nccl_tx_id);
  if (m.nccl_rx_id) j["nccl_rx_id"] = nccl_id_to_hex(*m.nccl_rx_id);
  if (!m.snapshot_path.empty()) j["snapshot_path"] = m.snapshot_path;
  if (m.snapshot_every > 0) j["snapshot_every"] = m.snapshot_every;
  return j.dump();
}
std::string encode(const HealthOk& m) {
  return json{{"ready", m.ready}, {"sessions", m.sessions}, {"parameters", m.parameters}}.dump();
}
std::string encode(const RegisterParam& m) {
  json j{{"name", m.name},
         {"shape", m.shape},
         {"grad_dtype", dtype_name(m.grad_dtype)},
         {"update_dtype", dtype_name(m.update_dtype)},
         {"options", options_to_json_object(m.options)},
         {"push", ranges_json(m.push)},
         {"want", ranges_json(m.want)},
         {"job", m.job},
         {"resume", m.resume},
         {"packed", m.packed}};
  if (m.replica) {
    j["replica"] = true;
    j["replica_step"] = m.replica_step;
    j["replica_outcome"] = m.replica_outcome;
    if (!m.replica_registrants.empty()) {
      json rs = json::array();
      for (const auto& r : m.replica_registrants) {
        rs.push_back({{"rank", r.rank},
                      {"push", ranges_json(r.push)},
                      {"want", ranges_json(r.want)},
                      {"packed", r.packed}});
      }
      j["replica_registrants"] = std::move(rs);
    }
  }
  return j.dump();
}
std::string encode(const RegisterOk& m) {
  json j{{"name", m.name}, {"contributors", m.contributors}, {"last_step", m.last_step}};
  if (m.param_id != kNoParamId) j["param_id"] = m.param_id;
  return j.dump();
}
std::string encode(const Commit& m) {
  return json{{"name", m.name}, {"step", m.step}, {"attempt", m.attempt}}.dump();
}
std::string encode(const ErrorMsg& m) {
  return json{{"code", std::string(error_code_name(m.code))},
              {"code_id", static_cast<int>(m.code)},
              {"message", m.message},
              {"param", m.param},
              {"step", m.step},
              {"rank", m.rank}}
      .dump(-1, ' ', false, json::error_handler_t::replace);  // a message may quote bad bytes
}
std::string encode(const SnapshotRequest& m) {
  return json{{"path", m.path}}.dump();
}
std::string encode(const SnapshotOk& m) {
  return json{{"path", m.path}, {"parameters", m.parameters}}.dump();
}
std::string encode(const StateFetch& m) {
  json j{{"name", m.name}};
  if (m.after_step >= 0) j["after_step"] = m.after_step;
  return j.dump();
}
std::string encode(const StepReport& m) {
  return json{{"step", m.step},
              {"exposed_wait_ns", m.exposed_wait_ns},
              {"bytes_pushed", m.bytes_pushed},
              {"parameters", m.parameters},
              {"slowest_parameter", m.slowest_parameter}}
      .dump();
}

// ---- decode ----
constexpr int64_t kMaxStep = int64_t{1} << 53;
constexpr size_t kMaxName = 512;

template <>
Hello decode<Hello>(const std::string& p) {
  Reader r(p, "hello");
  Hello m;
  m.world_size = static_cast<int>(r.i64("world_size", 1, 1 << 20));
  if (r.has("relay_server") && r.has("replica_server")) {
    r.fail("a hello names a relay_server or a replica_server, not both");
  }
  if (r.has("relay_server")) {
    m.relay_server = static_cast<int>(r.i64("relay_server", 0, kMaxRelayServers - 1));
    const int64_t want = relay_rank(m.world_size, m.relay_server);
    m.rank = static_cast<int>(r.i64("rank", want, want));
  } else if (r.has("replica_server")) {
    m.replica_server = static_cast<int>(r.i64("replica_server", 0, kMaxRelayServers - 1));
    const int64_t want = replica_rank(m.world_size, m.replica_server);
    m.rank = static_cast<int>(r.i64("rank", want, want));
  } else {
    m.rank = static_cast<int>(r.i64("rank", 0, m.world_size - 1));
  }
  m.client = r.str_or("client", "");
  if (r.has("data_plane")) m.data_plane = r.parse_name("data_plane", parse_data_plane);
  m.token = r.has("token") ? r.str("token", 256) : "";
  return m;
}
template <>
HelloOk decode<HelloOk>(const std::string& p) {
  Reader r(p, "hello_ok");
  HelloOk m;
  m.session = r.str("session");
  m.server_version = r.str("server_version");
  m.shm_name = r.str("shm_name", 255);
  m.tx_slots = static_cast<uint32_t>(r.i64("tx_slots", 1, 1 << 16));
  m.rx_slots = static_cast<uint32_t>(r.i64("rx_slots", 1, 1 << 16));
  m.slot_bytes = static_cast<uint64_t>(r.i64("slot_bytes", 64, int64_t{1} << 32));
  if (r.has("data_plane")) m.data_plane = r.parse_name("data_plane", parse_data_plane);
  if (m.data_plane == DataPlane::cuda_ipc) {
    const auto ring = [&](const char* name, uint64_t slots) {
      DeviceRingDescriptor d;
      try {
        d = ring_descriptor_from_json(r.field(name));
      } catch (const InvalidArgument& e) {
        r.fail("field '" + std::string(name) + "': " + e.message());
      }
      if (d.slots != slots || d.slot_bytes != m.slot_bytes) {
        r.fail("field '" + std::string(name) + "' describes " + std::to_string(d.slots) + " x " +
               std::to_string(d.slot_bytes) + " bytes, the session " + std::to_string(slots) +
               " x " + std::to_string(m.slot_bytes));
      }
      return d;
    };
    m.tx_ring = ring("tx_ring", m.tx_slots);
    m.rx_ring = ring("rx_ring", m.rx_slots);
  }
  if (m.data_plane == DataPlane::nccl) {
    const auto id = [&](const char* name) {
      try {
        return nccl_id_from_hex(r.str(name, 2 * kNcclIdBytes));
      } catch (const InvalidArgument& e) {
        r.fail("field '" + std::string(name) + "': " + e.message());
      }
    };
    m.nccl_tx_id = id("nccl_tx_id");
    m.nccl_rx_id = id("nccl_rx_id");
  }
  if (r.has("snapshot_path")) m.snapshot_path = r.str("snapshot_path");
  if (r.has("snapshot_every")) m.snapshot_every = r.i64("snapshot_every", 0, int64_t{1} << 40);
  return m;
}
template <>
HealthOk decode<HealthOk>(const std::string& p) {
  Reader r(p, "health_ok");
  return {r.boolean("ready"), static_cast<int>(r.i64("sessions", 0)),
          static_cast<int>(r.i64("parameters", 0))};
}
template <>
RegisterParam decode<RegisterParam>(const std::string& p) {
  Reader r(p, "register_param");
  RegisterParam m;
  m.name = r.str("name", kMaxName);
  if (m.name.empty()) r.fail("field 'name' must not be empty");
  for (const auto& e : r.array("shape", 3)) {
    if (!e.is_number_integer() || e.get<int64_t>() <= 0 || e.get<int64_t>() > (int64_t{1} << 31)) {
      r.fail("field 'shape' must hold positive integers");
    }
    m.shape.push_back(e.get<int64_t>());
  }
  if (m.shape.size() < 2) {
    r.fail("parameter '" + m.name +
           "': field 'shape' must be [rows, cols] or [batch, rows, cols]; " +
           "a flat buffer without a matrix shape is refused");
  }
  m.grad_dtype = r.parse_name("grad_dtype", parse_dtype);
  m.update_dtype = r.parse_name("update_dtype", parse_dtype);
  const auto& opts = r.field("options");
  if (!opts.is_object()) r.fail("field 'options' must be an object");
  m.options = read_options(opts, "register_param.options");
  m.push = read_ranges(r, "push");
  m.want = read_ranges(r, "want");
  m.job = r.has("job") ? r.str("job", kMaxJob) : "";  // absent from older clients: no identity
  m.resume = r.bool_or("resume", false);
  m.packed = r.bool_or("packed", false);  // absent from older clients: element offsets
  m.replica = r.bool_or("replica", false);
  if (m.replica) {
    m.replica_step = r.i64("replica_step", -1, kMaxStep);
    m.replica_outcome = r.str("replica_outcome", 64);
    if (r.has("replica_registrants")) {
      for (const auto& e : r.array("replica_registrants", kMaxRegistrants)) {
        if (!e.is_object()) r.fail("field 'replica_registrants' must hold objects");
        const Reader g(e, "register_param.replica_registrants[]");
        m.replica_registrants.push_back(
            {static_cast<int>(g.i64("rank", 0, std::numeric_limits<int>::max())),
             read_ranges(g, "push"), read_ranges(g, "want"), g.bool_or("packed", false)});
      }
    }
  }
  return m;
}
template <>
RegisterOk decode<RegisterOk>(const std::string& p) {
  Reader r(p, "register_ok");
  RegisterOk m{r.str("name", kMaxName), static_cast<int>(r.i64("contributors", 0)),
               r.i64("last_step", -1, kMaxStep)};
  if (r.has("param_id")) m.param_id = static_cast<uint32_t>(r.i64("param_id", 0, kMaxParamIds - 1));
  return m;
}
template <>
Commit decode<Commit>(const std::string& p) {
  Reader r(p, "commit");
  Commit m{r.str("name", kMaxName), r.i64("step", 0, kMaxStep)};
  m.attempt = read_attempt(r);
  return m;
}
template <>
ErrorMsg decode<ErrorMsg>(const std::string& p) {
  Reader r(p, "error");
  ErrorMsg m;
  const std::string name = r.str("code", 64);
  const auto named = error_code_from_name(name);
  m.code = named.value_or(ErrorCode::internal);
  if (r.has("code_id")) {
    const auto id = static_cast<int>(r.i64("code_id", 0, 1 << 20));
    if (named && error_code_from_int(id) && static_cast<int>(*named) != id) {
      r.fail("field 'code_id' = " + std::to_string(id) + " is not the code '" + name + "' (" +
             std::to_string(static_cast<int>(*named)) + ")");
    }
  }
  m.message = r.str("message");
  m.param = r.str_or("param", "");
  m.step = r.i64_or("step", -1);
  m.rank = static_cast<int>(r.i64_or("rank", -1));
  return m;
}
template <>
SnapshotRequest decode<SnapshotRequest>(const std::string& p) {
  Reader r(p, "snapshot");
  return {r.str_or("path", "")};
}
template <>
SnapshotOk decode<SnapshotOk>(const std::string& p) {
  Reader r(p, "snapshot_ok");
  return {r.str("path"), static_cast<int>(r.i64("parameters", 0))};
}
template <>
StateFetch decode<StateFetch>(const std::string& p) {
  Reader r(p, "state_fetch");
  StateFetch m{r.str("name", kMaxName)};
  if (r.has("after_step")) m.after_step = r.i64("after_step", 0, kMaxStep);
  return m;
}
template <>
StepReport decode<StepReport>(const std::string& p) {
  Reader r(p, "step_report");
  StepReport m;
  m.step = r.i64("step", -1, kMaxStep);
  m.exposed_wait_ns = r.i64("exposed_wait_ns", 0, int64_t{1} << 62);
  m.bytes_pushed = r.i64("bytes_pushed", 0, int64_t{1} << 62);
  m.parameters = static_cast<int>(r.i64_or("parameters", 0, 0, 1 << 30));
  m.slowest_parameter = r.has("slowest_parameter") ? r.str("slowest_parameter", kMaxName) : "";
  return m;
}

}  // namespace muon::transport

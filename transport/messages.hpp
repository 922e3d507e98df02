// Control-plane messages: typed structs, their JSON payloads, and strict validation. Every field
// a peer sends is checked here before anything else looks at it; a bad field raises ProtocolError
// naming the message and the field. The data chunks (Push, Update, SlotAck) travel as fixed
// binary payloads instead (chunk_header.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/error_code.hpp"
#include "kernels/dtype.hpp"
#include "kernels/muon_options.hpp"
#include "kernels/range_set.hpp"
#include "transport/chunk_header.hpp"
#include "transport/cuda_ipc_handle.hpp"
#include "transport/frame.hpp"
#include "transport/nccl_id.hpp"

namespace muon::transport {

enum class MessageType : uint16_t {
  error = 1,           ///< S->C  ErrorMsg
  hello = 2,           ///< C->S  Hello
  hello_ok = 3,        ///< S->C  HelloOk
  health = 4,          ///< C->S  (empty)
  health_ok = 5,       ///< S->C  HealthOk
  register_param = 6,  ///< C->S  RegisterParam
  register_ok = 7,     ///< S->C  RegisterOk, once every rank of the job registered the parameter
  push = 8,            ///< C->S  Push: data sits in a tx ring slot
  push_ack = 9,        ///< S->C  SlotAck: the tx slot is free again (a credit)
  commit = 10,         ///< C->S  Commit: this rank's contribution for (name, step) is complete
  update = 11,         ///< S->C  Update: data sits in an rx ring slot
  update_ack = 12,     ///< C->S  SlotAck: the rx slot is free again
  snapshot = 13,       ///< C->S  SnapshotRequest
  snapshot_ok = 14,    ///< S->C  SnapshotOk
  state_fetch = 15,    ///< C->S  StateFetch: send this parameter's momentum as Update chunks
  goodbye = 16,        ///< C->S  (empty): orderly disconnect
  status = 17,         ///< C->S  (empty)
  status_ok = 18,      ///< S->C  free-form JSON status
  step_report = 19,    ///< C->S  StepReport: a rank's figures of a step it finished (no answer)
};

/// Readable name of a message type ("register_param"), or "type <n>".
std::string message_type_name(uint16_t type);

// The element type (kernels/dtype.hpp) and element ranges (kernels/range_set.hpp) of the data
// plane, under the names the protocol has always used.
using muon::DType;
using muon::dtype_bytes;
using muon::dtype_name;
using muon::parse_dtype;
using muon::Range;
using muon::RangeBlock;

/// How a session's gradient and update bytes move (the control plane is always the socket):
///   shm       host shared memory: one segment per session holding both rings (any backend);
///   cuda_ipc  device memory of the server's GPU: the server exports a receive ring and a result
///             ring (transport/cuda_ipc.hpp), the client copies into and out of them with
///             cudaMemcpyAsync on its own stream. Needs a server on the CUDA backend, on the same
///             node.
///   nccl      NCCL point-to-point between the client's GPU and the server's (another node, or
///             across an NVL72 domain): two communicators of 2 ranks per session (client ->
///             server gradients, server -> client updates; server rank 0, client rank 1), their
///             ids sent in hello_ok. Needs a server on the CUDA backend built with NCCL.
enum class DataPlane : uint8_t { shm, cuda_ipc, nccl };
const char* data_plane_name(DataPlane d);
/// "shm", "cuda_ipc" or "nccl"; throws InvalidArgument listing them otherwise.
DataPlane parse_data_plane(const std::string& name);

/// What a data-plane chunk carries. replica_momentum and replica_update travel only on a
/// replica session (an owner streaming a parameter's state to its buddy, daemon/pool/replicator.hpp):
/// the momentum after a step and that step's update, fp32.
enum class ChunkKind : uint8_t { gradient, momentum, replica_momentum, replica_update };

/// Relay sessions: a server that relays a domain's partial sums to their owner (daemon/pool/relay.hpp)
/// says hello as rank relay_rank(world_size, its plan id), above every compute rank, so that
/// the owner sums it after the compute ranks that push to it directly, in server-id order.
inline int relay_rank(int world_size, int server_id) {
  return world_size + server_id;
}
/// Plan server ids a relay may have (hello.relay_server).
constexpr int kMaxRelayServers = 1 << 16;
/// Replica sessions: an owner streaming its parameters' state to its buddy server
/// (daemon/pool/replicator.hpp) says hello as rank replica_rank(world_size, its plan id), above every
/// relay rank (a server may hold a relay session and a replica session to the same peer).
inline int replica_rank(int world_size, int server_id) {
  return world_size + kMaxRelayServers + server_id;
}

struct Hello {
  int rank = 0;        ///< this compute rank, 0 <= rank < world_size; a relay: relay_rank(...)
  int world_size = 1;  ///< compute ranks of the job that talk to this server
  std::string client;  ///< free text for logs ("trainer pid 1234")
  /// The data plane the client asks for (optional on the wire: absent = shm). A server that
  /// cannot serve it refuses the hello with an error saying why.
  DataPlane data_plane = DataPlane::shm;
  /// The server's shared secret (--auth-token-file), required on a TCP control connection
  /// (optional on the wire; ignored on a Unix socket, where peer credentials are checked).
  std::string token;
  /// -1 for a compute rank. A relay server's plan id (0 <= id < kMaxRelayServers; optional on
  /// the wire): the session is that server forwarding its domain's partial sums, and rank must
  /// be relay_rank(world_size, relay_server).
  int relay_server = -1;
  /// -1, or the plan id of an owner server opening a replica session (optional on the wire):
  /// rank must then be replica_rank(world_size, replica_server).
  int replica_server = -1;
};

struct HelloOk {
  std::string session;         ///< session id for logs
  std::string server_version;  ///< "muon-offloadd 0.1.0"
  std::string shm_name;        ///< the session's shared-memory segment; unlinked once mapped
  uint32_t tx_slots = 0;       ///< client -> server ring slots
  uint32_t rx_slots = 0;       ///< server -> client ring slots
  uint64_t slot_bytes = 0;     ///< bytes per slot
  /// The session's data plane (optional on the wire: absent = shm). For cuda_ipc, shm_name is
  /// empty and the rings are exported device memory: tx_ring receives gradients (client ->
  /// server), rx_ring returns updates; their slots and slot bytes equal the fields above.
  DataPlane data_plane = DataPlane::shm;
  std::optional<DeviceRingDescriptor> tx_ring, rx_ring;
  /// For nccl: the ncclUniqueIds of the session's two communicators (server rank 0, client
  /// rank 1): tx carries gradients to the server, rx updates back. The client joins tx, then rx.
  std::optional<NcclIdBytes> nccl_tx_id, nccl_rx_id;
  /// What survives a crash of this server (optional on the wire: absent = "" and 0): its
  /// --snapshot path ("" none) and --snapshot-every steps (0: only on request and at shutdown).
  std::string snapshot_path;
  int64_t snapshot_every = 0;
};

/// The most bytes one push chunk carries in the session `ok` describes: a slot, and on shm at
/// most transport::kShmChunkBytes (256 KiB; transport/shm_segment.hpp says why).
uint64_t push_chunk_bytes(const HelloOk& ok);

struct HealthOk {
  bool ready = true;
  int sessions = 0;
  int parameters = 0;
};

/// One registrant of a parameter and the ranges it registered, as the owner holds them (a
/// replica seal's RegisterParam::replica_registrants).
struct RegistrantRanges {
  int rank = 0;  ///< a compute rank, or a relay's rank (relay_rank)
  std::vector<Range> push;
  std::vector<Range> want;
  bool packed = false;
};

struct RegisterParam {
  std::string name;
  std::vector<int64_t> shape;  ///< [rows, cols] or [batch, rows, cols]
  DType grad_dtype = DType::f32;
  DType update_dtype = DType::f32;
  MuonOptions options;
  /// Element ranges this rank contributes (may be empty). On the wire a list of [begin, end)
  /// pairs and [begin, end, rows, pitch] blocks (RangeBlock: a column shard's row range x
  /// column range in one entry; encode() makes them of runs of equal, equally spaced ranges),
  /// expanded into ranges by decode().
  std::vector<Range> push;
  std::vector<Range> want;  ///< element ranges of the update this rank receives (as `push`)
  /// The training job registering it: the same string on every rank of the job (optional on
  /// the wire, at most kMaxJob bytes; "" = no identity: state is kept by name across jobs, the
  /// behaviour of clients before job identities). A registration of another job than the one
  /// that registered the parameter, once none of that job's ranks is connected, registers it
  /// anew: fresh (momentum and step dropped) or, with `resume`, keeping momentum and step
  /// (daemon/README.md, "Jobs").
  std::string job;
  bool resume = false;  ///< optional on the wire (absent = false)
  /// Optional on the wire (absent = false: element offsets, the clients before it). True: the
  /// `offset` of this rank's gradient Push chunks and of the Update chunks it receives for the
  /// parameter is a packed position — an index into its push (want) ranges sorted and laid end
  /// to end — and a chunk may span several ranges, so a column block travels as one push and
  /// one update (as many chunks as its bytes need slots). Momentum chunks (state loading,
  /// state_fetch) keep element offsets over the whole parameter.
  bool packed = false;
  /// On a replica session only (optional on the wire, absent = false): not a registration but
  /// the seal of a replica: the replica_momentum (numel fp32) and replica_update chunks of
  /// replica_step pushed before it are the buddy's copy of the parameter from now on; the
  /// buddy answers register_ok with last_step = replica_step. replica_outcome: "registered"
  /// (no step yet, or the restored state: no update), "applied", "skipped" (update zeros), or
  /// the error code of a refused step ("non_finite", "backend").
  bool replica = false;
  int64_t replica_step = -1;
  std::string replica_outcome;
  /// On a seal (optional on the wire, absent = none: an owner that predates it): the owner's
  /// registrants and the ranges each registered. A takeover's registration is complete with the
  /// first of them that registers at the buddy (daemon/registry/registry.cpp): a rank that had
  /// the lost owner's last update comes only at its next step, which may wait, through a
  /// collective, for a rank whose update the takeover owes.
  std::vector<RegistrantRanges> replica_registrants;
};
/// Bytes a RegisterParam::job may have.
constexpr size_t kMaxJob = 256;

struct RegisterOk {
  std::string name;
  int contributors = 0;    ///< contributions summed into every element
  int64_t last_step = -1;  ///< last step applied (from a restored snapshot), -1 when none
  /// The id this session's Push and Update chunks name the parameter by (chunk_header.hpp);
  /// optional on the wire (absent = kNoParamId: the answer to a replica seal, whose chunks
  /// carry their name).
  uint32_t param_id = kNoParamId;
};

/// A binary chunk (transport/chunk_header.hpp): on the wire param_id, or the name where no id
/// exists (replica chunks); the receiver resolves the one into the other.
struct Push {
  std::string name;
  int64_t step = 0;
  /// First element; under a packed registration (RegisterParam::packed) a gradient chunk's
  /// packed position in the rank's push ranges.
  int64_t offset = 0;
  int64_t count = 0;   ///< elements in the slot
  uint32_t slot = 0;
  ChunkKind kind = ChunkKind::gradient;
  /// Which try of this step the rank is on: 0, raised by the client each time the step failed
  /// for it (a retry). A higher attempt discards what the rank pushed for the step before, so
  /// chunks still in flight from a failed try are never summed into the retry.
  uint32_t attempt = 0;
  uint32_t param_id = kNoParamId;  ///< RegisterOk::param_id; kNoParamId: `name` travels
};

struct SlotAck {
  uint32_t slot = 0;
};

struct Commit {
  std::string name;
  int64_t step = 0;
  uint32_t attempt = 0;  ///< as Push::attempt
};

/// A binary chunk (transport/chunk_header.hpp), naming its parameter by param_id.
struct Update {
  std::string name;
  int64_t step = 0;
  int64_t offset = 0;  ///< first element; a packed position in the want ranges (as Push::offset)
  int64_t count = 0;
  uint32_t slot = 0;
  ChunkKind kind = ChunkKind::gradient;  ///< gradient: an update; momentum: state_fetch data
  bool last = false;                     ///< the last chunk of this (name, step) for this client
  bool applied = true;  ///< false when the step was skipped (non-finite policy skip): zeros
  uint32_t param_id = kNoParamId;  ///< RegisterOk::param_id of the receiving session
};

/// On the wire as {"code": name, "code_id": integer} (core/error_code.hpp: error_code_name is the
/// one spelling); code_id is optional when decoding (a peer that predates it) and must name the
/// same code as `code` when both are known to this build. A name this build does not know (a
/// newer peer's) decodes as ErrorCode::internal.
struct ErrorMsg {
  ErrorCode code = ErrorCode::internal;  ///< why: bad_request, peer_lost, timeout, ...
  std::string message;  ///< readable, names the parameter / rank involved
  std::string param;    ///< empty when not about one parameter
  int64_t step = -1;
  int rank = -1;  ///< the rank the error is about (a lost peer), -1 when none
};

struct SnapshotRequest {
  std::string path;  ///< empty: the server's configured snapshot path
};

struct SnapshotOk {
  std::string path;
  int parameters = 0;
};

struct StateFetch {
  std::string name;
  /// The step the asker expects the momentum to hold (its optimizer's last step), -1 for
  /// whatever the server holds now. The server answers once the parameter's step has reached it
  /// and none is computing, or after its step timeout with what it holds: a rank that wants no
  /// update of the parameter (an empty shard) finishes its step() before the others' pushes.
  int64_t after_step = -1;
};

/// What a compute rank saw of one optimizer step, sent once it holds every update of the step
/// (to every server of the job). The server observes it into its metrics and its status.
struct StepReport {
  int64_t step = 0;               ///< the optimizer's step (a label; not checked against params)
  int64_t exposed_wait_ns = 0;    ///< time the rank was blocked waiting for updates, >= 0
  int64_t bytes_pushed = 0;       ///< gradient bytes the rank pushed for the step, >= 0
  int parameters = 0;             ///< updates the rank waited for
  std::string slowest_parameter;  ///< the parameter whose update arrived last ("" when none)
};

// ---- Payloads: JSON, except Push, Update and SlotAck, binary (chunk_header.hpp, defined in
// chunk_header.cpp). encode() never fails; decode() throws ProtocolError naming the field. ----
std::string encode(const Hello&);
std::string encode(const HelloOk&);
std::string encode(const HealthOk&);
std::string encode(const RegisterParam&);
std::string encode(const RegisterOk&);
std::string encode(const Push&);
std::string encode(const SlotAck&);
std::string encode(const Commit&);
std::string encode(const Update&);
std::string encode(const ErrorMsg&);
std::string encode(const SnapshotRequest&);
std::string encode(const SnapshotOk&);
std::string encode(const StateFetch&);
std::string encode(const StepReport&);

template <class T>
T decode(const std::string& payload);

/// MuonOptions <-> the JSON object of every field of kernels/muon_option_fields.hpp (all of
/// them required when decoding); decode errors are ProtocolError "options: field ...".
std::string options_to_json(const MuonOptions& options);
MuonOptions options_from_json(const std::string& json_object);

}  // namespace muon::transport

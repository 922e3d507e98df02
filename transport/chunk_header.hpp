// Data-chunk frames (push, update, push_ack, update_ack): fixed little-endian binary payloads
// instead of JSON; the control plane (hello, register_param, commit, errors, ...) stays JSON.
// A chunk names its parameter by the id the server handed out in register_ok
// (RegisterOk::param_id, per session, 0, 1, 2, ... in registration order), not by name.
//
// Push and Update payload: a 48-byte header, then name_bytes of name (replica chunks only):
//   offset 0  u32 magic      kChunkMagic ("CHNK")
//          4  u8  kind       ChunkKind (0 gradient, 1 momentum, 2 replica_momentum,
//                            3 replica_update)
//          5  u8  flags      Update: bit 0 last, bit 1 applied; a Push: 0. Other bits: 0.
//          6  u16 name_bytes 0, or the length of the name that follows the header
//          8  u32 param_id   the session's id of the parameter; kNoParamId when a name follows
//         12  u32 slot       ring slot, <= 65536
//         16  u32 attempt    Push::attempt (<= 2^30); an Update: 0
//         20  u32 reserved   0
//         24  i64 step       a Push: [0, 2^53]; an Update: [-1, 2^53]
//         32  i64 offset     [0, 2^40]
//         40  i64 count      [0, 2^40]
// A chunk carries exactly one of param_id and name: a name (1..512 bytes) only where its sender
// holds no id: the replica chunks an owner streams to its buddy before the register_param that
// seals them (daemon/pool/replicator.hpp), and a client's push of a parameter whose registration was
// never answered on its connection (the server then refuses it by name, as before ids).
//
// push_ack / update_ack payload (SlotAck), 8 bytes: u32 magic kSlotAckMagic ("SACK"), u32 slot
// (<= 65536, or a push_ack's kWakeSlot: a shm session's wake-up, transport/shm_credits.hpp).
//
// Every field is checked when decoding: a short, long or malformed payload throws ProtocolError
// naming the message and the field. encode()/decode<>() of Push, Update and SlotAck are declared
// in transport/messages.hpp beside the other messages.
#pragma once

#include <cstddef>
#include <cstdint>

namespace muon::transport {

inline constexpr uint32_t kChunkMagic = 0x4B4E4843;    // "CHNK" little-endian
inline constexpr uint32_t kSlotAckMagic = 0x4B434153;  // "SACK" little-endian
inline constexpr size_t kChunkHeaderBytes = 48;
inline constexpr size_t kSlotAckBytes = 8;
/// Push/Update::param_id of a chunk that names its parameter instead (replica chunks).
inline constexpr uint32_t kNoParamId = 0xFFFFFFFFu;
/// Ids a session hands out (parameters registered through one connection).
inline constexpr uint32_t kMaxParamIds = 1u << 24;

}  // namespace muon::transport

// The control-plane frame: a fixed 16-byte little-endian header and a JSON payload (a binary one
// for data chunks, transport/chunk_header.hpp). Gradient and
// update bytes never travel in frames; they move through a data-plane transport (shared memory,
// CUDA IPC, NCCL) and frames only say where they are.
//
//   offset 0  u32 magic   "MUON" (0x4E4F554D)
//          4  u16 version protocol version (kProtocolVersion)
//          6  u16 type    MessageType
//          8  u32 length  payload bytes, <= kMaxPayload
//         12  u32 request id, echoed by the reply (0 for unsolicited messages)
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace muon::transport {

inline constexpr uint32_t kFrameMagic = 0x4E4F554D;  // "MUON" little-endian
/// 3: a shm session's tx credits are in its segment (transport/shm_credits.hpp; its push_ack
/// only wakes a sleeping pusher); 2: data chunks (push, update and their acks) are binary and
/// name parameters by id (transport/chunk_header.hpp); 1 carried them as JSON with names.
inline constexpr uint16_t kProtocolVersion = 3;
inline constexpr size_t kFrameHeaderBytes = 16;
/// Largest accepted payload: control messages are small; anything bigger is a bug or an attack.
inline constexpr uint32_t kMaxPayload = 1u << 20;

/// A malformed, truncated, oversized or unexpected frame or message. The server answers it with
/// an error to that client only and drops that session when the byte stream cannot be trusted.
class ProtocolError : public Error {
 public:
  explicit ProtocolError(const std::string& message,
                         std::source_location where = std::source_location::current())
      : Error(message, where) {}
};

/// Decoded frame header.
struct FrameHeader {
  uint16_t version = kProtocolVersion;
  uint16_t type = 0;
  uint32_t length = 0;
  uint32_t request_id = 0;
};

/// One frame: header fields and payload bytes.
struct Frame {
  uint16_t type = 0;
  uint32_t request_id = 0;
  std::string payload;
};

/// Serializes a frame (header + payload). Throws ProtocolError when the payload exceeds
/// kMaxPayload.
std::vector<std::byte> encode_frame(const Frame& frame);

/// Parses and validates 16 header bytes: magic, version (== kProtocolVersion, else a
/// ProtocolError saying both versions) and length (<= kMaxPayload).
FrameHeader decode_frame_header(const std::byte* bytes);

/// Incremental decoder for a byte stream: feed() what arrives, next() returns complete frames in
/// order. After a ProtocolError the stream is out of sync and the decoder stays failed.
class FrameDecoder {
 public:
  /// Appends received bytes. Throws ProtocolError once a bad header is seen.
  void feed(const std::byte* data, size_t size);
  /// The next complete frame, if any.
  std::optional<Frame> next();
  /// Bytes buffered but not yet returned as frames, a header already parsed included.
  size_t buffered() const { return unread() + (pending_ ? kFrameHeaderBytes : 0); }

 private:
  size_t unread() const { return buffer_.size() - consumed_; }

  std::vector<std::byte> buffer_;
  size_t consumed_ = 0;
  std::optional<FrameHeader> pending_;
  bool failed_ = false;
};

}  // namespace muon::transport

#include "transport/frame.hpp"

#include <cstring>

namespace muon::transport {
namespace {

void put_u16(std::byte* p, uint16_t v) {
  p[0] = std::byte(v & 0xff);
  p[1] = std::byte(v >> 8);
}
void put_u32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte((v >> (8 * i)) & 0xff);
}
uint16_t get_u16(const std::byte* p) {
  return static_cast<uint16_t>(std::to_integer<uint16_t>(p[0]) |
                               (std::to_integer<uint16_t>(p[1]) << 8));
}
uint32_t get_u32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::to_integer<uint32_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

std::vector<std::byte> encode_frame(const Frame& frame) {
  if (frame.payload.size() > kMaxPayload) {
    throw ProtocolError("frame payload of " + std::to_string(frame.payload.size()) +
                        " bytes exceeds the limit of " + std::to_string(kMaxPayload));
  }
  std::vector<std::byte> out(kFrameHeaderBytes + frame.payload.size());
  put_u32(out.data(), kFrameMagic);
  put_u16(out.data() + 4, kProtocolVersion);
  put_u16(out.data() + 6, frame.type);
  put_u32(out.data() + 8, static_cast<uint32_t>(frame.payload.size()));
  put_u32(out.data() + 12, frame.request_id);
  if (!frame.payload.empty()) {
    std::memcpy(out.data() + kFrameHeaderBytes, frame.payload.data(), frame.payload.size());
  }
  return out;
}

FrameHeader decode_frame_header(const std::byte* bytes) {
  const uint32_t magic = get_u32(bytes);
  if (magic != kFrameMagic) {
    throw ProtocolError("bad frame magic 0x" + [&] {
      char buf[9];
      std::snprintf(buf, sizeof buf, "%08x", magic);
      return std::string(buf);
    }() + " (not a muon-offload peer, or the stream lost sync)");
  }
  FrameHeader h;
  h.version = get_u16(bytes + 4);
  if (h.version != kProtocolVersion) {
    throw ProtocolError("protocol version mismatch: peer speaks " + std::to_string(h.version) +
                        ", this build speaks " + std::to_string(kProtocolVersion));
  }
  h.type = get_u16(bytes + 6);
  h.length = get_u32(bytes + 8);
  h.request_id = get_u32(bytes + 12);
  if (h.length > kMaxPayload) {
    throw ProtocolError("frame payload of " + std::to_string(h.length) +
                        " bytes exceeds the limit of " + std::to_string(kMaxPayload));
  }
  return h;
}

void FrameDecoder::feed(const std::byte* data, size_t size) {
  if (failed_) throw ProtocolError("frame stream already failed; reconnect");
  // Compact once the consumed prefix dominates, so the buffer does not grow without bound.
  if (consumed_ > 0 && consumed_ * 2 >= buffer_.size()) {
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(consumed_));
    consumed_ = 0;
  }
  buffer_.insert(buffer_.end(), data, data + size);
}

std::optional<Frame> FrameDecoder::next() {
  if (failed_) return std::nullopt;
  if (!pending_) {
    if (unread() < kFrameHeaderBytes) return std::nullopt;
    try {
      pending_ = decode_frame_header(buffer_.data() + consumed_);
    } catch (...) {
      failed_ = true;
      throw;
    }
    consumed_ += kFrameHeaderBytes;
  }
  if (unread() < pending_->length) return std::nullopt;
  Frame f;
  f.type = pending_->type;
  f.request_id = pending_->request_id;
  f.payload.assign(reinterpret_cast<const char*>(buffer_.data() + consumed_), pending_->length);
  consumed_ += pending_->length;
  pending_.reset();
  return f;
}

}  // namespace muon::transport

#include "daemon/session.hpp"

#include <cstring>

namespace muon::daemon {

namespace asio = boost::asio;
using transport::Frame;
using transport::MessageType;

Session::Session(Socket socket, uint64_t id, FrameHandler on_frame, CloseHandler on_close)
    : socket_(std::move(socket)),
      id_(id),
      on_frame_(std::move(on_frame)),
      on_close_(std::move(on_close)) {}

void Session::start() {
  read_more();
}

void Session::read_more() {
  auto self = shared_from_this();
  socket_.async_read_some(asio::buffer(read_buf_), [self](boost::system::error_code ec, size_t n) {
    if (self->closed_) return;
    if (ec) {
      self->finish(ec == asio::error::eof ? "client disconnected" : "read failed: " + ec.message());
      return;
    }
    try {
      self->decoder_.feed(self->read_buf_.data(), n);
      while (auto frame = self->decoder_.next()) {
        if (!self->deliver(std::move(*frame))) return;
      }
    } catch (const transport::ProtocolError& e) {
      self->protocol_failed(e);
      return;
    }
    self->read_more();
  });
}

bool Session::deliver(Frame frame) {
  // While the data plane is held, a push (its bytes arrive through a transfer the data plane
  // cannot post yet) and every frame after it wait, in order, for set_data_plane_ready().
  if (!data_plane_ready_ &&
      (!held_frames_.empty() || frame.type == static_cast<uint16_t>(MessageType::push))) {
    held_frames_.push_back(std::move(frame));
    return true;
  }
  on_frame_(shared_from_this(), std::move(frame));
  return !closed_ && !closing_;
}

void Session::protocol_failed(const transport::ProtocolError& e) {
  // The byte stream can no longer be trusted: tell the client why, then drop it.
  send_error({"protocol", e.message(), "", -1, -1});
  close(e.message());
}

void Session::send(MessageType type, const std::string& payload, uint32_t request_id) {
  if (closed_) return;
  write_queue_.push_back(
      transport::encode_frame(Frame{static_cast<uint16_t>(type), request_id, payload}));
  if (!writing_) write_next();
}

void Session::send_error(const transport::ErrorMsg& error, uint32_t request_id) {
  send(MessageType::error, transport::encode(error), request_id);
}

void Session::write_next() {
  if (write_queue_.empty()) {
    writing_ = false;
    if (closing_) finish(close_reason_);
    return;
  }
  writing_ = true;
  auto self = shared_from_this();
  asio::async_write(socket_, asio::buffer(write_queue_.front()),
                    [self](boost::system::error_code ec, size_t) {
                      if (self->closed_) return;
                      self->write_queue_.pop_front();
                      if (ec) {
                        self->finish("write failed: " + ec.message());
                        return;
                      }
                      self->write_next();
                    });
}

void Session::send_chunk(transport::Update msg, std::vector<std::byte> data) {
  if (closed_) return;
  pending_.emplace_back(std::move(msg), std::move(data));
  flush_chunks();
}

void Session::use_device_rings(DeviceRingsPtr rings, uint32_t rx_slots, RxWriter writer,
                               bool frame_first) {
  device_rings = std::move(rings);
  device_rx_slots_ = rx_slots;
  rx_writer_ = std::move(writer);
  frame_first_ = frame_first;
}

void Session::set_data_plane_ready() {
  data_plane_ready_ = true;
  flush_chunks();
  auto held = std::move(held_frames_);
  held_frames_.clear();
  try {
    for (auto& frame : held) {
      if (closed_ || !deliver(std::move(frame))) return;
    }
  } catch (const transport::ProtocolError& e) {
    protocol_failed(e);
  }
}

std::optional<uint32_t> Session::free_rx_slot() {
  if (!data_plane_ready_) return std::nullopt;
  if (rx_busy_.empty()) {
    rx_busy_.assign(segment ? segment->layout().rx_slots : device_rx_slots_, false);
  }
  for (uint32_t slot = 0; slot < rx_busy_.size(); ++slot) {
    if (!rx_busy_[slot]) return slot;
  }
  return std::nullopt;  // no credit: wait for an update_ack
}

bool Session::send_chunk_direct(transport::Update msg,
                                const std::function<void(uint32_t slot)>& write) {
  if (closed_) return true;
  if (!pending_.empty()) return false;  // chunks go out in order
  const auto slot = free_rx_slot();
  if (!slot) return false;
  rx_busy_[*slot] = true;
  msg.slot = *slot;
  try {
    if (!frame_first_) write(*slot);
    send(MessageType::update, transport::encode(msg));
    if (frame_first_) write(*slot);
  } catch (const std::exception& e) {
    data_plane_failed(e.what());
  }
  return true;
}

void Session::data_plane_failed(const std::string& what) {
  // The client may already wait for bytes that will never come: end the session, say why.
  send_error({"data_plane", "the session's data plane failed: " + what, "", -1, rank});
  close("data plane failed: " + what);
}

void Session::flush_chunks() {
  if (!segment && !rx_writer_) return;
  while (!pending_.empty()) {
    const auto slot = free_rx_slot();
    if (!slot) return;
    auto [msg, data] = std::move(pending_.front());
    pending_.pop_front();
    rx_busy_[*slot] = true;
    msg.slot = *slot;
    const auto write = [&] {
      if (rx_writer_) {
        rx_writer_(*slot, msg, data);
      } else {
        std::memcpy(segment->rx_slot(*slot), data.data(), data.size());
      }
    };
    try {
      if (!frame_first_) write();
      send(MessageType::update, transport::encode(msg));
      if (frame_first_) write();
    } catch (const std::exception& e) {
      data_plane_failed(e.what());
      return;
    }
  }
}

void Session::release_rx_slot(uint32_t slot) {
  if (slot >= rx_busy_.size() || !rx_busy_[slot]) {
    throw transport::ProtocolError("update_ack for rx slot " + std::to_string(slot) +
                                   " that holds no update");
  }
  rx_busy_[slot] = false;
  flush_chunks();
}

void Session::close(const std::string& why) {
  if (closed_ || closing_) return;
  closing_ = true;
  close_reason_ = why;
  if (!writing_) finish(why);
}

void Session::finish(const std::string& why) {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  socket_.shutdown(Socket::shutdown_both, ignored);
  socket_.close(ignored);
  pending_.clear();
  held_frames_.clear();
  write_queue_.clear();
  if (segment) transport::ShmSegment::remove(segment->name());  // in case the client never mapped
  on_close_(shared_from_this(), why);
  segment.reset();  // unmap: the kernel frees the pages once the client unmapped too
  rx_writer_ = nullptr;
  device_rings.reset();  // device rings: freed (cudaFree waits for the work queued on them)
}

}  // namespace muon::daemon

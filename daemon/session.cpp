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
    // A closing session (its last frames still being written) takes no more frames: the server
    // has said why it ends, and what the client sends now would start work nobody waits for.
    if (self->closed_ || self->closing_) return;
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
  // A frame that must wait, and every frame after it, is held, in order: while the data plane is
  // held, a push (its bytes arrive through a transfer the data plane cannot post yet); while the
  // gate refuses it, a frame whose slot the client's GPU has not finished with.
  if (!held_frames_.empty() || must_hold(frame)) {
    held_frames_.push_back(std::move(frame));
    if (data_plane_ready_) poll_gate();
    return true;
  }
  on_frame_(shared_from_this(), std::move(frame));
  return !closed_ && !closing_;
}

bool Session::must_hold(const Frame& frame) {
  if (!data_plane_ready_) return frame.type == static_cast<uint16_t>(MessageType::push);
  if (!gate_) return false;
  try {
    return !gate_(frame);
  } catch (const std::exception&) {
    return false;  // the handler says what is wrong with it
  }
}

void Session::gate_frames(FrameGate gate) {
  gate_ = std::move(gate);
}

void Session::release_held() {
  while (!held_frames_.empty() && !closed_ && !closing_) {
    if (must_hold(held_frames_.front())) {
      if (data_plane_ready_) poll_gate();
      return;
    }
    Frame frame = std::move(held_frames_.front());
    held_frames_.pop_front();
    on_frame_(shared_from_this(), std::move(frame));
  }
}

void Session::poll_gate() {
  if (gate_polling_ || closed_) return;
  if (!gate_timer_) gate_timer_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
  gate_polling_ = true;
  gate_timer_->expires_after(kGatePoll);
  gate_timer_->async_wait([self = shared_from_this()](boost::system::error_code ec) {
    self->gate_polling_ = false;
    if (ec || self->closed_) return;
    try {
      self->release_held();
    } catch (const transport::ProtocolError& e) {
      self->protocol_failed(e);
    }
  });
}

void Session::protocol_failed(const transport::ProtocolError& e) {
  // The byte stream can no longer be trusted: tell the client why, then drop it.
  send_error({ErrorCode::protocol, e.message(), "", -1, -1});
  close(e.message());
}

void Session::send(MessageType type, const std::string& payload, uint32_t request_id,
                   AfterFrame after) {
  enqueue({transport::encode_frame(Frame{static_cast<uint16_t>(type), request_id, payload}),
           std::move(after),
           {}});
}

void Session::ack_push(uint32_t slot) {
  if (plane_ && plane_->releases_in_segment()) {
    unreleased_.push_back(slot);
    release_slots();
    return;
  }
  std::function<bool()> released;
  if (plane_) released = [this, slot] { return !plane_ || plane_->slot_released(slot); };
  send_push_ack(slot, std::move(released));
}

void Session::send_push_ack(uint32_t slot, std::function<bool()> ready) {
  enqueue({transport::encode_frame(Frame{static_cast<uint16_t>(MessageType::push_ack), 0,
                                         transport::encode(transport::SlotAck{slot})}),
           {},
           std::move(ready)});
}

void Session::release_slots() {
  if (closed_ || !plane_) return;
  bool wake = false;
  try {
    while (!unreleased_.empty() && plane_->slot_released(unreleased_.front())) {
      wake = plane_->release_slot(unreleased_.front()) || wake;
      unreleased_.pop_front();
    }
  } catch (const std::exception& e) {
    unreleased_.clear();
    data_plane_failed(e.what());
    return;
  }
  if (wake) send_push_ack(transport::kWakeSlot, {});
  if (unreleased_.empty() || release_polling_) return;
  if (!release_timer_) {
    release_timer_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
  }
  release_polling_ = true;
  release_timer_->expires_after(kGatePoll);
  release_timer_->async_wait([self = shared_from_this()](boost::system::error_code ec) {
    self->release_polling_ = false;
    if (!ec) self->release_slots();
  });
}

void Session::enqueue(Outgoing frame) {
  if (closed_) return;
  write_queue_.push_back(std::move(frame));
  if (!writing_) write_next();
}

void Session::send_error(const transport::ErrorMsg& error, uint32_t request_id) {
  send(MessageType::error, transport::encode(error), request_id);
}

bool Session::first_frame_ready() {
  auto& ready = write_queue_.front().ready;
  if (!ready) return true;
  try {
    if (!ready()) {
      if (!write_timer_) {
        write_timer_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
      }
      write_timer_->expires_after(kGatePoll);
      write_timer_->async_wait([self = shared_from_this()](boost::system::error_code ec) {
        if (!ec && !self->closed_) self->write_next();
      });
      return false;
    }
  } catch (const std::exception& e) {
    ready = nullptr;  // written now; the session ends after it
    data_plane_failed(e.what());
    return true;
  }
  ready = nullptr;
  return true;
}

void Session::write_next() {
  if (write_queue_.empty()) {
    writing_ = false;
    if (closing_) finish(close_reason_);
    return;
  }
  writing_ = true;
  if (!first_frame_ready()) return;  // written from the poll
  // The frames queued behind the first go out in the same write (one syscall, and one wake-up of
  // the client's reader for a run of acks), up to one that must wait for its slot (`ready`) or
  // that starts a transfer once written (`after`: it ends the run).
  size_t n = 1;
  while (!write_queue_[n - 1].after && n < write_queue_.size() && n < kMaxFramesPerWrite &&
         !write_queue_[n].ready) {
    ++n;
  }
  write_buffers_.clear();
  for (size_t i = 0; i < n; ++i) write_buffers_.push_back(asio::buffer(write_queue_[i].bytes));
  auto self = shared_from_this();
  asio::async_write(socket_, write_buffers_, [self, n](boost::system::error_code ec, size_t) {
    if (self->closed_) return;
    AfterFrame after = std::move(self->write_queue_[n - 1].after);
    self->write_queue_.erase(self->write_queue_.begin(),
                             self->write_queue_.begin() + static_cast<std::ptrdiff_t>(n));
    if (ec) {
      self->finish("write failed: " + ec.message());
      return;
    }
    // The frame is in the socket: the transfer it announces may start.
    if (after && !self->closing_) {
      try {
        after();
      } catch (const std::exception& e) {
        self->data_plane_failed(e.what());
      }
    }
    self->write_next();
  });
}

void Session::send_chunk(transport::Update msg, transport::DType dtype,
                         std::vector<std::byte> data) {
  if (closed_) return;
  pending_.push_back({std::move(msg), dtype, std::move(data)});
  flush_chunks();
}

void Session::use_plane(std::unique_ptr<ServerPlane> plane) {
  plane_ = std::move(plane);
  if (plane_->gates_frames()) {
    gate_frames([p = plane_.get()](const Frame& f) { return p->frame_ready(f); });
  }
}

void Session::set_data_plane_ready() {
  data_plane_ready_ = true;
  flush_chunks();
  try {
    release_held();
  } catch (const transport::ProtocolError& e) {
    protocol_failed(e);
  }
}

std::optional<uint32_t> Session::take_rx_slot() {
  if (!data_plane_ready_ || !plane_) return std::nullopt;
  if (rx_credits_.size() == 0) {
    rx_credits_.assign(plane_->rx_slots());
  }
  return rx_credits_.acquire();  // nullopt: no credit, wait for an update_ack
}

uint32_t Session::param_id(const std::string& name) {
  auto it = param_ids_.find(name);
  if (it != param_ids_.end()) return it->second;
  if (param_names_.size() >= transport::kMaxParamIds) {
    throw transport::ProtocolError("session " + std::to_string(id_) + " named more than " +
                                   std::to_string(transport::kMaxParamIds) + " parameters");
  }
  const auto id = static_cast<uint32_t>(param_names_.size());
  param_names_.push_back(name);
  param_ids_.emplace(name, id);
  return id;
}

const std::string& Session::param_name(uint32_t id) const {
  if (id >= param_names_.size()) {
    throw InvalidArgument(
        "a chunk names parameter id " + std::to_string(id) + ", which this session never handed " +
        "out (" + std::to_string(param_names_.size()) + " ids so far: register the parameter and "
        "use the param_id of its register_ok)");
  }
  return param_names_[id];
}

bool Session::announce(transport::Update& msg, uint32_t slot,
                       const std::function<AfterFrame()>& write) {
  msg.slot = slot;
  msg.param_id = param_id(msg.name);
  AfterFrame after;
  try {
    after = write();
  } catch (const std::exception& e) {
    data_plane_failed(e.what());
    return false;
  }
  send(MessageType::update, transport::encode(msg), 0, std::move(after));
  return true;
}

bool Session::send_chunk_direct(transport::Update msg, const SlotWrite& write) {
  if (closed_) return true;
  if (!pending_.empty()) return false;  // chunks go out in order
  const auto slot = take_rx_slot();
  if (!slot) return false;
  announce(msg, *slot, [&] { return write(*slot); });
  return true;
}

void Session::data_plane_failed(const std::string& what) {
  if (closing_ || closed_) return;  // already ending (a later transfer failing the same way)
  // The client may already wait for bytes that will never come: end the session, say why.
  send_error({ErrorCode::data_plane, "the session's data plane failed: " + what, "", -1, rank});
  close("data plane failed: " + what);
}

void Session::flush_chunks() {
  while (!pending_.empty()) {
    const auto slot = take_rx_slot();
    if (!slot) return;
    auto chunk = std::move(pending_.front());
    pending_.pop_front();
    const bool written = announce(chunk.msg, *slot, [&] {
      return plane_->write_host(*slot, chunk.data.data(), chunk.data.size(), chunk.dtype);
    });
    if (!written) return;
  }
}

void Session::release_rx_slot(uint32_t slot) {
  if (!rx_credits_.release(slot)) {
    throw transport::ProtocolError("update_ack for rx slot " + std::to_string(slot) +
                                   " that holds no update");
  }
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
  if (gate_timer_) gate_timer_->cancel();
  if (write_timer_) write_timer_->cancel();
  if (release_timer_) release_timer_->cancel();
  unreleased_.clear();
  gate_ = nullptr;
  if (plane_) plane_->closing();
  on_close_(shared_from_this(), why);
  // Shared memory unmapped (the kernel frees the pages once the client unmapped too), device
  // rings freed (cudaFree waits for the work queued on them).
  plane_.reset();
}

}  // namespace muon::daemon

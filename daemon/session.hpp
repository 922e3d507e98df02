// One client connection: its socket, its frame decoder, its write queue and its shared-memory
// rings. A session moves bytes and frames; what the frames mean is the Engine's job.
#pragma once

#include "transport/asio.hpp"

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/device_plane.hpp"
#include "transport/frame.hpp"
#include "transport/messages.hpp"
#include "transport/shm_segment.hpp"

namespace muon::daemon {

class Session : public std::enable_shared_from_this<Session> {
 public:
  /// A Unix-socket or TCP connection (transport/endpoint.hpp).
  using Socket = boost::asio::generic::stream_protocol::socket;
  /// Called on the io thread for each complete frame.
  using FrameHandler = std::function<void(const std::shared_ptr<Session>&, transport::Frame)>;
  /// Called once when the connection ends (EOF, error, protocol violation or close()).
  using CloseHandler = std::function<void(const std::shared_ptr<Session>&, const std::string& why)>;

  Session(Socket socket, uint64_t id, FrameHandler on_frame, CloseHandler on_close);

  /// Starts reading. Call once, on the io thread.
  void start();
  /// Queues a frame for sending (io thread only).
  void send(transport::MessageType type, const std::string& payload, uint32_t request_id = 0);
  /// Sends an error message (io thread only).
  void send_error(const transport::ErrorMsg& error, uint32_t request_id = 0);
  /// Queues an update chunk: copied into a free rx slot and announced with an `update` frame as
  /// soon as a slot is free (credit-based flow control). `data` holds msg.count elements.
  void send_chunk(transport::Update msg, std::vector<std::byte> data);
  /// Writes an update chunk straight into a free rx slot with `write(slot)` (the GPU data plane's
  /// device-to-device copy) and announces it, when a slot is free and no chunk is waiting;
  /// returns false otherwise (send the chunk's bytes with send_chunk then). True also when the
  /// session is closed (the chunk is dropped, as send_chunk drops it) or the write failed (the
  /// session then sends an error frame and closes: the client may be waiting for the bytes).
  bool send_chunk_direct(transport::Update msg, const std::function<void(uint32_t slot)>& write);
  /// Writes the bytes of chunks that waited for a credit into an rx slot (set for sessions whose
  /// rings are not host shared memory).
  using RxWriter = std::function<void(uint32_t slot, const transport::Update& msg,
                                      const std::vector<std::byte>& data)>;
  /// Makes this a GPU data plane session: its rings are `rings` (rx_slots result slots), chunks
  /// queued by send_chunk are written with `writer`. `frame_first`: announce a chunk before
  /// writing it (nccl: the client posts its receive when the frame arrives, and the first send
  /// of a communicator cannot complete before that); otherwise the write (its ready event
  /// recorded) comes first, so that the frame never reaches the client before the event.
  void use_device_rings(DeviceRingsPtr rings, uint32_t rx_slots, RxWriter writer,
                        bool frame_first = false);
  /// A client returned rx slot `slot` (update_ack). Throws ProtocolError for a slot not in use.
  void release_rx_slot(uint32_t slot);
  /// Closes the connection after flushing queued frames; the close handler runs once.
  void close(const std::string& why);

  uint64_t id() const { return id_; }
  bool closed() const { return closed_; }
  /// Set after `hello`.
  int rank = -1;
  int world_size = 0;
  /// The job of the session's latest registration (transport::RegisterParam::job); unset
  /// before its first.
  std::optional<std::string> job;
  /// Accepted on the TCP listener: the hello must carry the server's token, and only health is
  /// answered before it.
  bool tcp = false;
  /// On the nccl data plane (transfers are matched in order with the client's).
  bool nccl = false;
  /// TCP sessions: closes the session when no hello came in time (set by the Server).
  std::unique_ptr<boost::asio::steady_timer> hello_timer;
  /// The data plane may be used (false while an nccl session's communicators are being joined).
  /// Set it with set_data_plane_ready().
  bool data_plane_ready() const { return data_plane_ready_; }
  /// Until set_data_plane_ready(): result chunks wait as host bytes, and the client's first push
  /// and every frame after it wait unhandled (a push's bytes come through a transfer the plane
  /// cannot post before it is joined), so that no handler has to wait for the join.
  void hold_data_plane() { data_plane_ready_ = false; }
  /// Marks the data plane usable, writes the chunks that waited for it and hands the held frames
  /// to the frame handler, in order (io thread).
  void set_data_plane_ready();
  std::string client_name;
  std::optional<transport::ShmSegment> segment;
  /// The session's exported device rings (cuda_ipc data plane); null for shm sessions.
  DeviceRingsPtr device_rings;
  /// Chunks waiting for an rx slot.
  size_t pending_chunks() const { return pending_.size(); }

 private:
  void read_more();
  /// Hands `frame` to the frame handler, or holds it (hold_data_plane). False once the session
  /// is closing. Throws what the handler throws.
  bool deliver(transport::Frame frame);
  void protocol_failed(const transport::ProtocolError& e);
  void write_next();
  void flush_chunks();
  /// A write into a result slot failed (a CUDA or NCCL error): error frame, then close.
  void data_plane_failed(const std::string& what);
  /// A free rx slot, or nullopt (sizes rx_busy_ on first use).
  std::optional<uint32_t> free_rx_slot();
  void finish(const std::string& why);

  Socket socket_;
  uint64_t id_;
  FrameHandler on_frame_;
  CloseHandler on_close_;
  transport::FrameDecoder decoder_;
  std::array<std::byte, 64 * 1024> read_buf_{};
  std::deque<std::vector<std::byte>> write_queue_;
  bool writing_ = false;
  bool closing_ = false;
  bool closed_ = false;
  std::string close_reason_;
  std::vector<bool> rx_busy_;
  uint32_t device_rx_slots_ = 0;
  RxWriter rx_writer_;
  bool frame_first_ = false;
  bool data_plane_ready_ = true;
  std::deque<std::pair<transport::Update, std::vector<std::byte>>> pending_;
  std::deque<transport::Frame> held_frames_;  // while the data plane is held
};

}  // namespace muon::daemon

// One client connection: its socket, its frame decoder, its write queue, its data plane
// (daemon/planes/server_plane.hpp) and the credits of its result ring. A session moves bytes and
// frames; what the frames mean is the Engine's job.
#pragma once

#include "transport/asio.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "daemon/planes/server_plane.hpp"
#include "transport/credit_ring.hpp"
#include "transport/frame.hpp"
#include "transport/messages.hpp"

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
  /// What must follow a frame once it is written to the socket (io thread): on the nccl plane
  /// the ncclSend of the result slot the frame announces. Empty: nothing.
  using AfterFrame = daemon::AfterFrame;
  /// Queues a frame for sending (io thread only); `after` runs on the io thread once the frame's
  /// bytes are in the socket (never when the session closes first, or is closing: the client
  /// will not take the transfer then). An `after` that throws ends the session as a failed data
  /// plane (data_plane_failed).
  void send(transport::MessageType type, const std::string& payload, uint32_t request_id = 0,
            AfterFrame after = {});
  /// Sends an error message (io thread only).
  void send_error(const transport::ErrorMsg& error, uint32_t request_id = 0);
  /// Returns tx slot `slot` to the client once the plane's reads of it are done
  /// (ServerPlane::slot_released), asking again every kGatePoll (io thread only). A plane that
  /// releases in its segment (shm) is told so, in the order of the calls, and a push_ack goes
  /// only to wake a sleeping pusher; elsewhere a push_ack names the slot, and the frames queued
  /// after it wait behind it, in order. A plane that cannot tell (throws) ends the session as a
  /// failed data plane, after the ack.
  void ack_push(uint32_t slot);
  /// Queues an update chunk: written into a free rx slot through the data plane (write_host) and
  /// announced with an `update` frame as soon as a slot is free (credit-based flow control).
  /// `data` holds msg.count elements of `dtype`. Dropped when the session has no plane yet or is
  /// closed.
  void send_chunk(transport::Update msg, transport::DType dtype, std::vector<std::byte> data);
  /// Writes a chunk into result slot `slot` (e.g. ServerPlane::write_update: device to device)
  /// and returns what must follow the update frame that announces it. Throws DeviceError.
  using SlotWrite = std::function<AfterFrame(uint32_t slot)>;
  /// Writes an update chunk straight into a free rx slot with `write(slot)` and announces it,
  /// when a slot is free and no chunk is waiting; returns false otherwise (send the chunk's bytes
  /// with send_chunk then). True also when the session is closed (the chunk is dropped, as
  /// send_chunk drops it) or the write failed (the session then sends an error frame and closes:
  /// the client may be waiting for the bytes). Every plane: the write first, then the frame,
  /// then what the write returned, once the frame is out (gpu-review F1: an NCCL send posted
  /// before its frame is written spins on the GPU until the client reads the frame, and any
  /// device-wide synchronization on this io thread in between would wait for it forever).
  bool send_chunk_direct(transport::Update msg, const SlotWrite& write);
  /// Gives the session its data plane (after the hello, io thread): chunks are read and written
  /// through it, its rx_slots() are the result ring's credits, and a plane that gates_frames()
  /// is asked before each frame is handled (gate_frames). Once per session.
  void use_plane(std::unique_ptr<ServerPlane> plane);
  /// The session's data plane; null before the hello and after the session closed.
  ServerPlane* plane() const { return plane_.get(); }
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
  /// Whether a frame may be handled now; false holds it, and every frame after it, in order.
  using FrameGate = std::function<bool(const transport::Frame&)>;
  /// Holds frames the gate refuses until it accepts them, asking again every kGatePoll on the io
  /// thread. The cuda_ipc plane's gate refuses a push until the client's copy into its slot is
  /// done, and an update_ack until the client's copy out of its slot is (cudaEventQuery on the
  /// slot's event): so the server's streams never wait on an event of a client on the GPU, where
  /// a client that dies before its copy ran would wedge them, and with them every session and
  /// the next cudaFree of the whole server (gpu-review F2). A gate that throws is taken as yes
  /// (the handler then reports what is wrong with the frame).
  void gate_frames(FrameGate gate);
  static constexpr std::chrono::microseconds kGatePoll{20};
  std::string client_name;
  /// Chunks waiting for an rx slot.
  size_t pending_chunks() const { return pending_.size(); }
  /// The id this session's chunks name parameter `name` by (transport/chunk_header.hpp): the
  /// one handed out before, else the next (0, 1, 2, ... in the order the session first named
  /// them: its register_ok, or an update). Throws ProtocolError past kMaxParamIds. io thread.
  uint32_t param_id(const std::string& name);
  /// The parameter a chunk's id names; throws InvalidArgument naming the id for one this
  /// session never handed out (answered as bad_request; nothing else changes). io thread.
  const std::string& param_name(uint32_t id) const;

 private:
  std::vector<std::string> param_names_;                 // param_id(): names by id
  std::unordered_map<std::string, uint32_t> param_ids_;  // and ids by name
  void read_more();
  /// Hands `frame` to the frame handler, or holds it (hold_data_plane, gate_frames). False once
  /// the session is closing. Throws what the handler throws.
  bool deliver(transport::Frame frame);
  /// Whether `frame` must wait (the data plane held, or the gate says no).
  bool must_hold(const transport::Frame& frame);
  /// Hands the held frames over, in order, while the data plane is ready and the gate accepts
  /// the first; arms the gate's poll when it does not. Throws what the handler throws.
  void release_held();
  /// Asks the gate again after kGatePoll (one poll armed at a time).
  void poll_gate();
  void protocol_failed(const transport::ProtocolError& e);
  void write_next();
  void flush_chunks();
  /// Releases, in order, the tx slots of unreleased_ whose reads are done (segment planes),
  /// sends one wake push_ack if the pusher asked for it, and polls again after kGatePoll while
  /// some are left.
  void release_slots();
  /// Queues a push_ack naming `slot` (kWakeSlot: a wake-up), written once `ready` says yes
  /// (empty: now).
  void send_push_ack(uint32_t slot, std::function<bool()> ready);
  /// A write into a result slot, or the transfer after its frame, failed (a CUDA or NCCL
  /// error): error frame, then close.
  void data_plane_failed(const std::string& what);
  /// Takes the lowest free rx slot, or nullopt when none is free or the data plane is held
  /// (sizes rx_credits_ on first use). The slot stays held until its update_ack.
  std::optional<uint32_t> take_rx_slot();
  /// Sends `msg` in `slot` (taken by take_rx_slot): `write()` fills it, then the update frame
  /// goes out with what the write returned to follow it. False when the write threw (the
  /// session is failing).
  bool announce(transport::Update& msg, uint32_t slot, const std::function<AfterFrame()>& write);
  void finish(const std::string& why);

  Socket socket_;
  uint64_t id_;
  FrameHandler on_frame_;
  CloseHandler on_close_;
  transport::FrameDecoder decoder_;
  std::array<std::byte, 64 * 1024> read_buf_{};
  struct Outgoing {
    std::vector<std::byte> bytes;
    AfterFrame after;
    std::function<bool()> ready;  // empty: now; else written once it says yes (ack_push)
  };
  /// Queues `frame` and starts writing when idle.
  void enqueue(Outgoing frame);
  /// Whether the first queued frame may be written now (its `ready`); arms a poll otherwise.
  bool first_frame_ready();
  std::deque<Outgoing> write_queue_;
  /// The frames of the write in flight (the first ones of write_queue_, which keeps their bytes).
  std::vector<boost::asio::const_buffer> write_buffers_;
  static constexpr size_t kMaxFramesPerWrite = 64;
  bool writing_ = false;
  bool closing_ = false;
  bool closed_ = false;
  std::string close_reason_;
  transport::CreditRing rx_credits_;  // the rx ring's slots
  std::unique_ptr<ServerPlane> plane_;
  bool data_plane_ready_ = true;
  struct PendingChunk {
    transport::Update msg;
    transport::DType dtype;
    std::vector<std::byte> data;
  };
  std::deque<PendingChunk> pending_;
  std::deque<transport::Frame> held_frames_;  // while the data plane is held or the gate says no
  FrameGate gate_;
  std::unique_ptr<boost::asio::steady_timer> gate_timer_;
  bool gate_polling_ = false;
  std::unique_ptr<boost::asio::steady_timer> write_timer_;  // first_frame_ready's poll
  std::deque<uint32_t> unreleased_;  // tx slots read, not yet released (segment planes)
  std::unique_ptr<boost::asio::steady_timer> release_timer_;  // release_slots' poll
  bool release_polling_ = false;
};

}  // namespace muon::daemon

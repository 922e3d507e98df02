// One client connection to one muon-offloadd: the control socket (a Unix socket path, or
// "tcp://HOST:PORT" with the server's token; blocking writes, a reader thread for everything the
// server sends), the session's data plane with credit-based flow control (host shared-memory
// rings, the server's device rings over CUDA IPC, or NCCL point-to-point into the server's
// rings), and the per-parameter receive state of updates.
#pragma once

#include "transport/asio.hpp"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/client_error.hpp"
#include "client/plane.hpp"
#include "client/push_batch.hpp"
#include "kernels/device_stream.hpp"
#include "transport/credit_ring.hpp"
#include "transport/frame.hpp"
#include "transport/messages.hpp"

namespace muon::client {

using Clock = std::chrono::steady_clock;

/// Called on the reader thread when a parameter's update for a step is complete.
using UpdateCallback = std::function<void(const std::string& name, int64_t step)>;

/// Where one update stands (Connection::update_state; the C ABI's muon_client_update_state).
enum class UpdateState : int {
  pending = 0,   ///< wait_update would wait
  complete = 1,  ///< its values are here (or the step was skipped and is done with)
  failed = 2,    ///< the server failed the step: wait_update raises its error
  lost = 3,      ///< the connection is lost: wait_update raises ConnectionLost
};

class Connection {
 public:
  /// Connects to `endpoint` (a Unix socket path or "tcp://HOST:PORT", transport::parse_endpoint;
  /// retrying with exponential backoff, 10 ms doubling to 1 s, until connect_timeout), says hello
  /// asking for `data_plane` (with `auth_token` on a tcp endpoint only; never over a Unix
  /// socket), and maps the session's shared memory (shm), opens the server's device rings
  /// (cuda_ipc), or joins the session's two NCCL communicators as rank 1, tx then rx, waiting up
  /// to op_timeout for each (nccl). cuda_ipc and nccl work on the current CUDA device, which must
  /// be the device whose memory the trainer pushes from and receives into (see DeviceRings,
  /// NcclPlane). Throws InvalidArgument (a malformed endpoint, a host that does not resolve);
  /// BackendUnavailable before connecting when nccl is asked of a client built without NCCL;
  /// ConnectionLost naming the endpoint and the last OS error; ServerError when the server
  /// refuses the hello (code "unsupported": a data plane the server cannot serve; code
  /// "unauthorized": a tcp hello without the server's token; the message is the server's) or
  /// answers with another data plane; BackendUnavailable / DeviceError when the device plane
  /// cannot be set up here (built without CUDA, no usable GPU, NCCL refuses to join).
  Connection(std::string endpoint, int rank, int world_size, const std::string& client_name,
             std::chrono::milliseconds connect_timeout, std::chrono::milliseconds op_timeout,
             transport::DataPlane data_plane = transport::DataPlane::shm,
             const std::string& auth_token = "");
  /// Tears the data plane down, then says goodbye and joins the reader thread. cuda_ipc: waits
  /// for the reader's and the host pushes' streams and for every copy into a tx slot, frees the
  /// device holding buffers, destroys the rings and unmaps their IPC handles, all before the
  /// goodbye that lets the server free the exported memory.
  ~Connection();

  /// Sends a registration (does not wait).
  uint32_t send_register(const transport::RegisterParam& reg);
  /// Waits for the register_ok of a send_register. Throws ServerError / ConnectionLost / Timeout.
  transport::RegisterOk wait_register(uint32_t request_id, const std::string& name);

  /// The data plane the server agreed to.
  transport::DataPlane data_plane() const { return data_plane_; }

  /// Copies `count` elements of `elem_bytes` each from host memory into a free tx slot (waiting
  /// for a credit) and announces them. Returns once the bytes are in the slot (cuda_ipc: the
  /// copies are complete, `data` may be reused); never waits for the server's Newton-Schulz.
  /// Data larger than a slot is sent as several chunks. nccl: each chunk is staged into a client
  /// device buffer and sent with ncclSend after its push frame; returns once the sends are done.
  /// `offset` is what the Push frame carries (an element, or a packed position under a packed
  /// registration). Returns the push frames sent.
  int64_t push(const std::string& name, int64_t step, int64_t offset, const std::byte* data,
            int64_t count, size_t elem_bytes, transport::ChunkKind kind);
  /// The same from CUDA device memory, on a cuda_ipc or nccl connection only: each chunk is
  /// copied straight into the server's tx ring (cuda_ipc), or sent with ncclSend after its push
  /// frame (nccl), on the plane's push stream after the work queued on `stream` so far; no host
  /// staging, and `stream` never waits for the server (gpu-review F10). Runs with the plane's
  /// device current (the caller's current device is restored). Returns once the copies are
  /// enqueued: `device_data` must stay alive and unchanged until push_stream() has passed them
  /// (work queued on `stream` after the wait_update_device of this step is ordered after them;
  /// a caching allocator is told with its record-stream call on push_stream()). Throws
  /// InvalidArgument on a shm connection or when `stream` belongs to another device than the
  /// plane's (both named; checked with CUDA >= 12.8), DeviceError when CUDA or NCCL fails (nccl
  /// after the push frame went out: the connection is then lost). Returns the push frames sent.
  int64_t push_device(const std::string& name, int64_t step, int64_t offset,
                   const std::byte* device_data, int64_t count, size_t elem_bytes,
                   transport::ChunkKind kind, StreamHandle stream);
  /// The stream pushes from device memory run on (cuda_ipc, nccl); nullptr on shm.
  StreamHandle push_stream() const;
  /// Sends a commit.
  void commit(const std::string& name, int64_t step);
  /// Waits until the server has taken every pushed chunk out of shared memory (all tx slots
  /// acknowledged). Throws ConnectionLost / Timeout.
  void flush();

  /// Waits until the update of (name, step) is complete, then copies the packed want-range
  /// values (update dtype) to dst (want elements x update dtype bytes). Returns false when the
  /// server skipped the step (non-finite policy skip: zeros). Throws ServerError (the server's
  /// error for this parameter and step, e.g. a lost rank), ConnectionLost, Timeout.
  /// On a cuda_ipc connection the update is copied from its device holding buffer (blocking).
  bool wait_update(const std::string& name, int64_t step, std::byte* dst);
  /// cuda_ipc and nccl connections only: as wait_update, but the values land in `device_dst`
  /// (device memory on the connection's device), copied on `stream` after the update's copies out
  /// of the ring (stream-ordered; returns once enqueued). Throws as wait_update, plus
  /// InvalidArgument on a shm connection and DeviceError when CUDA fails (the update then stays
  /// held).
  bool wait_update_device(const std::string& name, int64_t step, std::byte* device_dst,
                          StreamHandle stream);
  /// True when the update of (name, step) is complete.
  bool update_ready(const std::string& name, int64_t step);
  /// Where the update of (name, step) stands, as wait_update would find it now. Never waits.
  UpdateState update_state(const std::string& name, int64_t step);

  /// Fetches the full fp32 momentum and its last applied step; with after_step >= 0 the server
  /// answers once the parameter's step has reached it (transport::StateFetch::after_step).
  std::vector<float> fetch_momentum(const std::string& name, int64_t numel, int64_t* last_step,
                                    int64_t after_step = -1);

  /// Asks for a snapshot; returns the path written.
  std::string snapshot(const std::string& path);
  /// Health check.
  transport::HealthOk health();
  /// Sends a step report (no answer; a malformed one would come back as an error).
  void send_step_report(const transport::StepReport& report);

  void set_update_callback(UpdateCallback cb);
  /// Announces the want ranges and update dtype of a parameter before its first update;
  /// `packed`: its registration is packed (transport::RegisterParam::packed), so update chunks
  /// carry packed positions in the sorted want ranges.
  void expect_updates(const std::string& name, std::vector<transport::Range> want,
                      size_t elem_bytes, bool packed = false);

  /// The endpoint as given (a socket path or "tcp://HOST:PORT").
  const std::string& socket_path() const { return path_; }
  /// Empty while the connection is alive; the reason once it is lost.
  std::string lost_reason();
  /// What the server's hello said outlives a crash: its --snapshot path ("" none) and
  /// --snapshot-every steps (0: only on request and when stopped); nullopt for a server that
  /// does not say. Kept after the connection is lost.
  std::optional<std::pair<std::string, int64_t>> snapshot_config();
  /// The server's reports of ranks of this job lost since this connection opened (peer_lost
  /// without a parameter, sent at once, between steps too), by rank. Each is also written to
  /// stderr the moment it arrives: the trainer may be blocked in its own collectives.
  std::map<int, std::string> lost_peers();

 private:
  /// Complete updates held per parameter before the oldest unread one is dropped.
  static constexpr size_t kMaxHeldUpdates = 16;

  struct Reply {
    bool done = false;
    transport::Frame frame;
    std::optional<transport::ErrorMsg> error;
  };
  struct ParamRx {
    RangeSet want;  // the update's elements this client receives, laid end to end
    bool packed = false;  // update offsets are packed positions (expect_updates)
    size_t elem_bytes = 4;
    // The step being received: chunks land in `receiving` (a hold of the plane, made by the
    // reader) until the step's last one.
    std::unique_ptr<UpdateHold> receiving;
    int64_t receiving_step = -1;
    int64_t received = 0;
    bool receiving_applied = true;
    // Complete updates not yet taken by wait_update, by step. A rank that pushes nothing to a
    // parameter is not paced by the server: its updates for later steps can arrive before it
    // asks for an earlier one, so each complete step is kept until it is taken (or superseded:
    // wait_update(s) drops every step below s; at most kMaxHeldUpdates are kept).
    struct Complete {
      std::unique_ptr<UpdateHold> values;
      bool applied = true;
    };
    std::map<int64_t, Complete> complete;
    int64_t dropped_through = -1;  // steps <= this were dropped unread (kMaxHeldUpdates)
    std::vector<std::unique_ptr<UpdateHold>> spare;  // recycled holds (warm pages)
    // Retries: once wait_update has reported an error for step `retry_step`, later pushes and
    // commits of that step carry attempt `retry_attempt`, so that the server discards whatever
    // of the failed try was still in flight (transport::Push::attempt).
    int64_t retry_step = -1;
    uint32_t retry_attempt = 0;
    std::map<int64_t, transport::ErrorMsg> errors;  // by step (-1: any)
    std::vector<float> momentum;
    int64_t momentum_step = -1;
    bool momentum_ready = false;
  };

  uint32_t send_request(transport::MessageType type, const std::string& payload);
  transport::Frame wait_reply(uint32_t id, const std::string& what);
  /// wait_reply until `until` instead of the op timeout.
  transport::Frame wait_reply_until(uint32_t id, const std::string& what, Clock::time_point until);
  /// What the server's status says of `name` when a wait for it ran out: for a registration
  /// (`step` < 0) "; ranks 1, 2 of the job's 3 have not registered it (...)"; for the update of
  /// `step`, the ranks whose push or commit its gathering still lacks, or the phase it is in
  /// (computing, replicating). "" when it cannot tell within a second (a hung server) or has
  /// nothing to add. Call without mu_ held (it sends a request and waits for the answer).
  std::string server_progress(const std::string& name, int64_t step = -1);
  /// Writes one frame, after the push frames held in push_batch_ (in one write). Throws
  /// ConnectionLost when the write fails.
  void send_frame(transport::MessageType type, const std::string& payload, uint32_t id = 0);
  /// The push frame `m` of a gradient chunk (`chunk_bytes`) already in its slot of a shm
  /// session: held in push_batch_, and the batch written once it is full. Throws
  /// ConnectionLost when that write fails.
  void send_push_frame(const transport::Push& m, uint64_t chunk_bytes);
  /// Writes the push frames held in push_batch_, if any. Called before every wait on the
  /// server (push_batch.hpp). A failed write only marks the connection lost (lost_): the wait
  /// that follows reports it, after any error the server sent first. Takes write_mu_: never
  /// call it under mu_.
  void send_held_pushes() noexcept;
  /// Writes `buffers` (a sequence of asio buffers) under write_mu_; `what` names the frame for
  /// the ConnectionLost a failed write throws.
  template <class Buffers>
  void write_locked(const Buffers& buffers, uint16_t what);
  void reader_loop();
  void handle(transport::Frame frame);
  /// An update chunk; its param_id resolved into u.name first (a ProtocolError for an id the
  /// server never handed out: the connection is lost).
  void handle_update(transport::Update u);
  /// handle_update's copy out of the rx slot (shm or device ring). Runs under mu_.
  void receive_chunk(ParamRx& p, const transport::Update& u, bool in_want, int64_t pos);
  /// Takes credits for ceil(count / per-slot) tx slots one by one, calls
  /// moves.into_slot(slot, first element, elements) for each, and sends its push frame (on a
  /// shm session a gradient chunk's frame may be held for the next write: push_batch.hpp). An
  /// into_slot that throws gives its slot back (nothing was announced).
  /// moves.after_frame (nccl), when given, is called the same way right after the chunk's push
  /// frame, both under after_frame_mu_ so that out-of-band sends follow the frames' order; one
  /// that throws loses the connection (the server already expects the bytes).
  int64_t push_chunks(const std::string& name, int64_t step, int64_t offset, int64_t count,
                      size_t elem_bytes, transport::ChunkKind kind, const ChunkMoves& moves);
  /// A free tx slot for a chunk of (name, step), taken: on a shm session first by reading the
  /// segment's credit words for up to kCreditSpin (the server is draining the ring right now;
  /// sleeping would cost a wake frame and two thread wake-ups per chunk), then by sleeping until
  /// a push_ack. Throws Timeout after the op timeout, ServerError / the loss when the server is
  /// lost.
  uint32_t take_tx_credit(const std::string& name, int64_t step);
  /// The ChunkMoves -> push frames of one push, for the plane's push_host / push_device.
  SendChunks chunker(const std::string& name, int64_t step, int64_t offset, int64_t count,
                     size_t elem_bytes, transport::ChunkKind kind);
  /// True on a device data plane (cuda_ipc or nccl): updates are held in device memory.
  bool on_device() const { return plane_->on_device(); }
  /// Marks the connection lost with `why` and shuts the socket down (the reader then exits).
  void lose(const std::string& why);
  /// Waits for the update of (name, step) like wait_update, hands it to `take` under mu_, then
  /// recycles the buffers of it and every earlier step. An exception from `take` leaves the
  /// update held.
  bool take_update(const std::string& name, int64_t step,
                   const std::function<void(ParamRx::Complete&)>& take);
  [[noreturn]] void throw_lost(const std::string& what);
  Clock::time_point deadline() const { return Clock::now() + op_timeout_; }
  /// How long a pusher of a shm session reads the credit words before it sleeps: several
  /// chunks' drain time at memory bandwidth (a 256 KiB chunk takes ~20-40 us to copy).
  static constexpr std::chrono::microseconds kCreditSpin{200};
  /// How often flush() writes push frames other threads held while it waits (push_batch.hpp).
  static constexpr std::chrono::milliseconds kFlushRecheck{10};
  /// How long a failed write waits for the reader to learn why the server closed the
  /// connection (an error frame it sent first, e.g. its shutdown, then EOF), so that the
  /// ConnectionLost names the server's reason rather than the broken pipe it caused.
  static constexpr std::chrono::milliseconds kLostReasonWait{200};
  /// The attempt pushes and commits of (name, step) carry. Takes mu_.
  uint32_t attempt_of(const std::string& name, int64_t step);

  std::string path_;
  int rank_;
  std::chrono::milliseconds op_timeout_;
  boost::asio::io_context io_;
  boost::asio::generic::stream_protocol::socket socket_;
  transport::DataPlane data_plane_ = transport::DataPlane::shm;
  uint64_t chunk_bytes_ = 0;  // the most bytes one push frame announces (a slot; shm: <= 256 KiB)
  /// The session's data plane (plane.hpp); set once the hello is answered, gone in the
  /// destructor (before the goodbye when it maps the server's memory).
  std::unique_ptr<ClientPlane> plane_;
  std::mutex after_frame_mu_;  // push frames and their out-of-band sends, in one order (nccl)
  std::mutex write_mu_;
  /// Under write_mu_: push frames not yet written (shm sessions only; push_batch.hpp). Sized at
  /// the hello; a connection whose pushes are not batched has a batch of one frame.
  PushBatch push_batch_{1, 1};
  bool batch_pushes_ = false;  // set at the hello: a shm session (credits in the segment)
  bool closing_ = false;    // under mu_: the destructor is tearing the data plane down
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t next_request_ = 1;
  std::map<uint32_t, Reply> replies_;
  transport::CreditRing tx_credits_;  // under mu_: the tx ring's slots, sized by the hello
  std::map<std::string, ParamRx> params_;
  /// The ids the server handed out in register_ok (transport/chunk_header.hpp), under mu_:
  /// push frames name their parameter by it, update frames are resolved with it.
  std::map<std::string, uint32_t> param_ids_;
  std::map<uint32_t, std::string> param_names_;
  /// The id push frames of `name` carry; kNoParamId (the name travels instead) for replica
  /// chunks, which precede their seal, and for a parameter whose registration was not answered
  /// on this connection (the server refuses it by name). Takes mu_.
  uint32_t wire_id(const std::string& name, transport::ChunkKind kind);
  std::string lost_;
  /// The server's shutdown error (its first), the reason the connection is lost once it
  /// closes (under mu_).
  std::string stopped_why_;
  /// What of the server's momentum outlives a crash, from its hello ("" for a server that does
  /// not say): appended to every ConnectionLost message.
  std::string crash_note_;
  std::optional<std::pair<std::string, int64_t>> snapshot_config_;  // under mu_
  std::map<int, std::string> lost_peers_;  // under mu_
  UpdateCallback callback_;
  std::thread reader_;
};

}  // namespace muon::client

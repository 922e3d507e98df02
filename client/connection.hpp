// One client connection to one muon-offloadd: the control socket (blocking writes, a reader
// thread for everything the server sends), the session's shared-memory rings with credit-based
// flow control, and the per-parameter receive state of updates.
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
#include "transport/frame.hpp"
#include "transport/messages.hpp"
#include "transport/shm_segment.hpp"

namespace muon::client {

using Clock = std::chrono::steady_clock;

/// Called on the reader thread when a parameter's update for a step is complete.
using UpdateCallback = std::function<void(const std::string& name, int64_t step)>;

class Connection {
 public:
  /// Connects (retrying with exponential backoff, 10 ms doubling to 1 s, until connect_timeout),
  /// says hello, maps the session's shared memory. Throws ConnectionLost naming the socket path
  /// and the last OS error, or ServerError when the server refuses the hello.
  Connection(std::string socket_path, int rank, int world_size, const std::string& client_name,
             std::chrono::milliseconds connect_timeout, std::chrono::milliseconds op_timeout);
  /// Says goodbye and joins the reader thread.
  ~Connection();

  /// Sends a registration (does not wait).
  uint32_t send_register(const transport::RegisterParam& reg);
  /// Waits for the register_ok of a send_register. Throws ServerError / ConnectionLost / Timeout.
  transport::RegisterOk wait_register(uint32_t request_id, const std::string& name);

  /// Copies `count` elements of `elem_bytes` each into a free tx slot (waiting for a credit) and
  /// announces them. Returns once the bytes are in shared memory; never waits for the server's
  /// Newton-Schulz. Data larger than a slot is sent as several chunks.
  void push(const std::string& name, int64_t step, int64_t offset, const std::byte* data,
            int64_t count, size_t elem_bytes, transport::ChunkKind kind);
  /// Sends a commit.
  void commit(const std::string& name, int64_t step);
  /// Waits until the server has taken every pushed chunk out of shared memory (all tx slots
  /// acknowledged). Throws ConnectionLost / Timeout.
  void flush();

  /// Waits until the update of (name, step) is complete, then copies the packed want-range
  /// values (update dtype) to dst (want elements x update dtype bytes). Returns false when the
  /// server skipped the step (non-finite policy skip: zeros). Throws ServerError (the server's
  /// error for this parameter and step, e.g. a lost rank), ConnectionLost, Timeout.
  bool wait_update(const std::string& name, int64_t step, std::byte* dst);
  /// True when the update of (name, step) is complete.
  bool update_ready(const std::string& name, int64_t step);

  /// Fetches the full fp32 momentum and its last applied step.
  std::vector<float> fetch_momentum(const std::string& name, int64_t numel, int64_t* last_step);

  /// Asks for a snapshot; returns the path written.
  std::string snapshot(const std::string& path);
  /// Health check.
  transport::HealthOk health();
  /// Sends a step report (no answer; a malformed one would come back as an error).
  void send_step_report(const transport::StepReport& report);

  void set_update_callback(UpdateCallback cb);
  /// Announces the want ranges and update dtype of a parameter before its first update.
  void expect_updates(const std::string& name, std::vector<transport::Range> want,
                      size_t elem_bytes);

  const std::string& socket_path() const { return path_; }
  /// Empty while the connection is alive; the reason once it is lost.
  std::string lost_reason();

 private:
  /// Complete updates held per parameter before the oldest unread one is dropped.
  static constexpr size_t kMaxHeldUpdates = 16;

  struct Reply {
    bool done = false;
    transport::Frame frame;
    std::optional<transport::ErrorMsg> error;
  };
  struct ParamRx {
    std::vector<transport::Range> want;
    std::vector<int64_t> want_prefix;  // packed position of each want range
    int64_t want_elems = 0;
    size_t elem_bytes = 4;
    // The step being received: chunks land in `receiving` until the step's last one.
    std::vector<std::byte> receiving;
    int64_t receiving_step = -1;
    int64_t received = 0;
    bool receiving_applied = true;
    // Complete updates not yet taken by wait_update, by step. A rank that pushes nothing to a
    // parameter is not paced by the server: its updates for later steps can arrive before it
    // asks for an earlier one, so each complete step is kept until it is taken (or superseded:
    // wait_update(s) drops every step below s; at most kMaxHeldUpdates are kept).
    struct Complete {
      std::vector<std::byte> values;
      bool applied = true;
    };
    std::map<int64_t, Complete> complete;
    int64_t dropped_through = -1;  // steps <= this were dropped unread (kMaxHeldUpdates)
    std::vector<std::vector<std::byte>> spare;  // recycled buffers (warm pages)
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
  void send_frame(transport::MessageType type, const std::string& payload, uint32_t id = 0);
  void reader_loop();
  void handle(transport::Frame frame);
  void handle_update(const transport::Update& u);
  [[noreturn]] void throw_lost(const std::string& what);
  Clock::time_point deadline() const { return Clock::now() + op_timeout_; }
  /// The attempt pushes and commits of (name, step) carry. Takes mu_.
  uint32_t attempt_of(const std::string& name, int64_t step);

  std::string path_;
  int rank_;
  std::chrono::milliseconds op_timeout_;
  boost::asio::io_context io_;
  boost::asio::local::stream_protocol::socket socket_;
  std::optional<transport::ShmSegment> segment_;
  std::mutex write_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t next_request_ = 1;
  std::map<uint32_t, Reply> replies_;
  std::vector<bool> tx_busy_;
  std::map<std::string, ParamRx> params_;
  std::string lost_;
  UpdateCallback callback_;
  std::thread reader_;
};

}  // namespace muon::client

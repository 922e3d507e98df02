// A session from this server to another server of its pool (an owner it relays to, a buddy it
// replicates to), spoken asynchronously on this server's io_context: the client side of the
// protocol (transport/messages.hpp) — hello as a relay or replica rank, registrations, pushes
// and commits through the session's data plane (daemon/pool/link_plane.hpp) with ring credits,
// update chunks reassembled per parameter, momentum fetches — without a thread or a blocking call
// of its own: the io thread never waits for a peer (architecture guide §11, "pool").
//
// Calls are queued in call order and go out in that order once the hello is answered; a push of
// a parameter whose registration on this link is not answered yet waits for that answer (its
// chunks name the parameter by the id register_ok hands out). Every completion runs later on the
// link's strand, never inside the call that queued it.
//
// Threads: the link's socket and timers run on a strand of the server's io_context; the server
// runs that io_context on its one io thread, which is also the only thread that may call a link.
#pragma once

#include "transport/asio.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/error_code.hpp"
#include "daemon/pool/link_plane.hpp"
#include "transport/credit_ring.hpp"
#include "transport/frame.hpp"
#include "transport/messages.hpp"

namespace muon::daemon {

/// Why a call on a link failed, as the relay and the replicator tell the cases apart.
struct LinkError {
  enum class Kind {
    refused,  ///< the peer answered with an error (`code`, its message)
    timeout,  ///< no answer within the op timeout
    lost,     ///< the connection could not be made, or broke
  };
  Kind kind = Kind::lost;
  ErrorCode code = ErrorCode::peer_lost;
  std::string message;
  /// The link never got its hello answered (no server listening, a refused hello).
  bool never_connected = false;
};
/// nullopt: done.
using LinkResult = std::optional<LinkError>;

/// Who the link says it is and how it waits (muon-offloadd's pool flags).
struct PeerLinkConfig {
  std::string endpoint;  ///< the peer: a Unix socket path or "tcp://HOST:PORT"
  int rank = 0;          ///< transport::relay_rank or transport::replica_rank of this server
  int world_size = 1;    ///< compute ranks of the job
  std::string client_name;  ///< for the peer's logs
  transport::DataPlane data_plane = transport::DataPlane::shm;
  std::string auth_token;   ///< sent on a tcp endpoint only
  int relay_server = -1;    ///< this server's plan id on a relay session, else -1
  int replica_server = -1;  ///< this server's plan id on a replica session, else -1
  int device = 0;           ///< nccl: the CUDA device of this server
  /// Connecting retries (10 ms doubling to 1 s) until this has passed.
  std::chrono::milliseconds connect_timeout{10000};
  /// The hello's answer, a registration's, a fetch's, a free ring slot: each within this.
  std::chrono::milliseconds op_timeout{120000};
};

/// What a link tells its owner outside the answers to its calls; each runs on the strand.
struct PeerLinkEvents {
  /// The hello was answered: what the peer said of itself (snapshot path and interval).
  std::function<void(const transport::HelloOk&)> connected;
  /// The update of (name, step) is complete: its want elements (expect_updates) packed in
  /// ascending order, in the update dtype; `applied` false when the peer skipped the step.
  std::function<void(const std::string& name, int64_t step, bool applied,
                     std::vector<std::byte> values)>
      update;
  /// An error the peer sent that answers no call of this link: about a parameter, or (param
  /// empty) about the whole session (a shutdown, a protocol error).
  std::function<void(const transport::ErrorMsg&)> error;
  /// The link is lost (connect failed, hello refused, the connection broke); not after
  /// abandon() or close().
  std::function<void(const LinkError&)> lost;
};

class PeerLink : public std::enable_shared_from_this<PeerLink> {
 public:
  using Done = std::function<void(LinkResult)>;
  using RegisterDone = std::function<void(LinkResult, transport::RegisterOk)>;
  /// values: numel fp32; last_step: the peer's last applied step of the parameter.
  using FetchDone = std::function<void(LinkResult, std::vector<float> values, int64_t last_step)>;

  /// Starts connecting to config.endpoint (resolving a tcp host name first, on this thread).
  static std::shared_ptr<PeerLink> open(boost::asio::io_context& io, PeerLinkConfig config,
                                        PeerLinkEvents events);
  ~PeerLink();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  const std::string& endpoint() const { return config_.endpoint; }
  /// True until the link is lost, abandoned or closed.
  bool alive() const { return !failure_; }
  /// Why the link ended; nullopt while alive.
  const std::optional<LinkError>& failure() const { return failure_; }

  /// Sends `reg` (RegisterParam; a replica seal too) and calls `done` with the peer's
  /// register_ok or its refusal, a timeout, the link's loss.
  void register_param(const transport::RegisterParam& reg, RegisterDone done);
  /// The want ranges and update dtype of `name`'s updates, before its first (replaces earlier).
  void expect_updates(const std::string& name, std::vector<transport::Range> want,
                      transport::DType update_dtype, bool packed = false);
  /// Pushes `bytes` (elements of `dtype` from element `offset` on, or a packed position) as
  /// chunks of `kind` for (name, step), a chunk per ring slot as credits come back. `keep` is
  /// held until then: `bytes` must stay valid while it is. `done` once every chunk left (its
  /// bytes are in the peer's ring, or sent).
  void push(const std::string& name, int64_t step, int64_t offset, std::span<const std::byte> bytes,
            transport::DType dtype, transport::ChunkKind kind, std::shared_ptr<const void> keep,
            Done done);
  /// Commits (name, step): this link's contribution is complete. `done` once the frame is
  /// queued behind the pushes before it (or the link failed).
  void commit(const std::string& name, int64_t step, Done done);
  /// Fetches the peer's momentum of `name` (numel fp32; transport::StateFetch, `after_step`).
  void fetch_momentum(const std::string& name, int64_t numel, int64_t after_step, FetchDone done);

  /// Gives the link up: every call still owed fails with `why` (kind lost), the `lost` event is
  /// not raised, nothing connects again.
  void abandon(const std::string& why);
  /// Ends the link silently: nothing still owed is called (its owner is going away).
  void close();
  /// Ends the link in order, as a client that is done: nothing owed is called any more, the
  /// peer gets a goodbye (so it does not take this server for lost), and the socket closes once
  /// that is written. A later close() leaves it to finish. A link not connected just closes.
  void leave();

 private:
  PeerLink(boost::asio::io_context& io, PeerLinkConfig config, PeerLinkEvents events);

  /// A push whose chunks are being framed, until its out-of-band sends (nccl) are done.
  struct PushEnd {
    int64_t sends = 0;    ///< sent after their frame, not done yet
    bool framed = false;  ///< every chunk is framed
    LinkResult result;
    std::shared_ptr<const void> keep;
    Done done;
  };
  /// One call, kept in call order until it is on its way.
  struct Op {
    bool is_push = false;
    // a frame (registration, commit, state fetch)
    transport::MessageType type{};
    std::string payload;
    uint32_t request_id = 0;
    // a push
    std::string name;
    int64_t step = 0;
    int64_t offset = 0;
    int64_t count = 0;  ///< elements
    int64_t sent = 0;   ///< elements framed so far
    transport::DType dtype = transport::DType::f32;
    transport::ChunkKind kind = transport::ChunkKind::gradient;
    const std::byte* data = nullptr;
    std::shared_ptr<const void> keep;
    Done done;
    std::shared_ptr<PushEnd> end;  ///< made when its first chunk is framed
  };
  struct Reply {
    std::string name;  ///< the registration's parameter
    RegisterDone done;
    std::shared_ptr<boost::asio::steady_timer> timer;
  };
  struct Fetch {
    std::vector<float> values;
    FetchDone done;  ///< null once answered (a timeout): its chunks still land here
    std::shared_ptr<boost::asio::steady_timer> timer;
  };
  /// The update of one parameter being received.
  struct Receiving {
    RangeSet want;  ///< the update's elements this link receives, laid end to end
    transport::DType dtype = transport::DType::f32;
    bool packed = false;
    int64_t step = -1;  ///< -1: none being received
    int64_t received = 0;
    bool applied = true;
    std::shared_ptr<std::vector<std::byte>> values;
  };

  void connect();
  void on_connect(const boost::system::error_code& ec);
  void read();
  void handle(transport::Frame f);
  void on_hello(const transport::Frame& f);
  void on_update(transport::Update u);
  void on_error(transport::ErrorMsg e, uint32_t request_id);
  void on_register_ok(const transport::Frame& f);
  /// Sends what the queue's head allows: frames, and push chunks while credits last; a failure
  /// to send ends the link.
  void pump();
  void pump_ops();
  /// Frames the head push's chunks while credits last; true when every chunk is framed.
  bool frame_chunks(Op& op);
  void write(transport::MessageType type, const std::string& payload, uint32_t request_id,
             std::function<void()> after_written = {});
  void write_next();
  /// Ends the link: fails what is owed with `why` (unless closing), raises `lost` when asked.
  void fail(LinkError why, bool raise_lost);
  void finish_push(const std::shared_ptr<PushEnd>& end);
  /// `fn` later on the strand (completions never run inside the call that queued them).
  void later(std::function<void()> fn);
  std::shared_ptr<boost::asio::steady_timer> timer_after(std::chrono::milliseconds d,
                                                         std::function<void()> on_expiry);
  uint32_t wire_id(const std::string& name, transport::ChunkKind kind) const;
  uint32_t attempt_of(const std::string& name, int64_t step) const;
  LinkError lost_error(const std::string& why) const;
  std::string ms_text(std::chrono::milliseconds ms) const;

  boost::asio::strand<boost::asio::io_context::executor_type> strand_;
  PeerLinkConfig config_;
  PeerLinkEvents events_;
  boost::asio::generic::stream_protocol::socket socket_;
  boost::asio::steady_timer connect_timer_;
  std::chrono::steady_clock::time_point connect_deadline_;
  std::chrono::milliseconds backoff_{10};
  boost::asio::generic::stream_protocol::endpoint address_;
  bool hello_answered_ = false;
  std::shared_ptr<boost::asio::steady_timer> hello_timer_;
  std::optional<LinkError> failure_;
  bool closed_ = false;   ///< close() or leave(): nothing is called any more
  bool leaving_ = false;  ///< leave(): the goodbye is being written

  std::unique_ptr<LinkPlane> plane_;
  transport::CreditRing credits_;
  uint64_t chunk_bytes_ = 0;  // the most bytes one push frame announces (a slot; shm: <= 256 KiB)
  std::shared_ptr<boost::asio::steady_timer> stall_timer_;  ///< the head push waits for a credit

  std::deque<Op> ops_;
  uint32_t next_request_ = 2;  ///< 1 is the hello
  std::map<uint32_t, Reply> replies_;
  std::set<std::string> registering_;  ///< registrations sent, not answered
  std::map<std::string, uint32_t> param_ids_;
  std::map<uint32_t, std::string> param_names_;
  /// (name, step) -> the attempt its pushes and commits carry: raised by each error the peer
  /// sent about that step (transport::Push::attempt: a retry discards what is still in flight).
  std::map<std::pair<std::string, int64_t>, uint32_t> attempts_;
  std::map<std::string, std::deque<Fetch>> fetches_;
  std::map<std::string, Receiving> receiving_;
  std::set<std::shared_ptr<PushEnd>> push_ends_;

  struct Write {
    std::vector<std::byte> bytes;
    std::function<void()> after_written;
    bool when_leaving = false;  ///< the goodbye's: runs on a link that leaves
  };
  std::deque<Write> writes_;
  bool writing_ = false;
  transport::FrameDecoder decoder_;
  std::vector<std::byte> read_buf_ = std::vector<std::byte>(64 * 1024);
};

}  // namespace muon::daemon

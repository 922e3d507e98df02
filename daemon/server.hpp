// muon-offloadd's process shell: the Unix-socket acceptor, the peer-credential check, the optional
// TCP acceptor for clients on other nodes (--listen, token-checked in the hello), signal
// handling (SIGINT/SIGTERM: stop accepting, finish the work in flight, final snapshot), the
// optional Prometheus endpoint (--metrics-port) and the io_context that runs every session, the
// endpoint and the Engine on one thread.
#pragma once

#include "transport/asio.hpp"

#include <atomic>
#include <functional>
#include <memory>

#include "daemon/engine.hpp"
#include "daemon/metrics_http.hpp"
#include "daemon/server_config.hpp"

namespace muon::daemon {

class Server {
 public:
  /// Prepares the socket (private directory, stale-socket cleanup), creates the backend,
  /// restores the snapshot and binds the metrics endpoint when configured. Throws muon::Error
  /// (or BackendUnavailable) with a readable reason.
  explicit Server(ServerConfig config);
  ~Server();

  /// Serves until a signal or stop(); returns after the graceful shutdown.
  void run();
  /// Asks for a graceful shutdown (thread-safe).
  void stop();
  const std::string& socket_path() const { return config_.socket_path; }
  /// The TCP listener's port (0: none), e.g. after --listen HOST:0.
  uint16_t tcp_port() const;
  /// The metrics endpoint's port (0: none).
  uint16_t metrics_port() const { return metrics_ ? metrics_->port() : 0; }

 private:
  void listen_tcp();  // --listen: reads the token, binds the TCP acceptor
  void accept_next();
  void accept_next_tcp();
  /// Wraps an accepted connection in a Session and starts it.
  std::shared_ptr<Session> start_session(Session::Socket socket, bool tcp);
  /// TCP peers that have not said hello: at most this many at once, each for at most this long.
  static constexpr size_t kMaxPreHelloTcp = 64;
  static constexpr std::chrono::seconds kTcpHelloDeadline{10};
  /// After a failed accept: waits 100 ms on `timer` (warning at most every 10 s), then calls
  /// `again`.
  void retry_accept(boost::asio::steady_timer& timer, const boost::system::error_code& ec,
                    std::function<void()> again);
  void begin_shutdown(const std::string& why);

  ServerConfig config_;
  boost::asio::io_context io_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  /// The TCP control plane (--listen); closed when not configured.
  boost::asio::ip::tcp::acceptor tcp_acceptor_;
  boost::asio::signal_set signals_;
  /// After a failed accept (out of file descriptors: EMFILE/ENFILE), the next one waits 100 ms
  /// instead of spinning on the same error; the warning is logged at most every 10 s.
  boost::asio::steady_timer accept_retry_;
  boost::asio::steady_timer tcp_accept_retry_;
  std::chrono::steady_clock::time_point last_accept_warning_{};
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<MetricsHttpServer> metrics_;
  uint64_t next_session_ = 1;
  bool shutting_down_ = false;
};

}  // namespace muon::daemon

// The Prometheus endpoint of muon-offloadd: HTTP/1.1 (Boost.Beast) on the server's io_context.
// GET or HEAD /metrics answers the text exposition; any other path is 404, any other method on
// /metrics 405; a request that does not parse 400 (431, 413: header, body over Beast's limits)
// and the connection closed. Connections are kept alive as HTTP/1.1 asks, each closed after 30 s
// idle; past max_connections (or when the process runs out of descriptors) the oldest idle one is
// closed to make room, so that a new scrape is always answered and the endpoint never holds more
// than max_connections descriptors of the process the compute ranks need.
#pragma once

#include "transport/asio.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>

namespace muon::daemon {

class MetricsHttpServer {
 public:
  /// Renders the metrics text; called on the io thread for each scrape.
  using Render = std::function<std::string()>;

  /// Default cap on open connections.
  static constexpr size_t kDefaultMaxConnections = 64;

  /// Binds and listens on address:port (port 0: an ephemeral port, see port()). Throws
  /// muon::Error naming the address when the address does not parse or cannot be bound. Logs a
  /// warning when the address is not loopback. At most `max_connections` (>= 1) are kept open.
  MetricsHttpServer(boost::asio::io_context& io, const std::string& address, uint16_t port,
                    Render render, size_t max_connections = kDefaultMaxConnections);
  ~MetricsHttpServer();

  /// Starts accepting (io thread).
  void start();
  /// Stops accepting and closes every open connection, so that io_context::run() can return
  /// (io thread). Idempotent.
  void close();
  /// The bound port.
  uint16_t port() const { return port_; }
  /// "http://ADDRESS:PORT/metrics".
  std::string url() const;

 private:
  class Connection;
  void accept_next();
  // Forgets closed connections; returns how many are open.
  size_t open_connections();
  // Closes the oldest idle connection (else the oldest); false when none is open.
  bool evict_one();

  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_timer_;  // accept again after an error nothing relieved
  Render render_;
  std::string address_;
  uint16_t port_ = 0;
  size_t max_connections_;
  bool closed_ = false;
  std::optional<std::chrono::steady_clock::time_point> last_accept_warning_;
  std::list<std::weak_ptr<Connection>> connections_;
};

}  // namespace muon::daemon

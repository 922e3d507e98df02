// The Prometheus endpoint of muon-offloadd: HTTP/1.1 (Boost.Beast) on the server's io_context.
// GET or HEAD /metrics answers the text exposition; any other path is 404, any other method on
// /metrics 405. Connections are kept alive as HTTP/1.1 asks, each closed after 30 s idle.
#pragma once

#include "transport/asio.hpp"

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>

namespace muon::daemon {

class MetricsHttpServer {
 public:
  /// Renders the metrics text; called on the io thread for each scrape.
  using Render = std::function<std::string()>;

  /// Binds and listens on address:port (port 0: an ephemeral port, see port()). Throws
  /// muon::Error naming the address when the address does not parse or cannot be bound.
  MetricsHttpServer(boost::asio::io_context& io, const std::string& address, uint16_t port,
                    Render render);
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

  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  Render render_;
  std::string address_;
  uint16_t port_ = 0;
  bool closed_ = false;
  std::list<std::weak_ptr<Connection>> connections_;
};

}  // namespace muon::daemon

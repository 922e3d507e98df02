#include "daemon/server.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.hpp"
#include "daemon/socket_security.hpp"
#include "transport/auth_token.hpp"
#include "transport/endpoint.hpp"

namespace muon::daemon {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;

namespace {

std::shared_ptr<spdlog::logger> log() {
  auto l = spdlog::get("server");
  return l ? l : spdlog::default_logger();
}

ServerConfig with_defaults(ServerConfig c) {
  if (c.socket_path.empty()) c.socket_path = default_socket_path();
  return c;
}

}  // namespace

Server::Server(ServerConfig config)
    : config_(with_defaults(std::move(config))),
      acceptor_(io_),
      tcp_acceptor_(io_),
      signals_(io_, SIGINT, SIGTERM),
      accept_retry_(io_),
      tcp_accept_retry_(io_) {
  BackendConfig bc;
  bc.cpu_threads = config_.cpu_threads;
  bc.cuda_device = config_.cuda_device;
  auto backend = make_backend(config_.backend, bc);
  log()->info("backend: {}", backend->name());
  engine_ = std::make_unique<Engine>(io_, config_, std::move(backend));
  if (config_.metrics_port != 0) {
    metrics_ = std::make_unique<MetricsHttpServer>(io_, config_.metrics_address,
                                                   config_.metrics_port, [this] {
                                                     engine_->refresh_metrics();
                                                     return engine_->metrics().render();
                                                   });
    engine_->set_metrics_url(metrics_->url());
  }
  prepare_socket_path(config_.socket_path);
  const mode_t old_mask = ::umask(0177);  // the socket file is created 0600
  try {
    acceptor_.open(local());
    acceptor_.bind(local::endpoint(config_.socket_path));
    acceptor_.listen();
  } catch (const boost::system::system_error& e) {
    ::umask(old_mask);
    throw Error("cannot listen on '" + config_.socket_path + "': " + e.what());
  }
  ::umask(old_mask);
  ::chmod(config_.socket_path.c_str(), 0600);
  if (!config_.listen.empty()) {
    listen_tcp();
  } else if (!config_.auth_token_file.empty()) {
    log()->warn("--auth-token-file has no effect without --listen");
  }
}

void Server::listen_tcp() {
  if (config_.auth_token_file.empty()) {
    throw Error("--listen " + config_.listen +
                " needs --auth-token-file: a TCP peer has no uid to check, so clients prove "
                "themselves with a shared token");
  }
  try {
    config_.auth_token = transport::read_auth_token(config_.auth_token_file);
  } catch (const InvalidArgument& e) {
    throw Error(e.message());
  }
  engine_->set_auth_token(config_.auth_token);
  // HOST:PORT as clients write it (tcp://HOST:PORT): a port in [1, 65535], a host (0.0.0.0 or
  // [::] for every interface).
  transport::Endpoint where;
  try {
    where = transport::parse_endpoint("tcp://" + config_.listen);
  } catch (const InvalidArgument& e) {
    throw Error("--listen '" + config_.listen +
                "': expected HOST:PORT with a port in [1, 65535] (0.0.0.0:PORT for every "
                "interface)");
  }
  const std::string host = where.host, port = std::to_string(where.port);
  try {
    asio::ip::tcp::resolver resolver(io_);
    const auto results = resolver.resolve(host, port, asio::ip::tcp::resolver::passive);
    const auto endpoint = results.begin()->endpoint();
    tcp_acceptor_.open(endpoint.protocol());
    tcp_acceptor_.set_option(asio::ip::tcp::acceptor::reuse_address(true));
    tcp_acceptor_.bind(endpoint);
    tcp_acceptor_.listen();
  } catch (const boost::system::system_error& e) {
    throw Error("cannot listen on TCP '" + config_.listen + "' (expected HOST:PORT): " + e.what());
  }
}

uint16_t Server::tcp_port() const {
  boost::system::error_code ec;
  const auto ep = tcp_acceptor_.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

Server::~Server() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  tcp_acceptor_.close(ignored);
  ::unlink(config_.socket_path.c_str());
}

void Server::run() {
  signals_.async_wait([this](boost::system::error_code ec, int sig) {
    if (!ec) begin_shutdown(std::string("signal ") + (sig == SIGINT ? "SIGINT" : "SIGTERM"));
  });
  accept_next();
  log()->info("listening on {}", config_.socket_path);
  if (tcp_acceptor_.is_open()) {
    accept_next_tcp();
    log()->info("listening on tcp {} (port {}; token-checked)", config_.listen, tcp_port());
  }
  if (metrics_) {
    metrics_->start();
    log()->info("metrics on {}", metrics_->url());
  }
  io_.run();
  ::unlink(config_.socket_path.c_str());
  log()->info("stopped");
}

void Server::stop() {
  asio::post(io_, [this] { begin_shutdown("stop requested"); });
}

void Server::retry_accept(boost::asio::steady_timer& timer, const boost::system::error_code& ec,
                          std::function<void()> again) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_accept_warning_ > std::chrono::seconds(10)) {
    log()->warn("accept failed: {} (retrying every 100 ms)", ec.message());
    last_accept_warning_ = now;
  }
  timer.expires_after(std::chrono::milliseconds(100));
  timer.async_wait([this, again = std::move(again)](boost::system::error_code wec) {
    if (!wec && !shutting_down_) again();
  });
}

void Server::accept_next() {
  acceptor_.async_accept([this](boost::system::error_code ec, local::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted || shutting_down_) return;
      retry_accept(accept_retry_, ec, [this] { accept_next(); });
      return;
    }
    try {
      const auto cred = peer_credentials(socket.native_handle());
      if (cred.uid != ::getuid() && !config_.allow_other_users) {
        log()->warn("refused a connection from uid {} (pid {}): only uid {} may connect", cred.uid,
                    cred.pid, ::getuid());
        boost::system::error_code ignored;
        socket.close(ignored);
        accept_next();
        return;
      }
    } catch (const Error& e) {
      log()->warn("refused a connection: {}", e.what());
      accept_next();
      return;
    }
    start_session(Session::Socket(std::move(socket)), false);
    accept_next();
  });
}

void Server::accept_next_tcp() {
  tcp_acceptor_.async_accept([this](boost::system::error_code ec, asio::ip::tcp::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted || shutting_down_) return;
      retry_accept(tcp_accept_retry_, ec, [this] { accept_next_tcp(); });
      return;
    }
    boost::system::error_code ignored;
    // Peers that have not said hello yet are few and short-lived: beyond kMaxPreHelloTcp the
    // connection is dropped at once (an unauthenticated peer cannot exhaust descriptors).
    if (engine_->pre_hello_tcp_sessions() >= kMaxPreHelloTcp) {
      const auto now = std::chrono::steady_clock::now();
      if (now - last_accept_warning_ > std::chrono::seconds(10)) {
        log()->warn("dropping TCP connections: {} peers have not said hello", kMaxPreHelloTcp);
        last_accept_warning_ = now;
      }
      socket.close(ignored);
      accept_next_tcp();
      return;
    }
    socket.set_option(asio::ip::tcp::no_delay(true), ignored);
    // A node that vanishes without closing (power, network) is noticed by TCP keepalive.
    socket.set_option(asio::socket_base::keep_alive(true), ignored);
    int idle = 30, interval = 10, count = 3;
    ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    auto session = start_session(Session::Socket(std::move(socket)), true);
    // ... and must say hello soon.
    session->hello_timer = std::make_unique<asio::steady_timer>(io_, kTcpHelloDeadline);
    session->hello_timer->async_wait(
        [weak = std::weak_ptr<Session>(session)](boost::system::error_code ec) {
          auto s = weak.lock();
          if (ec || !s || s->rank >= 0 || s->closed()) return;
          s->close("no hello within " + std::to_string(kTcpHelloDeadline.count()) + " s");
        });
    accept_next_tcp();
  });
}

std::shared_ptr<Session> Server::start_session(Session::Socket socket, bool tcp) {
  auto session = std::make_shared<Session>(
      std::move(socket), next_session_++,
      [this](const Engine::SessionPtr& s, transport::Frame f) {
        engine_->on_frame(s, std::move(f));
      },
      [this](const Engine::SessionPtr& s, const std::string& why) { engine_->on_closed(s, why); });
  session->tcp = tcp;
  engine_->add_session(session);
  session->start();
  return session;
}

void Server::begin_shutdown(const std::string& why) {
  if (shutting_down_) return;
  shutting_down_ = true;
  log()->info("shutting down ({}): no new connections, finishing work in flight", why);
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  tcp_acceptor_.close(ignored);
  accept_retry_.cancel();
  tcp_accept_retry_.cancel();
  signals_.cancel(ignored);
  if (metrics_) metrics_->close();
  engine_->shutdown(why, [] {});
}

}  // namespace muon::daemon

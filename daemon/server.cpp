#include "daemon/server.hpp"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.hpp"
#include "daemon/socket_security.hpp"

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
      signals_(io_, SIGINT, SIGTERM),
      accept_retry_(io_) {
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
}

Server::~Server() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  ::unlink(config_.socket_path.c_str());
}

void Server::run() {
  signals_.async_wait([this](boost::system::error_code ec, int sig) {
    if (!ec) begin_shutdown(std::string("signal ") + (sig == SIGINT ? "SIGINT" : "SIGTERM"));
  });
  accept_next();
  log()->info("listening on {}", config_.socket_path);
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

void Server::accept_next() {
  acceptor_.async_accept([this](boost::system::error_code ec, local::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted || shutting_down_) return;
      const auto now = std::chrono::steady_clock::now();
      if (now - last_accept_warning_ > std::chrono::seconds(10)) {
        log()->warn("accept failed: {} (retrying every 100 ms)", ec.message());
        last_accept_warning_ = now;
      }
      accept_retry_.expires_after(std::chrono::milliseconds(100));
      accept_retry_.async_wait([this](boost::system::error_code wec) {
        if (!wec && !shutting_down_) accept_next();
      });
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
    auto session = std::make_shared<Session>(
        std::move(socket), next_session_++,
        [this](const Engine::SessionPtr& s, transport::Frame f) {
          engine_->on_frame(s, std::move(f));
        },
        [this](const Engine::SessionPtr& s, const std::string& why) {
          engine_->on_closed(s, why);
        });
    engine_->add_session(session);
    session->start();
    accept_next();
  });
}

void Server::begin_shutdown(const std::string& why) {
  if (shutting_down_) return;
  shutting_down_ = true;
  log()->info("shutting down ({}): no new connections, finishing work in flight", why);
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  signals_.cancel(ignored);
  if (metrics_) metrics_->close();
  engine_->shutdown([] {});
}

}  // namespace muon::daemon

#include "daemon/metrics_http.hpp"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <exception>
#include <optional>

#include "core/error.hpp"

namespace muon::daemon {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kIdleTimeout = std::chrono::seconds(30);
// How long a connection answered with an error may keep sending before it is closed, and how
// many of its bytes are read (and dropped) meanwhile: closing with unread bytes would reset the
// connection and the client could lose the answer.
constexpr auto kLingerTimeout = std::chrono::seconds(2);
constexpr size_t kLingerBytes = size_t{4} << 20;
// Pause before accepting again after an accept error that nothing could relieve (no descriptor).
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);
// At most one accept-failure warning this often (a failing accept must not flood the log).
constexpr auto kAcceptWarningEvery = std::chrono::seconds(10);
constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

// The path of a request target without its query string; an absolute-form target
// ("http://host:port/metrics", RFC 9112 3.2.2) is reduced to its path.
std::string path_of(beast::string_view target) {
  std::string t(target);
  t = t.substr(0, t.find('?'));
  if (const auto scheme = t.find("://"); scheme != std::string::npos && t[0] != '/') {
    const auto slash = t.find('/', scheme + 3);
    t = slash == std::string::npos ? "/" : t.substr(slash);
  }
  return t;
}

// The answer to a request Beast could not parse: 431 when the header is too large, 413 when the
// body is, else 400. Nullopt for errors that are not the client's request (EOF, reset, timeout).
std::optional<http::status> status_of_read_error(const beast::error_code& ec) {
  if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
      ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
      ec == asio::error::eof || ec == asio::error::broken_pipe ||
      ec == http::error::partial_message) {
    return std::nullopt;
  }
  if (ec == http::error::header_limit) return http::status::request_header_fields_too_large;
  if (ec == http::error::body_limit) return http::status::payload_too_large;
  if (ec.category() == http::make_error_code(http::error::bad_target).category()) {
    return http::status::bad_request;
  }
  return std::nullopt;
}

bool out_of_descriptors(const boost::system::error_code& ec) {
  return ec == asio::error::no_descriptors || ec.value() == ENFILE || ec.value() == ENOBUFS ||
         ec.value() == ENOMEM;
}

}  // namespace

// One HTTP connection: read a request, answer it, repeat while the client keeps it alive. A
// request Beast cannot parse is answered 400 (431, 413 for a header or body over its limit) and
// the connection closed.
class MetricsHttpServer::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const Render& render)
      : stream_(std::move(socket)), render_(render) {}

  void start() { read_next(); }
  void close() {
    closed_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }
  /// Waiting for a request with none of its bytes received yet (the one to evict first).
  bool idle() const { return !closed_ && reading_ && buffer_.size() == 0; }
  bool closed() const { return closed_; }

 private:
  void read_next() {
    request_ = {};
    reading_ = true;
    stream_.expires_after(kIdleTimeout);
    http::async_read(stream_, buffer_, request_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->reading_ = false;
                       if (self->closed_) return;
                       if (ec) {
                         // EOF, timeout, reset, close(): nothing to answer.
                         if (auto status = status_of_read_error(ec)) {
                           self->answer_error(*status, ec.message());
                         } else {
                           self->close();
                         }
                         return;
                       }
                       self->answer();
                     });
  }

  void answer() {
    auto res = std::make_shared<http::response<http::string_body>>();
    res->version(request_.version());
    res->keep_alive(request_.keep_alive());
    res->set(http::field::server, "muon-offloadd");
    const bool get = request_.method() == http::verb::get;
    const bool head = request_.method() == http::verb::head;
    if (path_of(request_.target()) != "/metrics") {
      res->result(http::status::not_found);
      res->set(http::field::content_type, "text/plain; charset=utf-8");
      res->body() = "not found: muon-offloadd serves GET /metrics\n";
    } else if (!get && !head) {
      res->result(http::status::method_not_allowed);
      res->set(http::field::allow, "GET, HEAD");
      res->set(http::field::content_type, "text/plain; charset=utf-8");
      res->body() = "method not allowed: use GET /metrics\n";
    } else {
      try {
        res->body() = render_();
        res->result(http::status::ok);
        res->set(http::field::content_type, kContentType);
      } catch (const std::exception& e) {
        spdlog::error("metrics endpoint: cannot render the metrics: {}", e.what());
        res->result(http::status::internal_server_error);
        res->set(http::field::content_type, "text/plain; charset=utf-8");
        res->body() = std::string("cannot render the metrics: ") + e.what() + "\n";
      }
    }
    res->prepare_payload();
    if (head) res->body().clear();  // Content-Length stays that of the GET answer
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res](beast::error_code ec, size_t) {
                        if (ec || !res->keep_alive()) {
                          self->close();
                          return;
                        }
                        self->read_next();
                      });
  }

  // Answers a request that could not be parsed, then closes: shuts the sending side and reads
  // what the client still sends (at most kLingerBytes, kLingerTimeout) so that the close does
  // not reset the connection before the client read the answer.
  void answer_error(http::status status, const std::string& why) {
    auto res = std::make_shared<http::response<http::string_body>>(status, 11);
    res->set(http::field::server, "muon-offloadd");
    res->set(http::field::content_type, "text/plain; charset=utf-8");
    res->keep_alive(false);
    res->body() = "bad request: " + why + "; muon-offloadd serves GET /metrics\n";
    res->prepare_payload();
    stream_.expires_after(kLingerTimeout);
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res](beast::error_code ec, size_t) {
                        if (ec || self->closed_) {
                          self->close();
                          return;
                        }
                        beast::error_code ignored;
                        self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
                        self->buffer_.clear();
                        self->drain(0);
                      });
  }

  void drain(size_t drained) {
    if (drained > kLingerBytes) {
      close();
      return;
    }
    stream_.async_read_some(drain_.prepare(64 * 1024),
                            [self = shared_from_this(), drained](beast::error_code ec, size_t n) {
                              self->drain_.clear();
                              if (ec || self->closed_) {
                                self->close();
                                return;
                              }
                              self->drain(drained + n);
                            });
  }

  beast::tcp_stream stream_;
  Render render_;
  beast::flat_buffer buffer_;
  beast::flat_buffer drain_;
  http::request<http::string_body> request_;
  bool reading_ = false;
  bool closed_ = false;
};

MetricsHttpServer::MetricsHttpServer(asio::io_context& io, const std::string& address,
                                     uint16_t port, Render render, size_t max_connections)
    : io_(io),
      acceptor_(io),
      retry_timer_(io),
      render_(std::move(render)),
      address_(address),
      max_connections_(std::max<size_t>(1, max_connections)) {
  boost::system::error_code ec;
  const auto ip = asio::ip::make_address(address, ec);
  if (ec) throw Error("metrics address '" + address + "' is not an IP address: " + ec.message());
  try {
    const tcp::endpoint ep(ip, port);
    acceptor_.open(ep.protocol());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    acceptor_.bind(ep);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    throw Error("cannot serve metrics on " + address + ":" + std::to_string(port) + ": " +
                e.code().message());
  }
  if (!ip.is_loopback()) {
    spdlog::warn(
        "metrics endpoint on {} is not loopback: anyone who can reach it reads the parameter "
        "names and the job's figures",
        address);
  }
}

MetricsHttpServer::~MetricsHttpServer() = default;

std::string MetricsHttpServer::url() const {
  const bool v6 = address_.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + address_ + "]" : address_) + ":" + std::to_string(port_) +
         "/metrics";
}

void MetricsHttpServer::start() {
  accept_next();
}

void MetricsHttpServer::close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_timer_.cancel();
  for (auto& w : connections_) {
    if (auto c = w.lock()) c->close();
  }
  connections_.clear();
}

size_t MetricsHttpServer::open_connections() {
  connections_.remove_if([](const std::weak_ptr<Connection>& w) {
    auto c = w.lock();
    return !c || c->closed();
  });
  return connections_.size();
}

bool MetricsHttpServer::evict_one() {
  open_connections();
  // The oldest connection waiting for a request, else the oldest of all.
  auto victim = connections_.end();
  for (auto it = connections_.begin(); it != connections_.end(); ++it) {
    auto c = it->lock();
    if (c && c->idle()) {
      victim = it;
      break;
    }
  }
  if (victim == connections_.end()) victim = connections_.begin();
  if (victim == connections_.end()) return false;
  if (auto c = victim->lock()) c->close();
  connections_.erase(victim);
  return true;
}

void MetricsHttpServer::accept_next() {
  acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (closed_) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return accept_next();
      const bool no_fd = out_of_descriptors(ec);
      const auto now = std::chrono::steady_clock::now();
      if (!last_accept_warning_ || now - *last_accept_warning_ > kAcceptWarningEvery) {
        spdlog::warn("metrics endpoint: accept failed: {}{}", ec.message(),
                     no_fd ? " (closing the oldest metrics connections to make room)" : "");
        last_accept_warning_ = now;
      }
      // Out of descriptors: give one of ours back and try at once; otherwise (or with none to
      // give) wait a moment rather than spin on the io thread the compute ranks share.
      if (no_fd && evict_one()) return accept_next();
      retry_timer_.expires_after(kAcceptRetry);
      retry_timer_.async_wait([this](boost::system::error_code wec) {
        if (!wec && !closed_) accept_next();
      });
      return;
    }
    while (open_connections() >= max_connections_ && evict_one()) {
    }
    auto c = std::make_shared<Connection>(std::move(socket), render_);
    connections_.push_back(c);
    c->start();
    accept_next();
  });
}

}  // namespace muon::daemon

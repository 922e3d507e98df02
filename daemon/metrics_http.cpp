#include "daemon/metrics_http.hpp"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <spdlog/spdlog.h>

#include <chrono>

#include "core/error.hpp"

namespace muon::daemon {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kIdleTimeout = std::chrono::seconds(30);
constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

// The path of a request target without its query string.
std::string path_of(beast::string_view target) {
  const std::string t(target);
  return t.substr(0, t.find('?'));
}

}  // namespace

// One HTTP connection: read a request, answer it, repeat while the client keeps it alive.
class MetricsHttpServer::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const Render& render)
      : stream_(std::move(socket)), render_(render) {}

  void start() { read_next(); }
  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

 private:
  void read_next() {
    request_ = {};
    stream_.expires_after(kIdleTimeout);
    http::async_read(stream_, buffer_, request_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) {
                         self->close();  // EOF, timeout, a malformed request, or close()
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
      res->result(http::status::ok);
      res->set(http::field::content_type, kContentType);
      res->body() = render_();
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

  beast::tcp_stream stream_;
  Render render_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
};

MetricsHttpServer::MetricsHttpServer(asio::io_context& io, const std::string& address,
                                     uint16_t port, Render render)
    : io_(io), acceptor_(io), render_(std::move(render)), address_(address) {
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
  for (auto& w : connections_) {
    if (auto c = w.lock()) c->close();
  }
  connections_.clear();
}

void MetricsHttpServer::accept_next() {
  acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (closed_) return;
    if (ec) {
      if (ec != asio::error::operation_aborted) {
        spdlog::warn("metrics endpoint: accept failed: {}", ec.message());
      }
      accept_next();
      return;
    }
    connections_.remove_if([](const std::weak_ptr<Connection>& w) { return w.expired(); });
    auto c = std::make_shared<Connection>(std::move(socket), render_);
    connections_.push_back(c);
    c->start();
    accept_next();
  });
}

}  // namespace muon::daemon

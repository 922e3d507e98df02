#include "client/health_probe.hpp"

#include <algorithm>
#include <array>
#include <exception>
#include <functional>
#include <optional>
#include <thread>

#include "client/client_error.hpp"
#include "transport/asio.hpp"
#include "transport/endpoint.hpp"
#include "transport/frame.hpp"

namespace muon::client {
namespace {

namespace asio = boost::asio;

// One request/answer exchange on a fresh connection to `path` (a socket path or
// "tcp://HOST:PORT"), given `budget` to complete: a peer that accepts and never answers
// (something else listening, a wedged process) must not hang the caller. Throws
// boost::system::system_error (connect, I/O), ProtocolError (not our protocol, no answer in
// time) or InvalidArgument (a malformed endpoint, a host that does not resolve).
transport::Frame exchange(const std::string& path, transport::MessageType type,
                          std::chrono::milliseconds budget) {
  asio::io_context io;
  const transport::Endpoint where = transport::parse_endpoint(path);
  const auto address = transport::resolve(where, io);
  asio::generic::stream_protocol::socket s(io);
  const auto bytes = transport::encode_frame({static_cast<uint16_t>(type), 1, "{}"});
  transport::FrameDecoder dec;
  std::array<std::byte, 64 * 1024> buf;
  std::optional<transport::Frame> answer;
  boost::system::error_code failed;
  std::exception_ptr bad_frame;
  std::function<void()> read_more = [&] {
    s.async_read_some(asio::buffer(buf), [&](boost::system::error_code ec, size_t n) {
      if (ec) {
        failed = ec;
        return;
      }
      try {
        dec.feed(buf.data(), n);
        if (auto f = dec.next()) {
          answer = std::move(*f);
          return;
        }
      } catch (...) {
        bad_frame = std::current_exception();
        return;
      }
      read_more();
    });
  };
  s.async_connect(address, [&](boost::system::error_code ec) {
    if (ec) {
      failed = ec;
      return;
    }
    transport::tune_connected(s, where);
    asio::async_write(s, asio::buffer(bytes), [&](boost::system::error_code wec, size_t) {
      if (wec) {
        failed = wec;
        return;
      }
      read_more();
    });
  });
  io.run_for(budget);
  if (bad_frame) std::rethrow_exception(bad_frame);
  if (answer) return *answer;
  if (failed) throw boost::system::system_error(failed);
  throw transport::ProtocolError("connected, but no answer within " +
                                 std::to_string(budget.count()) +
                                 " ms (is something other than muon-offloadd listening there?)");
}

constexpr std::chrono::milliseconds kMinAttempt{250};

template <class F>
auto retry(const std::string& path, std::chrono::milliseconds timeout, const char* what, F&& f) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  std::string last = "not tried";
  for (;;) {
    try {
      // Each attempt gets what is left of the timeout, at least kMinAttempt.
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (auto r = f(std::max(left, kMinAttempt))) return *r;
      last = "server not ready";
    } catch (const boost::system::system_error& e) {
      last = e.code().message();
    } catch (const transport::ProtocolError& e) {
      last = e.message();
    }
    if (std::chrono::steady_clock::now() > end) {
      throw ConnectionLost(std::string(what) + " of muon-offloadd at '" + path + "' failed for " +
                           std::to_string(timeout.count()) + " ms: " + last);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

transport::HealthOk wait_healthy(const std::string& socket_path,
                                 std::chrono::milliseconds timeout) {
  return retry(socket_path, timeout, "health check",
               [&](std::chrono::milliseconds budget) -> std::optional<transport::HealthOk> {
                 auto f = exchange(socket_path, transport::MessageType::health, budget);
                 if (f.type != static_cast<uint16_t>(transport::MessageType::health_ok))
                   return std::nullopt;
                 auto h = transport::decode<transport::HealthOk>(f.payload);
                 if (!h.ready) return std::nullopt;
                 return h;
               });
}

std::string fetch_status(const std::string& socket_path, std::chrono::milliseconds timeout) {
  if (transport::parse_endpoint(socket_path).is_tcp()) {
    throw InvalidArgument(
        "status of muon-offloadd at '" + socket_path +
        "' is not available over TCP: a TCP peer gets nothing but health before a token-checked "
        "hello; ask on the server's node through its Unix socket (muon-offload status --socket "
        "PATH)");
  }
  return retry(socket_path, timeout, "status request",
               [&](std::chrono::milliseconds budget) -> std::optional<std::string> {
                 auto f = exchange(socket_path, transport::MessageType::status, budget);
                 if (f.type != static_cast<uint16_t>(transport::MessageType::status_ok))
                   return std::nullopt;
                 return f.payload;
               });
}

}  // namespace muon::client

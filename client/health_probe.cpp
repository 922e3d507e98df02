#include "client/health_probe.hpp"

#include <thread>

#include "client/client_error.hpp"
#include "transport/asio.hpp"
#include "transport/frame.hpp"

namespace muon::client {
namespace {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;

// One request/answer exchange on a fresh connection; throws boost::system::system_error.
transport::Frame exchange(const std::string& path, transport::MessageType type) {
  asio::io_context io;
  local::socket s(io);
  s.connect(local::endpoint(path));
  const auto bytes = transport::encode_frame({static_cast<uint16_t>(type), 1, "{}"});
  asio::write(s, asio::buffer(bytes));
  transport::FrameDecoder dec;
  std::array<std::byte, 64 * 1024> buf;
  for (;;) {
    const size_t n = s.read_some(asio::buffer(buf));
    dec.feed(buf.data(), n);
    if (auto f = dec.next()) return *f;
  }
}

template <class F>
auto retry(const std::string& path, std::chrono::milliseconds timeout, const char* what, F&& f) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  std::string last = "not tried";
  for (;;) {
    try {
      if (auto r = f()) return *r;
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
  return retry(socket_path, timeout, "health check", [&]() -> std::optional<transport::HealthOk> {
    auto f = exchange(socket_path, transport::MessageType::health);
    if (f.type != static_cast<uint16_t>(transport::MessageType::health_ok)) return std::nullopt;
    auto h = transport::decode<transport::HealthOk>(f.payload);
    if (!h.ready) return std::nullopt;
    return h;
  });
}

std::string fetch_status(const std::string& socket_path, std::chrono::milliseconds timeout) {
  return retry(socket_path, timeout, "status request", [&]() -> std::optional<std::string> {
    auto f = exchange(socket_path, transport::MessageType::status);
    if (f.type != static_cast<uint16_t>(transport::MessageType::status_ok)) return std::nullopt;
    return f.payload;
  });
}

}  // namespace muon::client

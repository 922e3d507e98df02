#include "transport/endpoint.hpp"

#include <sys/un.h>

#include <charconv>

#include "core/error.hpp"

namespace muon::transport {

namespace asio = boost::asio;

Endpoint parse_endpoint(std::string_view text) {
  Endpoint e;
  e.text = std::string(text);
  if (text.empty()) throw InvalidArgument("empty server endpoint");
  constexpr std::string_view tcp = "tcp://";
  if (!text.starts_with(tcp)) {
    if (text.size() >= sizeof(sockaddr_un::sun_path)) {
      throw InvalidArgument("socket path '" + e.text + "' is longer than " +
                            std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
    }
    e.path = e.text;
    return e;
  }
  e.kind = Endpoint::Kind::tcp;
  std::string_view rest = text.substr(tcp.size());
  const auto colon = rest.rfind(':');
  if (colon == std::string_view::npos) {
    throw InvalidArgument("endpoint '" + e.text + "': expected tcp://HOST:PORT");
  }
  std::string_view host = rest.substr(0, colon), port = rest.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (host.empty() || ec != std::errc() || end != port.data() + port.size() || value == 0 ||
      value > 65535) {
    throw InvalidArgument("endpoint '" + e.text +
                          "': expected tcp://HOST:PORT with a port in [1, 65535]");
  }
  e.host = std::string(host);
  e.port = static_cast<uint16_t>(value);
  return e;
}

bool any_tcp_endpoint(const std::vector<std::string>& endpoints) {
  for (const auto& e : endpoints) {
    if (parse_endpoint(e).is_tcp()) return true;
  }
  return false;
}

asio::generic::stream_protocol::endpoint resolve(const Endpoint& e, asio::io_context& io) {
  if (!e.is_tcp()) return asio::local::stream_protocol::endpoint(e.path);
  asio::ip::tcp::resolver resolver(io);
  boost::system::error_code ec;
  const auto results = resolver.resolve(e.host, std::to_string(e.port), ec);
  if (ec || results.empty()) {
    throw InvalidArgument("endpoint '" + e.text + "': cannot resolve '" + e.host +
                          "': " + (ec ? ec.message() : std::string("no address")));
  }
  return results.begin()->endpoint();
}

void tune_connected(asio::generic::stream_protocol::socket& socket, const Endpoint& e) {
  if (!e.is_tcp()) return;
  boost::system::error_code ignored;
  socket.set_option(asio::ip::tcp::no_delay(true), ignored);
}

}  // namespace muon::transport

// Where a muon-offloadd listens, as the client and the launcher name it: a Unix socket path on
// this node ("/run/user/1000/muon-offload/muon-offloadd.sock"), or "tcp://HOST:PORT" for a
// server on another node (its control plane only: gradient and update bytes then need the nccl
// data plane; transport/messages.hpp). Connections of either kind are Asio generic stream
// sockets, so the session and the client code is the same for both.
#pragma once

#include "transport/asio.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace muon::transport {

struct Endpoint {
  enum class Kind { unix_socket, tcp };
  Kind kind = Kind::unix_socket;
  std::string path;  ///< unix_socket: the socket file
  std::string host;  ///< tcp: a host name or address ("[::1]" brackets removed)
  uint16_t port = 0;
  std::string text;  ///< as given, for messages
  bool is_tcp() const { return kind == Kind::tcp; }
};

/// "tcp://HOST:PORT" (HOST may be a bracketed IPv6 address) or any other non-empty string as a
/// Unix socket path. Throws InvalidArgument for an empty string, a tcp endpoint without host or
/// with a port outside [1, 65535], or a path longer than a Unix socket address holds (107 bytes).
Endpoint parse_endpoint(std::string_view text);

/// True when one of `endpoints` is tcp://. Throws as parse_endpoint for a malformed one.
bool any_tcp_endpoint(const std::vector<std::string>& endpoints);

/// The address to connect to: the socket path, or the first address HOST resolves to. Throws
/// InvalidArgument naming the endpoint when HOST does not resolve.
boost::asio::generic::stream_protocol::endpoint resolve(const Endpoint& endpoint,
                                                        boost::asio::io_context& io);

/// Sets the options a control connection wants once connected: TCP_NODELAY on tcp (small frames
/// must not wait for Nagle). Ignores errors (the connection works without).
void tune_connected(boost::asio::generic::stream_protocol::socket& socket, const Endpoint& e);

}  // namespace muon::transport

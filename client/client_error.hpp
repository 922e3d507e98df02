// Errors the client raises. Each names the server and, where one is involved, the parameter,
// the step and the rank.
#pragma once

#include <string>

#include "core/error.hpp"
#include "core/error_code.hpp"

namespace muon::client {

/// The server refused a request or reported a failure. `code` is the server's (bad_request,
/// non_finite, peer_lost, timeout, shutdown, ...; core/error_code.hpp), or bad_reply / unsupported
/// when the client cannot use the server's answer.
class ServerError : public Error {
 public:
  ServerError(const std::string& message, ErrorCode code, std::string param, int64_t step,
              int rank, std::source_location where = std::source_location::current())
      : Error(message, where), code(code), param(std::move(param)), step(step), rank(rank) {}
  ErrorCode code;
  std::string param;
  int64_t step;
  int rank;
};

/// The connection to a server is gone (server died, restarted, or dropped this client).
class ConnectionLost : public Error {
 public:
  explicit ConnectionLost(const std::string& message,
                          std::source_location where = std::source_location::current())
      : Error(message, where) {}
};

/// A wait ran past its timeout.
class Timeout : public Error {
 public:
  explicit Timeout(const std::string& message,
                   std::source_location where = std::source_location::current())
      : Error(message, where) {}
};

}  // namespace muon::client

// Error types of muon-offload. Every error carries the file:line where it was raised, so a
// message that reaches a user or a log names its origin (DeepEP-style host exceptions).
#pragma once

#include <exception>
#include <source_location>
#include <stdexcept>
#include <string>

namespace muon {

/// Base class of every error this project raises. `what()` is
/// "<message> [<file>:<line>]"; `message()` is the text alone.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message,
                 std::source_location where = std::source_location::current())
      : std::runtime_error(message + " [" + short_file(where.file_name()) + ":" +
                           std::to_string(where.line()) + "]"),
        message_(message) {}
  const std::string& message() const noexcept { return message_; }

 private:
  static std::string short_file(const char* path) {
    std::string p(path);
    auto pos = p.rfind('/');
    return pos == std::string::npos ? p : p.substr(pos + 1);
  }
  std::string message_;
};

/// Bad input from a caller: a wrong shape, an unknown name, an out-of-range option.
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& message,
                           std::source_location where = std::source_location::current())
      : Error(message, where) {}
};

/// A gradient or momentum holds NaN or Inf and the non-finite policy is `error`.
class NonFiniteError : public Error {
 public:
  explicit NonFiniteError(const std::string& message,
                          std::source_location where = std::source_location::current())
      : Error(message, where) {}
};

/// A backend cannot run here (no GPU, driver too old, built without CUDA).
/// Tests treat it as "skip", never as a failure.
class BackendUnavailable : public Error {
 public:
  explicit BackendUnavailable(const std::string& message,
                              std::source_location where = std::source_location::current())
      : Error(message, where) {}
};

/// A CUDA, cuBLAS or NCCL call failed (see core/cuda_check.hpp).
class DeviceError : public Error {
 public:
  explicit DeviceError(const std::string& message,
                       std::source_location where = std::source_location::current())
      : Error(message, where) {}
};

/// The message of the exception `error` holds (what()), for a failure handed on as an
/// exception_ptr (e.g. a device copy's, daemon/completion_queue.hpp); "unknown error" for one
/// that is no std::exception. `error` must not be null.
inline std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace muon

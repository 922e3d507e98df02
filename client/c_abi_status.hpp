// How the C ABIs (libmuon_offload_client.so, libmuon_offload_reference.so) report failures: a
// MUON_ERR_* status as the return value, and per calling thread the message and the ErrorCode
// of the last failure. Each library keeps its own thread_local CAbiStatus.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include "client/client_error.hpp"
#include "client/muon_status.h"
#include "core/error.hpp"
#include "core/error_code.hpp"

namespace muon::capi {

/// The last failure on one thread.
struct CAbiStatus {
  std::string message;
  ErrorCode code = ErrorCode::none;
  /// What a server's error names (client::ServerError): the parameter ("" none), the step and
  /// the rank (-1 none); for the client's own failures "" and -1.
  std::string param;
  int64_t step = -1;
  int rank = -1;

  /// Records a failure; returns `status` (a MUON_ERR_* value).
  int fail(int status, ErrorCode cause, const std::string& text) {
    message = text;
    code = cause;
    return status;
  }
  /// Records a server's error, with what it names.
  int fail_server(int status, const client::ServerError& e, const std::string& text) {
    param = e.param;
    step = e.step;
    rank = e.rank;
    return fail(status, e.code, text);
  }
};

/// Runs `f` (returning a status >= 0), clearing `last` first; maps each exception to its
/// MUON_ERR_* status, ErrorCode and message (a server's code also travels in the message, as
/// "(server error code: NAME)", for callers that read it from there).
template <class F>
int guarded(CAbiStatus& last, F&& f) {
  try {
    last = CAbiStatus{};
    return f();
  } catch (const client::ServerError& e) {
    switch (e.code) {
      case ErrorCode::non_finite:
        return last.fail_server(MUON_ERR_NONFINITE, e, e.what());
      case ErrorCode::peer_lost:
        return last.fail_server(MUON_ERR_PEER_LOST, e, e.what());
      case ErrorCode::timeout:
        return last.fail_server(MUON_ERR_TIMEOUT, e, e.what());
      default:
        return last.fail_server(MUON_ERR_SERVER, e,
                                std::string(e.what()) + " (server error code: " +
                                    std::string(error_code_name(e.code)) + ")");
    }
  } catch (const client::ConnectionLost& e) {
    return last.fail(MUON_ERR_CONNECTION, ErrorCode::connection_lost, e.what());
  } catch (const client::Timeout& e) {
    return last.fail(MUON_ERR_TIMEOUT, ErrorCode::timeout, e.what());
  } catch (const NonFiniteError& e) {
    return last.fail(MUON_ERR_NONFINITE, ErrorCode::non_finite, e.what());
  } catch (const InvalidArgument& e) {
    return last.fail(MUON_ERR_INVALID, ErrorCode::invalid_argument, e.what());
  } catch (const DeviceError& e) {
    return last.fail(MUON_ERR_DEVICE, ErrorCode::device, e.what());
  } catch (const BackendUnavailable& e) {
    return last.fail(MUON_ERR_UNAVAILABLE, ErrorCode::unavailable, e.what());
  } catch (const std::exception& e) {
    return last.fail(MUON_ERR_INTERNAL, ErrorCode::internal, e.what());
  }
}

}  // namespace muon::capi

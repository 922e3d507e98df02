// Frame dispatch: which frames a session may send before hello, the handler of each type, and the
// mapping of exceptions to the error codes a client sees.
#include "daemon/engine.hpp"

#include "core/error.hpp"
#include "daemon/log.hpp"

namespace muon::daemon {

using transport::ErrorMsg;
using transport::Frame;
using transport::MessageType;

void Engine::on_frame(const SessionPtr& s, Frame f) {
  const auto type = static_cast<MessageType>(f.type);
  try {
    // Before hello only health answers, and status on the Unix socket (uid-checked); a TCP peer
    // must say hello with the token first.
    if (type != MessageType::hello && type != MessageType::health && s->rank < 0 &&
        (type != MessageType::status || s->tcp)) {
      throw transport::ProtocolError(transport::message_type_name(f.type) +
                                     " before hello: say hello first");
    }
    switch (type) {
      case MessageType::hello:
        on_hello(s, f);
        break;
      case MessageType::health: {
        transport::HealthOk h;
        h.ready = !stopping_;
        h.sessions = static_cast<int>(sessions_.size());
        h.parameters = static_cast<int>(params_.size());
        s->send(MessageType::health_ok, transport::encode(h), f.request_id);
        break;
      }
      case MessageType::status:
        s->send(MessageType::status_ok, status_json(), f.request_id);
        break;
      case MessageType::register_param:
        on_register(s, f);
        break;
      case MessageType::push:
        on_push(s, f);
        break;
      case MessageType::commit:
        on_commit(s, f);
        break;
      case MessageType::update_ack:
        s->release_rx_slot(transport::decode<transport::SlotAck>(f.payload).slot);
        break;
      case MessageType::snapshot:
        on_snapshot(s, f);
        break;
      case MessageType::state_fetch:
        on_state_fetch(s, f);
        break;
      case MessageType::goodbye:
        s->close("goodbye");
        break;
      case MessageType::step_report:
        on_step_report(s, f);
        break;
      default:
        throw transport::ProtocolError("unexpected message " +
                                       transport::message_type_name(f.type) + " from a client");
    }
  } catch (const NonFiniteError& e) {
    reply_error(s, {ErrorCode::non_finite, e.message(), "", -1, -1}, f.request_id);
  } catch (const transport::ProtocolError& e) {
    log()->warn("session {} (rank {}): bad request: {}", s->id(), s->rank, e.message());
    reply_error(s, {ErrorCode::bad_request, e.message(), "", -1, -1}, f.request_id);
    // A TCP peer that has not said a valid hello gets one answer, then the door.
    if (s->tcp && s->rank < 0) s->close("bad request before hello");
  } catch (const InvalidArgument& e) {
    log()->warn("session {} (rank {}): bad request: {}", s->id(), s->rank, e.message());
    reply_error(s, {ErrorCode::bad_request, e.message(), "", -1, -1}, f.request_id);
  } catch (const Error& e) {
    log()->error("session {} (rank {}): {}", s->id(), s->rank, e.what());
    reply_error(s, {ErrorCode::server, e.message(), "", -1, -1}, f.request_id);
  }
}

void Engine::reply_error(const SessionPtr& s, const ErrorMsg& error, uint32_t request_id) {
  metrics_.error(error.code);
  s->send_error(error, request_id);
}

void Engine::on_step_report(const SessionPtr& s, const Frame& f) {
  auto m = transport::decode<transport::StepReport>(f.payload);
  metrics_.step_report(m, s->rank);
  reports_[s->id()] = std::move(m);
}

}  // namespace muon::daemon

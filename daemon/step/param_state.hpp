// One parameter as the server holds it: its step machine (phase, last step, the open step's
// reducer and deadline: daemon/step/step_machine.hpp), its registration, layout and role, its
// buffers, and what the observers read (numeric health).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "daemon/numeric_health.hpp"
#include "daemon/parameter.hpp"
#include "daemon/registration.hpp"
#include "daemon/replica_store.hpp"
#include "daemon/step/parameter_role.hpp"
#include "daemon/step/param_storage.hpp"
#include "daemon/step/step_machine.hpp"
#include "transport/asio.hpp"

namespace muon::daemon {

class Session;

struct ParamState {
  ParamState(std::string name, std::chrono::milliseconds step_timeout)
      : steps(std::move(name), step_timeout) {}

  StepMachine steps;
  std::optional<PendingRegistration> pending;                        // while registering
  std::vector<std::pair<std::weak_ptr<Session>, uint32_t>> waiting;  // register_ok owed
  /// While registering: why this server refused a rank's registration (a rank misrouted here,
  /// another shape), by rank, for the registration timeout's message; erased when it succeeds.
  std::map<int, std::string> refused;
  std::optional<ParameterLayout> layout;                             // once registered
  /// Owned here, or relayed to its owner for this server's domain (the plan's route); set with
  /// the first registration, fixed after.
  std::unique_ptr<ParameterRole> role;
  /// The job that registered it (transport::RegisterParam::job; "" none), whether it asked to
  /// resume, and its world size: set with the first registration, fixed after. Another job, or
  /// the same one at another size, registers it anew once this one left (Engine::hand_over).
  std::string job;
  bool resume = false;
  int world_size = 0;
  std::vector<float> momentum;  // host copy (param_storage.hpp)
  std::vector<float> grad, update;                     // recycled through each step's job
  std::unique_ptr<boost::asio::steady_timer> timer;    // at steps.deadline()
  std::chrono::steady_clock::time_point step_started;  // first chunk of the step gathered
  uint64_t updates_started = 0;         // steps handed to the worker (numeric-health sampling)
  std::optional<NumericHealth> health;  // last sample
  int64_t health_step = -1;             // its step
  bool unhealthy = false;  // the last sample exceeded the threshold (warned once)
  /// Taken over from a replica whose step its lost owner may have released to some ranks only:
  /// that step (outcome, update), answered from here to a rank that pushes it again, until a
  /// step two later opens (the one between needs every rank: all have the replayed one then).
  std::optional<Replica> replay;
  /// Registered, its first state on the way to its buddy: register_ok waits for the buddy.
  bool awaiting_buddy = false;
  /// Where the step's buffers live (host, or the GPU data plane); made at registration.
  std::unique_ptr<ParamStorage> storage;

  Phase phase() const { return steps.phase(); }
  bool registered() const { return phase() != Phase::registering; }
  int64_t last_step() const { return steps.last_step(); }
};

}  // namespace muon::daemon

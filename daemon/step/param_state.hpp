// One registered parameter as the server's step machine holds it: its phase, its registration,
// its layout and role, its step buffers, and what the observers read (numeric health).
//
// Phases and their transitions (daemon/step/engine_steps.cpp; io thread only):
//
//   registering --all registrants--> idle            (owned)
//   registering --all registrants--> awaiting_owner  (relayed) --owner's register_ok--> idle
//   idle      --first chunk of step s--> gathering
//   gathering --every contributor committed--> computing   (handed to the worker, or forwarded
//                                                           to the owner)
//   gathering --timeout | contributor lost | shutdown--> idle   (drop_step: momentum untouched)
//   computing --update or refusal back--> idle        (last_step = s; a relayed step dropped by
//                                                      its owner leaves last_step)
//   registering / awaiting_owner --refused--> (the parameter is forgotten)
//
// Issue 17 (failover) adds computing --owner lost--> computing (the step in flight re-pushed to
// a new owner) on the relayed role; nothing here assumes the owner is fixed for a step.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "daemon/device_plane.hpp"
#include "daemon/numeric_health.hpp"
#include "daemon/parameter.hpp"
#include "daemon/registration.hpp"
#include "daemon/step_reducer.hpp"
#include "transport/asio.hpp"

namespace muon::daemon {

class Session;

/// Where a parameter is in its life on this server (see the diagram above).
enum class Phase {
  registering,     ///< registrations being collected (`pending`)
  awaiting_owner,  ///< relayed: complete here, the owner's register_ok is owed
  idle,            ///< registered, no step open
  gathering,       ///< a step's contributions being reduced (`reducer`)
  computing,       ///< the reduced step is with the worker, or forwarded to the owner
};

/// "registering", "awaiting_owner", "idle", "gathering", "computing".
const char* phase_name(Phase phase);

struct ParamState {
  Phase phase = Phase::registering;
  std::optional<PendingRegistration> pending;  // while registering
  std::vector<std::pair<std::weak_ptr<Session>, uint32_t>> waiting;  // register_ok owed
  std::optional<ParameterLayout> layout;                             // once registered
  /// The owner's server id when this server relays the parameter for its domain (the plan's
  /// route): the step's partial sum goes to the owner and its update comes back (no momentum
  /// here); -1 when this server owns it. Set while registering, fixed after.
  int relay_owner = -1;
  std::vector<float> momentum;
  int64_t last_step = -1;
  /// One per parameter, reused every step; the open step's while gathering.
  std::optional<StepReducer> reducer;
  std::vector<float> grad, update;  // recycled through each step's job
  std::unique_ptr<boost::asio::steady_timer> timer;    // registration or step deadline
  std::chrono::steady_clock::time_point step_started;  // first chunk of the step gathered
  uint64_t updates_started = 0;         // steps handed to the worker (numeric-health sampling)
  std::optional<NumericHealth> health;  // last sample
  int64_t health_step = -1;             // its step
  bool unhealthy = false;  // the last sample exceeded the threshold (warned once)
  /// GPU data plane: momentum, gradient and update on the device (`momentum` above is then a
  /// host copy, refreshed for snapshots and state fetches); null on the host path.
  DeviceParamPtr device;

  bool registered() const { return phase != Phase::registering; }
  bool relayed() const { return relay_owner >= 0; }
  /// The step being gathered, or null.
  StepReducer* gathering() { return phase == Phase::gathering ? &*reducer : nullptr; }
  const StepReducer* gathering() const {
    return phase == Phase::gathering ? &*reducer : nullptr;
  }
};

}  // namespace muon::daemon

// One parameter's step state machine: its phase, its last applied step, the open step's reducer
// and the deadline of whatever it waits for (the registrations, or the open step's commits).
// No sockets, no timers, no clock of its own: every event that depends on time takes `now`, so
// a test drives it with a fake clock (tests/daemon/test_step_machine.cpp) and the Engine with
// steady_clock and one asio timer armed at deadline().
//
//   registering --registration_complete(owned)--> idle
//   registering --registration_complete(relayed)--> awaiting_owner --owner_registered--> idle
//   idle      --open(step)--> gathering                 (the step's first chunk)
//   gathering --start_computing()--> computing          (every contributor committed)
//   gathering --expire(now) | lose(rank) | drop()--> idle   (partial step dropped, momentum
//                                                         untouched, last_step unchanged)
//   computing --finish(step, consumed)--> idle          (applied, skipped or refused: last_step =
//                                                         step; a relayed step its owner dropped:
//                                                         unchanged, the ranks may push it again)
//   computing --finish(step, consumed, replicate)--> replicating   (an owned step whose buddy
//                                                         must hold it before its update goes out:
//                                                         last_step = step, momentum final)
//   replicating --replicated()--> idle                  (the buddy answered, or is unreachable;
//                                                         the update or error is released now)
//
// Step rules: the first step after registration (or restore) may be any number; later ones must
// follow the last applied step by exactly one; no step while one computes; one step gathered at a
// time; no step while the last one replicates. Failover (docs/design.md) happens above the machine:
// a relay keeps the forwarded partial sum of its step in flight (computing) until an owner
// answers, and pushes it again to the buddy that took over; a buddy that took over starts its
// machine from the replica's last step (record_step).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/contribution_store.hpp"
#include "daemon/parameter.hpp"
#include "core/error.hpp"
#include "daemon/step_reducer.hpp"

namespace muon::daemon {

/// A gradient chunk of a step that does not follow the parameter's last applied step: one
/// already applied, or one past the next (a gap). The client sees code step_mismatch
/// (core/error_code.hpp), so a trainer that retries a step can tell "already applied" from other
/// refusals without reading the message.
class StepMismatch final : public InvalidArgument {
 public:
  explicit StepMismatch(const std::string& message,
                        std::source_location where = std::source_location::current())
      : InvalidArgument(message, where) {}
};

/// Where a parameter is in its life on this server (see the diagram above).
enum class Phase {
  registering,     ///< registrations being collected
  awaiting_owner,  ///< relayed: complete here, the owner's register_ok is owed
  idle,            ///< registered, no step open
  gathering,       ///< a step's contributions being reduced
  computing,       ///< the reduced step is with the worker, or forwarded to the owner
  replicating,     ///< applied; its update waits until the buddy holds the new state
};

/// "registering", "awaiting_owner", "idle", "gathering", "computing", "replicating".
const char* phase_name(Phase phase);

/// A gathered step that was dropped: which, and the contributors that had not committed.
struct DroppedStep {
  int64_t step = 0;
  std::vector<int> missing;  ///< ascending
};

class StepMachine {
 public:
  using Clock = std::chrono::steady_clock;

  /// `name` names the parameter in errors; `timeout` bounds registration and each step.
  StepMachine(std::string name, std::chrono::milliseconds timeout);

  Phase phase() const { return phase_; }
  /// The last step applied (or refused and consumed); -1 before the first.
  int64_t last_step() const { return last_step_; }
  /// When what the parameter waits for times out: the registrations (from the first one on,
  /// once) or the open step's commits (from its first chunk). Nullopt otherwise.
  std::optional<Clock::time_point> deadline() const { return deadline_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // ---- registration ---------------------------------------------------------------------------
  /// A rank registered: starts the registration deadline on the first call (later registrants,
  /// and registrants after it expired, do not move it). Only while registering.
  void registration_started(Clock::time_point now);
  /// Every registrant registered: idle (owned), or awaiting_owner (relayed). Throws Error outside
  /// registering.
  void registration_complete(bool relayed);
  /// The owner answered a relayed registration with its last applied step: idle. Throws Error
  /// outside awaiting_owner.
  void owner_registered(int64_t owner_last_step);

  // ---- steps ------------------------------------------------------------------------------------
  /// Throws InvalidArgument naming the parameter when a gradient chunk of `step` may not be taken
  /// now: a step is computing, another step is being gathered, or the machine is registering or
  /// awaiting the owner; StepMismatch when `step` was already applied or skips steps.
  void check_step(int64_t step) const;
  /// The reducer of the open step; null when none is open (phase other than gathering).
  StepReducer* gathering() { return phase_ == Phase::gathering ? &*reducer_ : nullptr; }
  const StepReducer* gathering() const { return phase_ == Phase::gathering ? &*reducer_ : nullptr; }
  /// Opens `step` (idle -> gathering, deadline now + timeout) and returns its reducer; the same
  /// reducer when `step` is already open. `layout` must outlive the machine; `make_store` makes
  /// the contribution store the first time (its buffers are reused by later steps). Throws
  /// InvalidArgument as check_step.
  StepReducer& open(int64_t step, const ParameterLayout& layout, Clock::time_point now,
                    const std::function<std::unique_ptr<ContributionStore>()>& make_store);
  /// gathering -> computing once every contributor committed (the caller reduced the step
  /// first, so a failed reduction leaves it gathering). Throws Error when the step is not
  /// complete or none is open.
  void start_computing();
  /// computing -> idle: the step came back. `consumed`: applied, skipped or refused (last_step
  /// becomes `step`); otherwise dropped by the owner (last_step unchanged). Outside computing
  /// only last_step is set (an answer the io thread runs must never throw). `replicate`: a
  /// consumed step goes replicating instead of idle.
  void finish(int64_t step, bool consumed, bool replicate = false);
  /// replicating -> idle (the buddy holds the step, or cannot be reached); nothing otherwise.
  void replicated();
  /// The owner's word about a step outside this machine's hand-offs (an unasked update of a
  /// domain that pushes nothing, a step the owner consumed, its last step after a restart): sets
  /// last_step, the phase stays.
  void record_step(int64_t step) { last_step_ = step; }
  /// A momentum load set the last applied step. Throws InvalidArgument unless idle.
  void load(int64_t step);

  // ---- failures -------------------------------------------------------------------------------
  /// The open step timed out: when gathering, `now` is at or past the deadline and a contributor
  /// has not committed, drops it (-> idle) and returns it. Nullopt otherwise.
  std::optional<DroppedStep> expire_step(Clock::time_point now);
  /// The registrations timed out: when registering and `now` is at or past the deadline, returns
  /// true once (the deadline is then cleared; registration stays open). False otherwise.
  bool expire_registration(Clock::time_point now);
  /// Contributor `rank` was lost: when it has not committed the open step, drops it (-> idle)
  /// and returns it. Nullopt otherwise (no open step, the rank committed or does not push).
  std::optional<DroppedStep> lose(int rank);
  /// Drops the open step whatever its state (shutdown): -> idle. Nullopt when none is open.
  std::optional<DroppedStep> drop();

 private:
  /// Throws Error naming the transition when the phase is not `expected`.
  void require(Phase expected, const char* transition) const;
  DroppedStep drop_open();

  std::string name_;
  std::chrono::milliseconds timeout_;
  Phase phase_ = Phase::registering;
  int64_t last_step_ = -1;
  std::optional<Clock::time_point> deadline_;
  bool registration_deadline_set_ = false;
  std::optional<StepReducer> reducer_;  // one per parameter, reused every step
};

}  // namespace muon::daemon

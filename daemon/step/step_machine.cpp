#include "daemon/step/step_machine.hpp"

#include <string>
#include <utility>

#include "core/error.hpp"

namespace muon::daemon {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::registering:
      return "registering";
    case Phase::awaiting_owner:
      return "awaiting_owner";
    case Phase::idle:
      return "idle";
    case Phase::gathering:
      return "gathering";
    case Phase::computing:
      return "computing";
    case Phase::replicating:
      return "replicating";
  }
  return "unknown";
}

StepMachine::StepMachine(std::string name, std::chrono::milliseconds timeout)
    : name_(std::move(name)), timeout_(timeout) {}

void StepMachine::require(Phase expected, const char* transition) const {
  if (phase_ != expected) {
    throw Error("parameter '" + name_ + "': " + transition + " while " + phase_name(phase_) +
                " (expected " + phase_name(expected) + ")");
  }
}

void StepMachine::registration_started(Clock::time_point now) {
  require(Phase::registering, "registration_started");
  if (registration_deadline_set_) return;
  registration_deadline_set_ = true;
  deadline_ = now + timeout_;
}

void StepMachine::registration_complete(bool relayed) {
  require(Phase::registering, "registration_complete");
  deadline_.reset();
  phase_ = relayed ? Phase::awaiting_owner : Phase::idle;
}

void StepMachine::owner_registered(int64_t owner_last_step) {
  require(Phase::awaiting_owner, "owner_registered");
  last_step_ = owner_last_step;
  phase_ = Phase::idle;
}

void StepMachine::check_step(int64_t step) const {
  const std::string who = "parameter '" + name_ + "': ";
  if (phase_ == Phase::registering || phase_ == Phase::awaiting_owner) {
    throw InvalidArgument(who + "step " + std::to_string(step) +
                          " pushed before its registration completed");
  }
  if (phase_ == Phase::computing) {
    throw InvalidArgument(who + "step " + std::to_string(step) + " pushed while step " +
                          std::to_string(reducer_->step()) + " is still being computed");
  }
  if (phase_ == Phase::replicating) {
    throw InvalidArgument(who + "step " + std::to_string(step) + " pushed while step " +
                          std::to_string(last_step_) + " is still being replicated to its buddy");
  }
  if (last_step_ >= 0 && step <= last_step_) {
    throw StepMismatch(who + "step " + std::to_string(step) +
                       " was already applied (last applied step " + std::to_string(last_step_) +
                       ")");
  }
  if (last_step_ >= 0 && step > last_step_ + 1) {
    throw StepMismatch(who + "step gap: got step " + std::to_string(step) + ", expected " +
                       std::to_string(last_step_ + 1));
  }
  if (const auto* open = gathering(); open && open->step() != step) {
    throw InvalidArgument(who + "step " + std::to_string(step) + " pushed while step " +
                          std::to_string(open->step()) + " is being gathered");
  }
}

StepReducer& StepMachine::open(
    int64_t step, const ParameterLayout& layout, Clock::time_point now,
    const std::function<std::unique_ptr<ContributionStore>()>& make_store) {
  check_step(step);
  if (auto* open = gathering()) return *open;
  if (reducer_) {
    reducer_->restart(step);
  } else {
    reducer_.emplace(layout, step, make_store());
  }
  phase_ = Phase::gathering;
  deadline_ = now + timeout_;
  return *reducer_;
}

void StepMachine::start_computing() {
  require(Phase::gathering, "start_computing");
  if (!reducer_->complete()) {
    throw Error("parameter '" + name_ + "' step " + std::to_string(reducer_->step()) +
                ": handed off before every contributor committed");
  }
  deadline_.reset();
  phase_ = Phase::computing;
}

void StepMachine::finish(int64_t step, bool consumed, bool replicate) {
  if (consumed) last_step_ = step;
  if (phase_ == Phase::computing) phase_ = consumed && replicate ? Phase::replicating : Phase::idle;
}

void StepMachine::replicated() {
  if (phase_ == Phase::replicating) phase_ = Phase::idle;
}

void StepMachine::load(int64_t step) {
  if (phase_ != Phase::idle) {
    throw InvalidArgument("cannot load the momentum of '" + name_ + "' while step is in progress");
  }
  last_step_ = step;
}

DroppedStep StepMachine::drop_open() {
  DroppedStep d{reducer_->step(), reducer_->missing_ranks()};
  deadline_.reset();
  phase_ = Phase::idle;
  return d;
}

std::optional<DroppedStep> StepMachine::expire_step(Clock::time_point now) {
  if (phase_ != Phase::gathering || !deadline_ || now < *deadline_) return std::nullopt;
  if (reducer_->complete()) return std::nullopt;  // its hand-off is on the way
  return drop_open();
}

bool StepMachine::expire_registration(Clock::time_point now) {
  if (phase_ != Phase::registering || !deadline_ || now < *deadline_) return false;
  deadline_.reset();
  return true;
}

std::optional<DroppedStep> StepMachine::lose(int rank) {
  if (phase_ != Phase::gathering) return std::nullopt;
  const auto missing = reducer_->missing_ranks();
  for (int r : missing) {
    if (r == rank) return drop_open();
  }
  return std::nullopt;
}

std::optional<DroppedStep> StepMachine::drop() {
  if (phase_ != Phase::gathering) return std::nullopt;
  return drop_open();
}

}  // namespace muon::daemon

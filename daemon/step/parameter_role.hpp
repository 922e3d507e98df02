// What differs between a parameter this server owns and one it relays for its domain
// (daemon/pool_routes.hpp), behind one interface, so that no handler asks which it is:
//   owned    the momentum lives here; a complete step goes to the worker (daemon/scheduler.hpp)
//            and its update comes back from it (step/owned_role.cpp);
//   relayed  the owner server keeps the momentum; a complete step's partial sum is forwarded to
//            it through the Relay and its update comes back from it (step/relayed_role.cpp).
// A parameter's role is chosen when its first registration arrives (the plan's route) and fixed
// after. Roles run on the io thread, as part of the Engine (they use its sessions, relay and
// metrics); they keep no state of their own beyond the owner's id, so that a ParamState erased
// while a callback of its role is pending leaves nothing dangling (callbacks look it up by name).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "transport/messages.hpp"

namespace muon::daemon {

class Engine;
class Session;
class StepReducer;
struct ParamState;

class ParameterRole {
 public:
  virtual ~ParameterRole() = default;

  /// Every registrant registered and p.layout is set; p.waiting holds the register_ok owed.
  /// Owned: the momentum is set up (restored from the snapshot when it holds the parameter with
  /// this shape) and the ranks are answered. Relayed: the parameter is registered with its owner
  /// and the ranks are answered when it replies (an owner's refusal goes to them and the
  /// parameter is forgotten). Throws DeviceError.
  virtual void registered(const std::string& name, ParamState& p) = 0;
  /// The open step is complete (every contributor committed): reduces it into its gradient and
  /// hands it off (to the worker, or to the owner); the machine goes computing. Throws as
  /// StepReducer::reduce, DeviceError, Error (a stopped scheduler).
  virtual void hand_off(const std::string& name, ParamState& p, StepReducer& reducer) = 0;
  /// A momentum load chunk of m.step (fp32 `values` at m.offset; the machine already took the
  /// step): written here, or forwarded to the owner in order with the steps.
  virtual void load_momentum(const transport::Push& m, ParamState& p,
                             std::span<const float> values) = 0;
  /// A state fetch of `name` (phase not computing): the momentum (numel fp32) and its last step
  /// to `s` as momentum chunks, or the error answering `request_id`.
  virtual void fetch_momentum(const std::shared_ptr<Session>& s, const std::string& name,
                              ParamState& p, uint32_t request_id) = 0;
  /// The momentum is this server's: snapshots hold it, and they and shutdown wait for its step
  /// in flight; the layout must cover every element (a relay's covers its domain's share).
  virtual bool keeps_momentum_here() const = 0;
  /// The owner's server id in the plan; -1 for this server.
  virtual int owner() const = 0;
};

/// The role of a parameter this server owns.
std::unique_ptr<ParameterRole> make_owned_role(Engine& engine);
/// The role of a parameter this server relays to server `owner` of the plan.
std::unique_ptr<ParameterRole> make_relayed_role(Engine& engine, int owner);

}  // namespace muon::daemon

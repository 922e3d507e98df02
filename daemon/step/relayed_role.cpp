// ParameterRole of a parameter this server relays for its domain (parameter_role.hpp): the
// owner server keeps the momentum; a step's partial sum over the domain's ranks goes to it
// through the Relay (daemon/pool/relay.hpp), and the owner's update or error comes back to
// Engine::finish_relayed. The device storage, if any, holds no momentum.
#include "core/error.hpp"
#include "daemon/engine.hpp"
#include "daemon/log.hpp"
#include "daemon/step/parameter_role.hpp"

namespace muon::daemon {

using transport::ErrorMsg;

class RelayedRole final : public ParameterRole {
 public:
  RelayedRole(Engine& engine, int owner) : e_(engine), owner_(owner) {}

  void registered(const std::string& name, ParamState& p) override {
    const auto& shape = p.layout->spec.shape;
    p.storage = e_.make_storage(shape.numel(), /*momentum=*/false);
    transport::RegisterParam reg;
    reg.name = name;
    reg.shape = dims_of(shape);
    reg.grad_dtype = p.layout->spec.grad_dtype;
    reg.update_dtype = p.layout->spec.update_dtype;
    reg.options = p.layout->spec.options;
    // The domain's partial sum covers what its ranks push; it wants what they want.
    reg.push = covered(*p.layout, &RankRanges::push);
    reg.want = covered(*p.layout, &RankRanges::want);
    reg.job = p.job;  // the owner hands its state over as the domain's ranks asked
    reg.resume = p.resume;
    log()->info(
        "parameter '{}' {} registered by ranks {} of this domain; registering it with its "
        "owner, server {}",
        name, shape.str(), ranks_text(p.layout->registrants, e_.world_size_), owner_);
    p.steps.registration_complete(/*relayed=*/true);
    Engine& e = e_;  // the callbacks outlive nothing but the Engine (the Relay is its member)
    e.relay().register_param(
        owner_, std::move(reg),
        [&e, name](std::optional<ErrorMsg> error, transport::RegisterOk ok) {
          auto it = e.params_.find(name);
          if (it == e.params_.end() || it->second.phase() != Phase::awaiting_owner) return;
          ParamState& q = it->second;
          if (error) {
            log()->warn("parameter '{}': the owner refused the relay's registration: {}", name,
                        error->message);
            e.metrics_.error(error->code);
            for (auto& [w, req] : q.waiting) {
              if (auto ws = w.lock()) ws->send_error(*error, req);
            }
            e.params_.erase(it);
            return;
          }
          q.steps.owner_registered(ok.last_step);
          e.answer_registration(q);
        },
        // What the owner says outside the answers to forwarded steps (unasked updates for a
        // domain that pushes nothing, errors of steps not forwarded, a restart).
        [&e](RelayStep st) { e.finish_relayed(std::move(st)); });
  }

  void hand_off(const std::string& name, ParamState& p, StepReducer& reducer) override {
    // The step goes to the owner once its gradient is in host memory and the machine says
    // computing, whichever comes last: on the host path the gradient is there before
    // reduce_to_host returns, on the GPU data plane it comes back later (the io thread does not
    // wait for it). A reduction that throws leaves the step gathering.
    struct Forward {
      RelayStep step;
      bool reduced = false, computing = false;
      std::exception_ptr error;
    };
    auto f = std::make_shared<Forward>();
    RelayStep& step = f->step;
    step.name = name;
    step.step = reducer.step();
    step.owner = owner_;
    step.grad_dtype = p.layout->spec.grad_dtype;
    step.update_dtype = p.layout->spec.update_dtype;
    step.numel = p.layout->spec.shape.numel();
    step.grad = std::move(p.grad);
    step.grad.resize(static_cast<size_t>(step.numel));
    step.push = covered(*p.layout, &RankRanges::push);
    step.want = covered(*p.layout, &RankRanges::want);
    Engine& e = e_;
    const auto go = [&e](Forward& g) {
      if (!g.error) {
        e.relay().forward(std::move(g.step),
                          [&e](RelayStep done) { e.finish_relayed(std::move(done)); });
        return;
      }
      g.step.error = ErrorMsg{ErrorCode::backend,
                              "parameter '" + g.step.name + "' step " +
                                  std::to_string(g.step.step) +
                                  ": reading the reduced gradient back from the GPU failed: " +
                                  message_of(g.error),
                              g.step.name, g.step.step, -1};
      e.finish_relayed(std::move(g.step));
    };
    p.storage->reduce_to_host(reducer, step.grad, [f, go](std::exception_ptr error) {
      f->reduced = true;
      f->error = error;
      if (f->computing) go(*f);
    });
    p.steps.start_computing();
    f->computing = true;
    if (f->reduced) go(*f);
  }

  void load_momentum(const transport::Push& m, ParamState&,
                     std::span<const float> values) override {
    Engine& e = e_;
    e.relay().forward_momentum(owner_, m.name, m.step, m.offset, {values.begin(), values.end()},
                               [&e, name = m.name](ErrorMsg error) {
                                 auto it = e.params_.find(name);
                                 if (it != e.params_.end()) e.broadcast(it->second, error);
                                 e.metrics_.error(error.code);
                               });
  }

  void fetch_momentum(const std::shared_ptr<Session>& s, const std::string& name, ParamState& p,
                      uint32_t request_id) override {
    Engine& e = e_;
    e.relay().fetch_momentum(
        owner_, name, p.layout->spec.shape.numel(),
        [&e, w = std::weak_ptr<Session>(s), name, request_id](
            std::vector<float> values, int64_t last, std::optional<ErrorMsg> error) {
          auto ws = w.lock();
          if (!ws || ws->closed()) return;
          if (error) {
            error->param = name;
            e.reply_error(ws, *error, request_id);
            return;
          }
          e.send_momentum(ws, name, last, values.data(), static_cast<int64_t>(values.size()));
        });
  }

  bool keeps_momentum_here() const override { return false; }
  int owner() const override { return owner_; }

 private:
  Engine& e_;
  int owner_;
};

std::unique_ptr<ParameterRole> make_relayed_role(Engine& engine, int owner) {
  return std::make_unique<RelayedRole>(engine, owner);
}

}  // namespace muon::daemon

// ParameterRole of a parameter this server owns (parameter_role.hpp): its momentum lives here
// (ParamStorage, and the host copy in ParamState::momentum) and its steps run on the worker.
#include <algorithm>
#include <cstring>

#include "daemon/engine.hpp"
#include "daemon/log.hpp"
#include "daemon/step/parameter_role.hpp"

namespace muon::daemon {

class OwnedRole final : public ParameterRole {
 public:
  explicit OwnedRole(Engine& engine) : e_(engine) {}

  void registered(const std::string& name, ParamState& p) override {
    const auto& shape = p.layout->spec.shape;
    p.momentum.assign(static_cast<size_t>(shape.numel()), 0.0f);
    if (auto replica = e_.replicas_.take(name)) {
      // Its owner replicated it here (this server is its buddy, or the owner restarted while
      // its buddy owned it): the replica is newer than any snapshot.
      const auto rs = matrix_shape_from_dims(replica->shape, name);
      if (rs.batch == shape.batch && rs.rows == shape.rows && rs.cols == shape.cols) {
        p.momentum = std::move(replica->momentum);
        p.steps.record_step(replica->step);
        log()->warn("parameter '{}': taken over from the replica of server {} at step {} ({}); "
                    "registered by ranks {}",
                    name, replica->source, replica->step, replica->outcome,
                    ranks_text(p.layout->registrants, e_.world_size_));
        if (replica->outcome != "registered") p.replay = std::move(*replica);
      } else {
        log()->warn("replica of '{}' is {} but it was registered as {}: not taken over", name,
                    rs.str(), shape.str());
      }
      e_.restored_.erase(name);
    } else if (auto r = e_.restored_.find(name); r != e_.restored_.end()) {
      const auto rs = matrix_shape_from_dims(r->second.shape, name);
      if (rs.batch == shape.batch && rs.rows == shape.rows && rs.cols == shape.cols) {
        p.momentum = r->second.momentum;
        p.steps.record_step(r->second.last_step);
      } else {
        log()->warn("snapshot holds '{}' as {} but it was registered as {}: starting from zero",
                    name, rs.str(), shape.str());
      }
      // Taken once: a later job that registers the name anew fresh must not find it again.
      e_.restored_.erase(r);
    }
    const bool keeps = p.layout->spec.options.momentum.convention != MomentumConvention::none;
    p.storage = e_.make_storage(shape.numel(), keeps);
    if (keeps && p.last_step() >= 0) p.storage->write_momentum(0, p.momentum);
    log()->info("parameter '{}' {} registered by ranks {}, {} contributor(s) per element", name,
                shape.str(), ranks_text(p.layout->registrants, e_.world_size_),
                p.layout->contributors);
    p.steps.registration_complete(/*relayed=*/false);
    // The buddy holds the state before any rank learns of it (the last step in register_ok).
    if (const int target = e_.replica_target(name); target >= 0) {
      Engine& e = e_;
      p.awaiting_buddy = true;
      e.replicate_then(name, p, target, p.last_step(), "registered", nullptr,
                       [&e](ParamState& q) {
                         q.awaiting_buddy = false;
                         e.answer_registration(q);
                       });
      return;
    }
    e_.answer_registration(p);
  }

  void hand_off(const std::string& name, ParamState& p, StepReducer& reducer) override {
    NsJob job;
    job.name = name;
    job.step = reducer.step();
    job.shape = p.layout->spec.shape;
    job.options = p.layout->spec.options;
    job.grad = std::move(p.grad);  // warm buffers, handed back in finish_jobs
    job.update = std::move(p.update);
    p.storage->reduce(reducer, job);
    job.momentum =
        job.options.momentum.convention == MomentumConvention::none ? nullptr : p.momentum.data();
    const auto every =
        static_cast<uint64_t>(std::max<int64_t>(e_.config_.health_sample_every, 0));
    job.sample_health = every > 0 && p.updates_started % every == 0;
    p.steps.start_computing();
    ++p.updates_started;
    e_.scheduler_.submit(std::move(job));
  }

  void load_momentum(const transport::Push& m, ParamState& p,
                     std::span<const float> values) override {
    p.storage->write_momentum(m.offset, values);
    std::memcpy(p.momentum.data() + m.offset, values.data(), values.size_bytes());
  }

  void fetch_momentum(const std::shared_ptr<Session>& s, const std::string& name, ParamState& p,
                      uint32_t request_id) override {
    Engine& e = e_;
    e.with_host_momentum(name, p, [&e, w = std::weak_ptr<Session>(s), name, request_id](
                                      ParamState& q, bool fresh) {
      auto ws = w.lock();
      if (!ws || ws->closed()) return;
      if (!fresh) {
        e.reply_error(ws,
                      {ErrorCode::backend,
                       "parameter '" + name + "': its momentum could not be read from the GPU",
                       name, -1, ws->rank},
                      request_id);
        return;
      }
      e.send_momentum(ws, name, q.last_step(), q.momentum.data(),
                      static_cast<int64_t>(q.momentum.size()));
    });
  }

  bool keeps_momentum_here() const override { return true; }
  int owner() const override { return -1; }

 private:
  Engine& e_;
};

std::unique_ptr<ParameterRole> make_owned_role(Engine& engine) {
  return std::make_unique<OwnedRole>(engine);
}

}  // namespace muon::daemon

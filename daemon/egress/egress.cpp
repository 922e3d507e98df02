// Egress: a step's update cut into each wanting rank's chunks (device-to-device into a result
// slot where the session's data plane takes device updates, else host bytes), momentum chunks
// of a state fetch, errors to a parameter's ranks.
#include "daemon/engine.hpp"

#include <algorithm>
#include <cstring>

#include "daemon/log.hpp"
#include "kernels/bf16.hpp"

namespace muon::daemon {

using transport::ErrorMsg;

void Engine::broadcast(const Param& p, const ErrorMsg& error, int except_rank) {
  if (!p.layout) return;
  for (int r : p.layout->registrants) {
    if (r == except_rank) continue;
    if (auto s = session_of(r)) s->send_error(error);
  }
}

void Engine::return_update(Param& p, NsJob& job, bool upload, int only_rank) {
  try {
    if (upload) p.storage->upload_update(job.update);
    send_update(job.name, p, job, only_rank);
  } catch (const std::exception& e) {  // a CUDA copy failed: tell the ranks, keep serving
    log()->error("parameter '{}' step {}: returning the update failed: {}", job.name, job.step,
                 e.what());
    metrics_.error(ErrorCode::backend);
    broadcast(p, {ErrorCode::backend,
                  "returning the update of '" + job.name + "' step " + std::to_string(job.step) +
                      " failed: " + e.what(),
                  job.name, job.step, -1});
  }
}

void Engine::send_update(const std::string& name, Param& p, NsJob& job, int only_rank) {
  const DType dt = p.layout->spec.update_dtype;
  const size_t esize = transport::dtype_bytes(dt);
  const int64_t per_chunk = static_cast<int64_t>(config_.layout.slot_bytes / esize);
  // GPU data plane: sessions whose plane takes device updates (cuda_ipc, nccl) get
  // device-to-device copies into their result slots; a chunk that must wait for a credit, and
  // every chunk of a shm session, goes through host bytes
  // (on the GPU data plane read back once per step, when the first such chunk needs them).
  DeviceParamState* device = p.storage->device_state();
  const float* host = nullptr;
  const auto host_update = [&] {
    if (host == nullptr) host = p.storage->host_update(job);
    return host;
  };
  for (int r = 0; r < static_cast<int>(p.layout->ranks.size()); ++r) {
    const auto& ranks = p.layout->ranks[r];
    const auto& want = ranks.want;
    if (want.empty() || (only_rank >= 0 && r != only_rank)) continue;
    auto s = session_of(r);
    if (!s) continue;
    if (ranks.packed) {
      send_packed_update(name, p, job, *s, want, host_update);
      continue;
    }
    for (size_t w = 0; w < want.size(); ++w) {
      for (int64_t off = want[w].begin; off < want[w].end; off += per_chunk) {
        const int64_t count = std::min(per_chunk, want[w].end - off);
        transport::Update u;
        u.name = name;
        u.step = job.step;
        u.offset = off;
        u.count = count;
        u.kind = transport::ChunkKind::gradient;
        u.last = w + 1 == want.size() && off + count == want[w].end;
        u.applied = job.applied;
        const size_t bytes = static_cast<size_t>(count) * esize;
        metrics_.chunk_returned(transport::ChunkKind::gradient, bytes);
        ServerPlane* plane = s->plane();
        if (device != nullptr && plane && plane->writes_device_updates() &&
            s->send_chunk_direct(u, [&](uint32_t slot) {
              return plane->write_update(slot, *device, off, count, dt);
            })) {
          continue;
        }
        std::vector<std::byte> data(bytes);
        const float* src = host_update() + off;
        narrow_from_f32(dt, {src, static_cast<size_t>(count)}, data.data());
        s->send_chunk(std::move(u), dt, std::move(data));
      }
    }
  }
  p.storage->updates_enqueued();
}

void Engine::send_packed_update(const std::string& name, Param& p, NsJob& job, Session& s,
                                const std::vector<Range>& want,
                                const std::function<const float*()>& host_update) {
  const DType dt = p.layout->spec.update_dtype;
  const size_t esize = transport::dtype_bytes(dt);
  const int64_t per_chunk = static_cast<int64_t>(config_.layout.slot_bytes / esize);
  DeviceParamState* device = p.storage->device_state();
  const auto prefix = packed_starts(want);
  const int64_t total = prefix.back() + want.back().size();
  // Chunks of the packed want ranges (a column block's rows laid end to end), each as many
  // elements as a slot holds: the block goes back as one update when it fits a slot.
  for (int64_t at = 0; at < total; at += per_chunk) {
    const int64_t count = std::min(per_chunk, total - at);
    transport::Update u;
    u.name = name;
    u.step = job.step;
    u.offset = at;
    u.count = count;
    u.kind = transport::ChunkKind::gradient;
    u.last = at + count == total;
    u.applied = job.applied;
    const size_t bytes = static_cast<size_t>(count) * esize;
    metrics_.chunk_returned(transport::ChunkKind::gradient, bytes);
    // A chunk inside one range may go device to device; one that spans ranges goes through host
    // bytes (the device plane copies one contiguous run per slot).
    int pieces = 0;
    int64_t element = 0;
    for_each_packed_piece(want, prefix, at, count, [&](size_t, int64_t e, int64_t, int64_t) {
      if (pieces++ == 0) element = e;
    });
    ServerPlane* plane = s.plane();
    if (pieces == 1 && device != nullptr && plane && plane->writes_device_updates() &&
        s.send_chunk_direct(u, [&](uint32_t slot) {
          return plane->write_update(slot, *device, element, count, dt);
        })) {
      continue;
    }
    std::vector<std::byte> data(bytes);
    const float* src = host_update();
    for_each_packed_piece(want, prefix, at, count,
                          [&](size_t, int64_t e, int64_t pos, int64_t n) {
                            narrow_from_f32(dt, {src + e, static_cast<size_t>(n)},
                                            data.data() + static_cast<size_t>(pos - at) * esize);
                          });
    s.send_chunk(std::move(u), dt, std::move(data));
  }
}

void Engine::send_momentum(const SessionPtr& s, const std::string& name, int64_t last_step,
                           const float* momentum, int64_t n) {
  const int64_t per_chunk = static_cast<int64_t>(config_.layout.slot_bytes / 4);
  for (int64_t off = 0; off < n; off += per_chunk) {
    const int64_t count = std::min(per_chunk, n - off);
    std::vector<std::byte> data(static_cast<size_t>(count) * 4);
    std::memcpy(data.data(), momentum + off, data.size());
    transport::Update u;
    u.name = name;
    u.step = last_step;
    u.offset = off;
    u.count = count;
    u.kind = transport::ChunkKind::momentum;
    u.last = off + count == n;
    metrics_.chunk_returned(transport::ChunkKind::momentum, data.size());
    s->send_chunk(std::move(u), DType::f32, std::move(data));
  }
}

}  // namespace muon::daemon

// Egress: a step's update cut into each wanting rank's chunks (device-to-device into a result
// slot where the session's data plane takes device updates, else host bytes), momentum chunks
// of a state fetch, errors to a parameter's ranks.
#include "daemon/engine.hpp"

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "core/error.hpp"
#include "daemon/log.hpp"
#include "kernels/bf16.hpp"
#include "kernels/range_set.hpp"

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
    return_failed(p, job.name, job.step, e.what());
  }
}

void Engine::return_failed(const Param& p, const std::string& name, int64_t step,
                           const std::string& what) {
  log()->error("parameter '{}' step {}: returning the update failed: {}", name, step, what);
  metrics_.error(ErrorCode::backend);
  broadcast(p, {ErrorCode::backend,
                "returning the update of '" + name + "' step " + std::to_string(step) +
                    " failed: " + what,
                name, step, -1});
}

namespace {

/// One chunk of a rank's update as it leaves: its frame, and where its elements are: one run
/// from `element` (u.count elements; it may go device to device), or -1 when the chunk spans
/// several ranges of a packed registration (host bytes only: a device copy moves one run).
struct UpdateChunk {
  transport::Update u;
  int64_t element = -1;
};

/// A rank's share of the update cut into chunks of at most `per_chunk` elements (a slot's), in
/// the order they go out: each want range from its start; a packed registration's ranges laid
/// end to end (a column block's rows), its offsets in that packed order, so a block that fits
/// a slot goes back as one update.
std::vector<UpdateChunk> cut_update(const std::string& name, const NsJob& job,
                                    const RankRanges& ranks, int64_t per_chunk) {
  std::vector<UpdateChunk> chunks;
  const auto chunk = [&](int64_t offset, int64_t count, bool last, int64_t element) {
    transport::Update u;
    u.name = name;
    u.step = job.step;
    u.offset = offset;
    u.count = count;
    u.kind = transport::ChunkKind::gradient;
    u.last = last;
    u.applied = job.applied;
    chunks.push_back({std::move(u), element});
  };
  const auto& want = ranks.want;
  if (!ranks.packed) {
    for (size_t w = 0; w < want.size(); ++w) {
      for (int64_t off = want[w].begin; off < want[w].end; off += per_chunk) {
        const int64_t count = std::min(per_chunk, want[w].end - off);
        chunk(off, count, w + 1 == want.size() && off + count == want[w].end, off);
      }
    }
    return chunks;
  }
  const auto prefix = packed_starts(want);
  const int64_t total = prefix.back() + want.back().size();
  for (int64_t at = 0; at < total; at += per_chunk) {
    const int64_t count = std::min(per_chunk, total - at);
    int pieces = 0;
    int64_t element = 0;
    for_each_packed_piece(want, prefix, at, count, [&](size_t, int64_t e, int64_t, int64_t) {
      if (pieces++ == 0) element = e;
    });
    chunk(at, count, at + count == total, pieces == 1 ? element : -1);
  }
  return chunks;
}

/// Writes the chunk's elements of `update` (numel host fp32) as `dt` at `out` (u.count elements
/// of `dt`); `prefix` is packed_starts(ranks.want) for a packed registration.
void write_chunk(const UpdateChunk& c, const RankRanges& ranks, std::span<const int64_t> prefix,
                 const float* update, DType dt, std::byte* out) {
  if (!ranks.packed) {
    narrow_from_f32(dt, {update + c.u.offset, static_cast<size_t>(c.u.count)}, out);
    return;
  }
  const size_t esize = transport::dtype_bytes(dt);
  for_each_packed_piece(ranks.want, prefix, c.u.offset, c.u.count,
                        [&](size_t, int64_t e, int64_t pos, int64_t n) {
                          narrow_from_f32(dt, {update + e, static_cast<size_t>(n)},
                                          out + static_cast<size_t>(pos - c.u.offset) * esize);
                        });
}

}  // namespace

void Engine::send_update(const std::string& name, Param& p, NsJob& job, int only_rank) {
  const DType dt = p.layout->spec.update_dtype;
  const size_t esize = transport::dtype_bytes(dt);
  const int64_t per_chunk = static_cast<int64_t>(config_.layout.slot_bytes / esize);
  // GPU data plane: sessions whose plane takes device updates (cuda_ipc, nccl) get
  // device-to-device copies into their result slots. From a rank's first chunk that cannot
  // (no free slot, a chunk across packed ranges, a shm or tcp session) its chunks go through
  // host bytes, in order: the update read back once per step, without the io thread waiting.
  struct HostChunks {
    std::weak_ptr<Session> session;
    RankRanges ranks;
    std::vector<int64_t> prefix;  // packed_starts(ranks.want) when packed
    std::vector<UpdateChunk> chunks;
  };
  auto host_chunks = std::make_shared<std::vector<HostChunks>>();
  DeviceParamState* device = p.storage->device_state();
  for (int r = 0; r < static_cast<int>(p.layout->ranks.size()); ++r) {
    const auto& ranks = p.layout->ranks[r];
    if (ranks.want.empty() || (only_rank >= 0 && r != only_rank)) continue;
    auto s = session_of(r);
    if (!s) continue;
    auto chunks = cut_update(name, job, ranks, per_chunk);
    size_t sent = 0;
    ServerPlane* plane = s->plane();
    if (device != nullptr && plane && plane->writes_device_updates()) {
      for (; sent < chunks.size(); ++sent) {
        const UpdateChunk& c = chunks[sent];
        if (c.element < 0 || !s->send_chunk_direct(c.u, [&](uint32_t slot) {
              return plane->write_update(slot, *device, c.element, c.u.count, dt);
            })) {
          break;
        }
        metrics_.chunk_returned(transport::ChunkKind::gradient,
                                static_cast<size_t>(c.u.count) * esize);
      }
    }
    if (sent == chunks.size()) continue;
    chunks.erase(chunks.begin(), chunks.begin() + static_cast<std::ptrdiff_t>(sent));
    host_chunks->push_back(
        {s, ranks, ranks.packed ? packed_starts(ranks.want) : std::vector<int64_t>{},
         std::move(chunks)});
  }
  if (!host_chunks->empty()) {
    Param* param = &p;  // lives while its storage does, which runs the continuation only then
    p.storage->read_update(job, [this, param, name, step = job.step, dt, esize, host_chunks](
                                    const float* update, std::exception_ptr error) {
      if (error) {
        return_failed(*param, name, step, message_of(error));
        return;
      }
      for (auto& h : *host_chunks) {
        auto s = h.session.lock();
        if (!s || s->closed()) continue;
        for (auto& c : h.chunks) {
          metrics_.chunk_returned(transport::ChunkKind::gradient,
                                  static_cast<size_t>(c.u.count) * esize);
          // Straight into a free result slot where it is host memory (shm): one pass over the
          // bytes instead of three (a zeroed staging buffer, the narrowing, the copy into the
          // slot), none of them on fresh pages.
          ServerPlane* plane = s->plane();
          if (plane && plane->has_host_result_slots() &&
              s->send_chunk_direct(c.u, [&](uint32_t slot) {
                write_chunk(c, h.ranks, h.prefix, update, dt, plane->host_result_slot(slot));
                return AfterFrame{};
              })) {
            continue;
          }
          // No free slot (or chunks already wait): staged, in order, until the client returns
          // one.
          std::vector<std::byte> data(static_cast<size_t>(c.u.count) * esize);
          write_chunk(c, h.ranks, h.prefix, update, dt, data.data());
          s->send_chunk(std::move(c.u), dt, std::move(data));
        }
      }
    });
  }
  p.storage->updates_enqueued();
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

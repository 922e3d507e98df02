// muon_test_client: a real compute-rank process for the integration tests. It registers the
// scenario's parameters, pushes its shard of deterministic gradients in chunks of random sizes
// and random order, commits, waits for every update and writes what it received to --out.
// Failure injection: --die-at-step (exit abruptly mid-push), --skip-param (never push one
// parameter), --nan-at-step (NaN in one gradient). GPU data plane: --data-plane cuda_ipc and
// --device-buffers (gradients pushed from, updates received into, CUDA device memory).
// Exit codes: 0 ok, 3 the server reported an error (written to <out>.err), 2 bad arguments.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>

#include "scenario.hpp"

#if defined(MUON_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

using namespace muon;
using namespace muon::testing;

namespace {

struct Args {
  std::vector<std::string> sockets;
  int rank = 0, world = 1, steps = 1;
  int64_t start_step = 0;
  std::string mode = "replicated", out, skip_param, snapshot;
  int64_t chunk = 0;  // 0: random chunk sizes
  int64_t die_at_step = -1, nan_at_step = -1;
  int64_t exit_after_commit_at_step = -1;  // _exit(9) once that step is committed (its updates
                                           // in flight, never read)
  int64_t op_timeout_ms = 30000;
  bool split_servers = false, fetch_momentum = false;
  std::string data_plane = "shm";  // shm | cuda_ipc
  bool device_buffers = false;     // push from and receive into CUDA device memory
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto v = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "missing value for " << k << "\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--socket")
      a.sockets.push_back(v());
    else if (k == "--rank")
      a.rank = std::stoi(v());
    else if (k == "--world")
      a.world = std::stoi(v());
    else if (k == "--steps")
      a.steps = std::stoi(v());
    else if (k == "--start-step")
      a.start_step = std::stoll(v());
    else if (k == "--mode")
      a.mode = v();
    else if (k == "--out")
      a.out = v();
    else if (k == "--chunk")
      a.chunk = std::stoll(v());
    else if (k == "--die-at-step")
      a.die_at_step = std::stoll(v());
    else if (k == "--exit-after-commit-at-step")
      a.exit_after_commit_at_step = std::stoll(v());
    else if (k == "--nan-at-step")
      a.nan_at_step = std::stoll(v());
    else if (k == "--skip-param")
      a.skip_param = v();
    else if (k == "--snapshot")
      a.snapshot = v();
    else if (k == "--op-timeout-ms")
      a.op_timeout_ms = std::stoll(v());
    else if (k == "--split-servers")
      a.split_servers = true;
    else if (k == "--data-plane")
      a.data_plane = v();
    else if (k == "--device-buffers")
      a.device_buffers = true;
    else if (k == "--fetch-momentum")
      a.fetch_momentum = true;
    else {
      std::cerr << "unknown argument " << k << "\n";
      std::exit(2);
    }
  }
  if (a.sockets.empty() || a.out.empty()) {
    std::cerr << "--socket and --out are required\n";
    std::exit(2);
  }
  return a;
}

void write_error(const Args& a, const client::ServerError& e) {
  std::ofstream f(a.out + ".err");
  f << error_code_name(e.code) << "\n" << e.rank << "\n" << e.param << "\n" << e.what() << "\n";
}

}  // namespace

// --device-buffers: one device buffer for gradients going out and updates coming in, on the
// legacy default stream (CUDA builds only).
class DeviceStaging {
 public:
  explicit DeviceStaging(bool on) {
    if (on && !kCudaBuild) throw muon::BackendUnavailable("--device-buffers needs a CUDA build");
  }
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;
#if defined(MUON_HAVE_CUDA)
  ~DeviceStaging() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  float* buffer(size_t n) {
    if (n > size_) {
      if (ptr_ != nullptr) MUON_CUDA_CHECK(cudaFree(ptr_));
      ptr_ = nullptr;
      MUON_CUDA_CHECK(cudaMalloc(&ptr_, n * sizeof(float)));
      size_ = n;
    }
    return static_cast<float*>(ptr_);
  }
  const float* upload(const std::vector<float>& v) {
    float* d = buffer(v.size());
    MUON_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
  }
  // Until the client's push stream (push_device copies there) has read the buffer.
  void wait(StreamHandle push_stream) {
    MUON_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(push_stream)));
  }
  void download(std::vector<float>& v) {
    MUON_CUDA_CHECK(cudaMemcpy(v.data(), ptr_, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
#else
  float* buffer(size_t) {
    return nullptr;
  }
  const float* upload(const std::vector<float>&) {
    return nullptr;
  }
  void wait(StreamHandle) {}
  void download(std::vector<float>&) {}
#endif
};

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const auto params = scenario_params();
  try {
    client::ClientConfig cfg;
    cfg.servers = a.sockets;
    cfg.rank = a.rank;
    cfg.world_size = a.world;
    cfg.name = "test client rank " + std::to_string(a.rank);
    cfg.op_timeout = std::chrono::milliseconds(a.op_timeout_ms);
    cfg.data_plane = transport::parse_data_plane(a.data_plane);
    client::Client c(cfg);
    DeviceStaging device(a.device_buffers);
    std::vector<client::ParameterRegistration> regs;
    for (size_t pi = 0; pi < params.size(); ++pi) {
      const auto& p = params[pi];
      client::ParameterRegistration r;
      r.name = p.name;
      r.shape = p.shape;
      r.options = scenario_options(p);
      r.push = push_ranges(a.mode, p, a.rank, a.world);
      r.want = {{0, p.numel()}};
      r.server = a.split_servers ? static_cast<int>(pi % a.sockets.size()) : 0;
      regs.push_back(r);
    }
    c.register_parameters(regs);

    std::ofstream out(a.out, std::ios::binary);
    for (int64_t step = a.start_step; step < a.start_step + a.steps; ++step) {
      struct Chunk {
        size_t pi;
        int64_t offset, count;
      };
      std::vector<Chunk> chunks;
      std::mt19937_64 rng(static_cast<uint64_t>(step * 1000 + a.rank));
      for (size_t pi = 0; pi < params.size(); ++pi) {
        if (params[pi].name == a.skip_param) continue;
        for (const auto& r : regs[pi].push) {
          for (int64_t off = r.begin; off < r.end;) {
            int64_t n =
                a.chunk > 0 ? a.chunk : std::uniform_int_distribution<int64_t>(1, r.size())(rng);
            n = std::min(n, r.end - off);
            chunks.push_back({pi, off, n});
            off += n;
          }
        }
      }
      std::shuffle(chunks.begin(), chunks.end(), rng);
      size_t pushed = 0;
      for (const auto& ch : chunks) {
        if (step == a.die_at_step && pushed * 2 >= chunks.size()) _exit(9);  // die mid-step
        std::vector<float> v(static_cast<size_t>(ch.count));
        for (int64_t i = 0; i < ch.count; ++i) {
          v[i] = grad_value(static_cast<int>(ch.pi), step, a.rank, ch.offset + i);
        }
        if (step == a.nan_at_step && ch.pi == 0) v[0] = std::numeric_limits<float>::quiet_NaN();
        if (a.device_buffers) {
          c.push_device(params[ch.pi].name, step, ch.offset, device.upload(v), ch.count, nullptr);
          device.wait(c.push_stream(params[ch.pi].name));  // the buffer is reused next chunk
        } else {
          c.push(params[ch.pi].name, step, ch.offset, v.data(), ch.count);
        }
        ++pushed;
      }
      for (size_t pi = 0; pi < params.size(); ++pi) {
        if (params[pi].name == a.skip_param || regs[pi].push.empty()) continue;
        c.commit(params[pi].name, step);
      }
      if (step == a.exit_after_commit_at_step) _exit(9);  // the server's updates now in flight
      for (size_t pi = 0; pi < params.size(); ++pi) {
        std::vector<float> u(static_cast<size_t>(params[pi].numel()));
        if (a.device_buffers) {
          c.wait_update_device(params[pi].name, step, device.buffer(u.size()), nullptr);
          device.download(u);
        } else {
          c.wait_update(params[pi].name, step, u.data());
        }
        const int64_t header[3] = {step, static_cast<int64_t>(pi), static_cast<int64_t>(u.size())};
        out.write(reinterpret_cast<const char*>(header), sizeof header);
        out.write(reinterpret_cast<const char*>(u.data()),
                  static_cast<std::streamsize>(u.size() * sizeof(float)));
      }
      out.flush();
    }
    if (!a.snapshot.empty()) c.snapshot(0, a.snapshot);
    if (a.fetch_momentum) {
      std::ofstream m(a.out + ".momentum", std::ios::binary);
      for (const auto& p : params) {
        auto v = c.fetch_momentum(p.name);
        m.write(reinterpret_cast<const char*>(v.data()),
                static_cast<std::streamsize>(v.size() * sizeof(float)));
      }
    }
  } catch (const client::ServerError& e) {
    write_error(a, e);
    std::cerr << "rank " << a.rank << ": " << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::ofstream f(a.out + ".err");
    f << "client\n-1\n\n" << e.what() << "\n";
    std::cerr << "rank " << a.rank << ": " << e.what() << "\n";
    return 4;
  }
  return 0;
}

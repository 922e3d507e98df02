// muon_offload_bench: what the server costs a trainer, measured against references in the same
// run (architecture guide section 9):
//   transport/<tile>       tile streaming into a live server vs memcpy of the same bytes, and vs
//                          the same tiles handed between two threads by spinning (no protocol)
//   step/gpt2_small/<k>    one optimizer step of GPT-2 small's 48 Muon matrices through the server
//                          with k client ranks vs the same kernels in process, and the time
//                          exposed after the last push when pushes are paced like backward
//                          (after one untimed warm-up step)
//   step/gpt2_small_default_vs_plain
//                          one optimizer step of the same 48 matrices through one server with
//                          default options (algorithm auto) vs pinned plain, alternating in one
//                          run: default/plain is the time ratio
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "bench/model_shapes.hpp"
#include "bench/server_process.hpp"
#include "client/client.hpp"
#include "client/health_probe.hpp"
#include "kernels/backend.hpp"
#include "kernels/streaming_copy.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace muon;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// OpenBLAS threads of the server and of the in-process reference: the same, so the comparison is
// kernel for kernel.
int cpu_threads() {
  const char* env = std::getenv("MUON_BENCH_CPU_THREADS");
  return env ? std::atoi(env) : 2;
}

client::ParameterRegistration param(const std::string& name, int64_t r, int64_t c,
                                    std::vector<transport::Range> push) {
  client::ParameterRegistration p;
  p.name = name;
  p.shape = {r, c};
  p.push = std::move(push);
  p.want = {{0, r * c}};
  p.options.orthogonalize.algorithm = NsAlgorithm::plain;
  return p;
}

// ---- transport ---------------------------------------------------------------------------------

// Streams a 64 MiB fp32 gradient in tiles of `tile` bytes into a live server, one full push per
// step, and times until the server has taken every tile out of shared memory (Client::flush);
// the step's Newton-Schulz and the update's way back run after that, untimed. The parameter is a
// stack of 16384 matrices of 32x32 so that Newton-Schulz stays cheap on a CPU. The reference
// copies the same tiles, in the same order, into a warm buffer of the parameter's size with
// memcpy in this process: the cost of moving these bytes once. One untimed step first warms the
// server's buffers (steady state, as from a trainer's second step on).
//
// A second reference, `tile_bw/handoff_bw`, tells the machine from the code: the same bytes
// handed from this thread to another in a shm session's chunks (a tile, at most
// transport::kShmChunkBytes) through a ring of 8 such slots, both sides spinning on atomic
// counters instead of frames and credits, the other thread copying each chunk out into a buffer
// of the parameter's size as a CPU server does (copy_streaming). No protocol hands bytes from one
// core to another faster on this machine; where one core's memcpy is fast and transfers between
// cores are slow, this bound itself lies below 0.8 of memcpy.
double handoff_seconds(const float* src, float* dst, int64_t elems, int64_t per_chunk,
                       std::vector<float>& ring) {
  const int64_t slots = static_cast<int64_t>(ring.size()) / per_chunk;
  const int64_t chunks = (elems + per_chunk - 1) / per_chunk;
  std::atomic<int64_t> filled{0}, drained{0};
  std::atomic<bool> go{false};
  std::thread reader([&] {
    while (!go.load(std::memory_order_acquire)) {
    }
    for (int64_t k = 0; k < chunks; ++k) {
      while (filled.load(std::memory_order_acquire) <= k) {
      }
      const int64_t off = k * per_chunk;
      copy_streaming(dst + off, ring.data() + (k % slots) * per_chunk,
                     std::min(per_chunk, elems - off));
      drained.store(k + 1, std::memory_order_release);
    }
  });
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (int64_t k = 0; k < chunks; ++k) {
    while (k - drained.load(std::memory_order_acquire) >= slots) {
    }
    const int64_t off = k * per_chunk;
    std::memcpy(ring.data() + (k % slots) * per_chunk, src + off,
                static_cast<size_t>(std::min(per_chunk, elems - off)) * sizeof(float));
    filled.store(k + 1, std::memory_order_release);
  }
  reader.join();
  return seconds(Clock::now() - t0);
}

void BM_Transport(benchmark::State& state) {
  const int64_t tile = state.range(0);
  const int64_t elems = 16 << 20;  // 64 MiB fp32
  bench::BenchServer server({"--threads", std::to_string(cpu_threads()), "--slot-kib",
                             std::to_string(tile / 1024), "--step-timeout-ms", "600000"});
  client::ClientConfig cfg;
  cfg.servers = {server.socket()};
  cfg.op_timeout = std::chrono::minutes(5);
  client::Client c(cfg);
  client::ParameterRegistration reg = param("w", 32, 32, {{0, elems}});
  reg.shape = {elems / (32 * 32), 32, 32};
  reg.want = {{0, 1024}};  // only a little comes back: the way back is not measured here
  c.register_parameters({reg});
  std::vector<float> src(static_cast<size_t>(elems), 0.5f);
  std::vector<float> dst(static_cast<size_t>(elems), 0.0f);
  std::vector<float> update(1024);
  const int64_t per_tile = tile / 4;
  int64_t step = 0;
  auto push_step = [&] {
    const auto t0 = Clock::now();
    for (int64_t off = 0; off < elems; off += per_tile)
      c.push("w", step, off, src.data() + off, per_tile);
    c.flush();
    const double t = seconds(Clock::now() - t0);
    c.commit("w", step);
    c.wait_update("w", step, update.data());
    ++step;
    return t;
  };
  push_step();  // warm-up
  const int64_t per_chunk =
      std::min<int64_t>(per_tile, static_cast<int64_t>(transport::kShmChunkBytes / 4));
  std::vector<float> ring(static_cast<size_t>(8 * per_chunk)), handed(static_cast<size_t>(elems));
  handoff_seconds(src.data(), handed.data(), elems, per_chunk, ring);  // warm-up
  double stream_s = 0, memcpy_s = 0, handoff_s = 0;
  int64_t bytes = 0;
  for (auto _ : state) {
    const double t = push_step();
    stream_s += t;
    const auto t0 = Clock::now();
    for (int64_t off = 0; off < elems; off += per_tile) {
      std::memcpy(dst.data() + off, src.data() + off, static_cast<size_t>(tile));
      benchmark::DoNotOptimize(dst.data());
    }
    memcpy_s += seconds(Clock::now() - t0);
    handoff_s += handoff_seconds(src.data(), handed.data(), elems, per_chunk, ring);
    bytes += elems * 4;
    state.SetIterationTime(t);
  }
  state.counters["tile_GBps"] = static_cast<double>(bytes) / stream_s / 1e9;
  state.counters["memcpy_GBps"] = static_cast<double>(bytes) / memcpy_s / 1e9;
  state.counters["tile_bw/memcpy_bw"] = memcpy_s / stream_s;
  state.counters["tile_bw/handoff_bw"] = handoff_s / stream_s;
}
BENCHMARK(BM_Transport)
    ->Name("transport")
    ->Arg(256 << 10)
    ->Arg(1 << 20)
    ->Arg(4 << 20)
    ->UseManualTime()
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond);

// ---- one optimizer step of GPT-2 small ---------------------------------------------------------

// One standard-normal gradient per matrix (row-major rows x cols, fp32), from a fixed seed.
std::vector<std::vector<float>> random_gradients(const std::vector<bench::NamedMatrix>& mats,
                                                 unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> grads;
  for (const auto& m : mats) {
    grads.emplace_back(static_cast<size_t>(m.rows * m.cols));
    for (auto& x : grads.back()) x = normal(rng);
  }
  return grads;
}


void BM_Step(benchmark::State& state) {
  const int clients = static_cast<int>(state.range(0));
  const auto mats = bench::gpt2_small_matrices();
  const auto grads = random_gradients(mats, 1);

  // Reference: the same kernels in process, one matrix after the other, warm buffers (the second
  // of two passes is timed).
  BackendConfig bc;
  bc.cpu_threads = cpu_threads();
  auto backend = make_backend("cpu", bc);
  std::vector<double> ns_time(mats.size());
  double inprocess_s = 0;
  {
    MuonOptions o;
    o.orthogonalize.algorithm = NsAlgorithm::plain;  // as the server's registrations (param())
    std::vector<std::vector<float>> mom, upd;
    for (const auto& g : grads) {
      mom.emplace_back(g.size(), 0.0f);
      upd.emplace_back(g.size(), 0.0f);
    }
    for (int pass = 0; pass < 2; ++pass) {
      inprocess_s = 0;
      for (size_t i = 0; i < mats.size(); ++i) {
        const auto& m = mats[i];
        const auto t0 = Clock::now();
        backend->muon_update(m.name, {1, m.rows, m.cols}, grads[i].data(), mom[i].data(),
                             upd[i].data(), o);
        ns_time[i] = seconds(Clock::now() - t0);
        inprocess_s += ns_time[i];
      }
    }
  }

  bench::BenchServer server({"--threads", std::to_string(cpu_threads()), "--slot-kib", "4096",
                             "--step-timeout-ms", "600000"});
  // Each rank pushes its row shard (contributors = 1): the Newton-Schulz work is the same for any
  // number of clients; more clients only split the bytes.
  std::vector<std::unique_ptr<client::Client>> cs(static_cast<size_t>(clients));
  std::vector<std::thread> connect;
  for (int r = 0; r < clients; ++r) {
    connect.emplace_back([&, r] {
      client::ClientConfig cfg;
      cfg.servers = {server.socket()};
      cfg.rank = r;
      cfg.world_size = clients;
      cfg.op_timeout = std::chrono::minutes(10);
      cs[r] = std::make_unique<client::Client>(cfg);
      std::vector<client::ParameterRegistration> regs;
      for (const auto& m : mats) {
        const int64_t rows = m.rows / clients;
        regs.push_back(
            param(m.name, m.rows, m.cols, {{r * rows * m.cols, (r + 1) * rows * m.cols}}));
      }
      cs[r]->register_parameters(regs);
    });
  }
  for (auto& t : connect) t.join();

  // Backward pacing: gradient i becomes ready `pace` after gradient i-1, as a GPU backward would
  // produce them; `pace` = the mean in-process NS time of one matrix, so a server that keeps up
  // hides all but the last matrices' NS.
  const auto pace = std::chrono::duration<double>(inprocess_s / mats.size());
  int64_t step = 0;
  double offload_s = 0, exposed_s = 0, burst_s = 0;
  bool warm = false;  // one untimed step first: the server's buffers are then warm, as in training
  for (auto _ : state) {
    // (a) burst: everything pushed at once; (b) paced like backward.
    for (int mode = warm ? 0 : -1; mode < 2; ++mode) {
      std::vector<Clock::time_point> last_push(static_cast<size_t>(clients));
      std::vector<Clock::time_point> done(static_cast<size_t>(clients));
      const auto t0 = Clock::now();
      std::vector<std::thread> ranks;
      for (int r = 0; r < clients; ++r) {
        ranks.emplace_back([&, r] {
          for (size_t i = 0; i < mats.size(); ++i) {
            if (mode == 1) std::this_thread::sleep_until(t0 + pace * static_cast<double>(i));
            const auto& m = mats[i];
            const int64_t rows = m.rows / clients, off = r * rows * m.cols;
            cs[r]->push(m.name, step, off, grads[i].data() + off, rows * m.cols);
            cs[r]->commit(m.name, step);
          }
          last_push[r] = Clock::now();
          std::vector<float> u;
          for (const auto& m : mats) {
            u.resize(static_cast<size_t>(m.rows * m.cols));
            cs[r]->wait_update(m.name, step, u.data());
          }
          done[r] = Clock::now();
        });
      }
      for (auto& t : ranks) t.join();
      const auto end = *std::max_element(done.begin(), done.end());
      const auto pushed = *std::max_element(last_push.begin(), last_push.end());
      if (mode < 0) {
        warm = true;
      } else if (mode == 0) {
        burst_s += seconds(end - t0);
      } else {
        exposed_s += seconds(end - pushed);
        offload_s += seconds(end - t0);
      }
      ++step;
    }
    state.SetIterationTime(burst_s);
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["inprocess_s"] = inprocess_s;
  state.counters["offload_s"] = burst_s / iters;
  state.counters["offload/inprocess"] = burst_s / iters / inprocess_s;
  state.counters["exposed_s"] = exposed_s / iters;
  state.counters["last_ns_s"] = ns_time.back();
  state.counters["exposed/last_ns"] = exposed_s / iters / ns_time.back();
}
BENCHMARK(BM_Step)
    ->Name("step/gpt2_small")
    ->Arg(1)
    ->Arg(4)
    ->ArgName("clients")
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kSecond);

// ---- default options vs plain on the server ----------------------------------------------------

// One client registers GPT-2 small's 48 matrices twice: "plain/<name>" pinned to plain and
// "default/<name>" with MuonOptions' defaults (algorithm auto). A step of one set = every
// gradient pushed and committed, then every update awaited. One untimed step of each first (auto
// measures its choices there when the server's table has none; buffers warm), then kSteps of each,
// alternating which set goes first. default/plain = total default time / total plain time.
void BM_StepDefaultVsPlain(benchmark::State& state) {
  constexpr int kSteps = 3;
  const auto mats = bench::gpt2_small_matrices();
  const auto grads = random_gradients(mats, 2);
  bench::BenchServer server({"--threads", std::to_string(cpu_threads()), "--slot-kib", "4096",
                             "--step-timeout-ms", "600000"});
  client::ClientConfig cfg;
  cfg.servers = {server.socket()};
  cfg.op_timeout = std::chrono::minutes(10);
  client::Client c(cfg);
  std::vector<client::ParameterRegistration> regs;
  for (const char* set : {"plain/", "default/"}) {
    for (const auto& m : mats) {
      auto p = param(set + m.name, m.rows, m.cols, {{0, m.rows * m.cols}});
      if (std::string(set) == "default/") p.options = MuonOptions{};
      regs.push_back(p);
    }
  }
  c.register_parameters(regs);
  std::vector<int64_t> steps(2, 0);
  std::vector<float> u;
  const auto one_step = [&](int set) {
    const std::string prefix = set == 0 ? "plain/" : "default/";
    const auto t0 = Clock::now();
    for (size_t i = 0; i < mats.size(); ++i) {
      const auto& m = mats[i];
      c.push(prefix + m.name, steps[set], 0, grads[i].data(), m.rows * m.cols);
      c.commit(prefix + m.name, steps[set]);
    }
    for (const auto& m : mats) {
      u.resize(static_cast<size_t>(m.rows * m.cols));
      c.wait_update(prefix + m.name, steps[set], u.data());
    }
    ++steps[set];
    return seconds(Clock::now() - t0);
  };
  one_step(0);  // warm-up
  one_step(1);  // warm-up; auto's choices measured here when the table has none
  double plain_s = 0, default_s = 0;
  for (auto _ : state) {
    for (int k = 0; k < kSteps; ++k) {
      const int first = k % 2;
      const double a = one_step(first), b = one_step(1 - first);
      (first == 0 ? plain_s : default_s) += a;
      (first == 0 ? default_s : plain_s) += b;
    }
    state.SetIterationTime(default_s);
  }
  const double n = static_cast<double>(state.iterations()) * kSteps;
  state.counters["plain_s"] = plain_s / n;
  state.counters["default_s"] = default_s / n;
  state.counters["default/plain"] = default_s / plain_s;
}
BENCHMARK(BM_StepDefaultVsPlain)
    ->Name("step/gpt2_small_default_vs_plain")
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kSecond);

}  // namespace

BENCHMARK_MAIN();

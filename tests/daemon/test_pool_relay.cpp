// Pool relays end to end with real processes (daemon/pool/relay.hpp, daemon/pool_routes.hpp): two
// servers, one per domain, each the owner of half the parameters and the relay of the other half
// for its domain; four rank processes, each talking only to its domain's server. Updates and the
// owners' momentum are compared bitwise with the same kernels run in process on the gradient the
// plan's reduction tree forms; failures in one domain reach the ranks of both.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "client_runs.hpp"
#include "kernels/device_probe.hpp"
#include "process.hpp"
#include "require_gpu.hpp"
#include "scenario.hpp"
#include "server_process.hpp"

using namespace muon;
using namespace muon::testing;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr int kWorld = 4;  // ranks 0, 1 in domain 0; ranks 2, 3 in domain 1

int domain_of(int rank) {
  return rank < 2 ? 0 : 1;
}
int owner_of(size_t pi) {
  return static_cast<int>(pi % 2);  // server d sits in domain d
}

// The plan: servers 0 and 1 (one per domain), parameter pi owned by server pi % 2, every domain's
// ranks pushing to their own domain's server (the owner in its domain, a relay in the other).
std::string write_plan(const fs::path& dir) {
  std::string params;
  const auto ps = scenario_params();
  for (size_t pi = 0; pi < ps.size(); ++pi) {
    params += std::string(pi ? "," : "") + "{\"name\": \"" + ps[pi].name +
              "\", \"owner\": " + std::to_string(owner_of(pi)) + ", \"relays\": [0, 1]}";
  }
  const std::string plan =
      "{\"servers\": [{\"id\": 0, \"domain\": 0}, {\"id\": 1, \"domain\": 1}],"
      " \"domains\": [{\"id\": 0, \"servers\": [0], \"compute_ranks\": [0, 1]},"
      "               {\"id\": 1, \"servers\": [1], \"compute_ranks\": [2, 3]}],"
      " \"ranks\": [{\"rank\": 0, \"domain\": 0}, {\"rank\": 1, \"domain\": 0},"
      "             {\"rank\": 2, \"domain\": 1}, {\"rank\": 3, \"domain\": 1}],"
      " \"parameters\": [" +
      params + "]}";
  const auto path = dir / "plan.json";
  std::ofstream(path) << plan;
  return path.string();
}

// The gradient the pool forms for parameter pi at `step`: at the owner, from -0, the ranks of
// its domain in ascending order, then the other domain's partial sum (itself from -0, its ranks
// in ascending order) where that domain pushes.
std::vector<float> tree_gradient(const std::string& mode, size_t pi, int64_t step) {
  const auto p = scenario_params()[pi];
  const int owner_domain = owner_of(pi);
  const auto n = static_cast<size_t>(p.numel());
  std::vector<float> g(n, -0.0f), partial(n, -0.0f);
  std::vector<bool> relayed(n, false);
  for (int r = 0; r < kWorld; ++r) {
    const bool direct = domain_of(r) == owner_domain;
    for (const auto& range : push_ranges(mode, p, r, kWorld)) {
      for (int64_t i = range.begin; i < range.end; ++i) {
        const float v = grad_value(static_cast<int>(pi), step, r, i);
        if (direct) {
          g[static_cast<size_t>(i)] += v;
        } else {
          partial[static_cast<size_t>(i)] += v;
          relayed[static_cast<size_t>(i)] = true;
        }
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (relayed[i]) g[i] += partial[i];
  }
  return g;
}

struct Reference {
  std::vector<std::vector<std::vector<float>>> updates;  // [step][param]
  std::vector<std::vector<float>> momentum;              // after the last step
};

// `kind`: the backend the servers run ("cpu", or "cuda" for the GPU data plane, whose device step
// is bitwise the CUDA backend's).
Reference tree_reference(const std::string& mode, int steps, const char* kind = "cpu") {
  BackendConfig bc;
  bc.cpu_threads = kThreads;
  auto backend = make_backend(kind, bc);
  const auto params = scenario_params();
  Reference ref;
  for (const auto& p : params) ref.momentum.emplace_back(static_cast<size_t>(p.numel()), 0.0f);
  ref.updates.resize(static_cast<size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    for (size_t pi = 0; pi < params.size(); ++pi) {
      auto g = tree_gradient(mode, pi, s);
      std::vector<float> u(g.size());
      backend->muon_update(params[pi].name,
                           matrix_shape_from_dims(params[pi].shape, params[pi].name), g.data(),
                           ref.momentum[pi].data(), u.data(), scenario_options(params[pi]));
      ref.updates[static_cast<size_t>(s)].push_back(std::move(u));
    }
  }
  return ref;
}

// The two servers of the plan, each told the whole pool.
// The folder goes with it: a run's rank outputs (every update a rank received; ~100 MB each
// after PoolMidRun's seconds of steps) must not pile up in /tmp run after run. Declared before the
// servers and ranks of a test, it is destroyed after them.
struct Pool {
  fs::path dir = temp_dir();
  std::string plan = write_plan(dir);
  std::string sock0 = (dir / "pool0.sock").string(), sock1 = (dir / "pool1.sock").string();
  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
  std::vector<std::string> args(int id, std::vector<std::string> extra = {}) const {
    std::vector<std::string> a = {
        "--plan", plan, "--server-id", std::to_string(id), "--pool-servers", sock0 + "," + sock1};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::string socket_of_domain(int d) const { return d == 0 ? sock0 : sock1; }
  /// The four rank processes, each on its domain's server; `extra(r)`: rank r's own flags.
  std::vector<ClientRun> ranks(const std::string& mode,
                               const std::function<std::vector<std::string>(int)>& extra) const {
    std::vector<ClientRun> runs;
    for (int r = 0; r < kWorld; ++r) {
      runs.push_back(
          start_client(dir, {socket_of_domain(domain_of(r))}, r, kWorld, mode, extra(r)));
    }
    return runs;
  }
};

class PoolRelay : public ::testing::TestWithParam<std::string> {};

// Both servers of `pool` (step timeout `step_timeout_ms`) and its four ranks well into an
// endless replicated run (their own waits `op_timeout_ms`), for a failure to strike mid-run.
struct PoolMidRun {
  PoolMidRun(const Pool& pool, const std::string& step_timeout_ms,
             const std::string& op_timeout_ms)
      : s0(pool.dir, pool.args(0, {"--step-timeout-ms", step_timeout_ms}), "pool0"),
        s1(pool.dir, pool.args(1, {"--step-timeout-ms", step_timeout_ms}), "pool1"),
        runs(pool.ranks("replicated", [&](int) {
          return std::vector<std::string>{"--steps", "100000", "--op-timeout-ms", op_timeout_ms};
        })) {
    std::this_thread::sleep_for(1500ms);
  }
  ServerProcess s0, s1;
  std::vector<ClientRun> runs;
};

}  // namespace

TEST_P(PoolRelay, RelayedUpdatesAndOwnersMomentumAreBitwiseTheTreeReduction) {
  const std::string mode = GetParam();
  Pool pool;
  ServerProcess s0(pool.dir, pool.args(0), "pool0");
  ServerProcess s1(pool.dir, pool.args(1), "pool1");
  // Every rank fetches every parameter's momentum at the end: through its own server, which
  // asks the owner for the relayed ones.
  auto runs = pool.ranks(mode, [](int) {
    return std::vector<std::string>{"--steps", "3", "--fetch-momentum"};
  });
  for (auto& run : runs) ASSERT_EQ(wait_exit(run.pid, 120s), 0) << read_err(run.out).message;
  const auto ref = tree_reference(mode, 3);
  for (int r = 0; r < kWorld; ++r) {
    expect_bitwise(runs[r].out, ref.updates, 0, 3, "rank " + std::to_string(r));
    std::ifstream m(runs[r].out + ".momentum", std::ios::binary);
    for (size_t pi = 0; pi < ref.momentum.size(); ++pi) {
      std::vector<float> got(ref.momentum[pi].size());
      m.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(got.size() * 4));
      ASSERT_TRUE(m) << "rank " << r << ": momentum of param " << pi << " missing";
      EXPECT_EQ(std::memcmp(got.data(), ref.momentum[pi].data(), got.size() * 4), 0)
          << "rank " << r << ": momentum of param " << pi << " (owner server " << owner_of(pi)
          << ") differs from the reference";
    }
  }
}

// Data parallel (every rank pushes everything: the relay forwards one full partial sum) and
// ZeRO-like shards (each rank pushes its rows: a relay forwards only its domain's rows).
INSTANTIATE_TEST_SUITE_P(Modes, PoolRelay, ::testing::Values("replicated", "rows"));

// The GPU data plane under relays: both servers on the CUDA backend (device reductions; a relay
// reads its domain's partial sum back to the host and writes the owner's update into device
// memory before returning it), ranks on CUDA IPC pushing from and receiving into device memory.
TEST(PoolRelayGpu, RelayedUpdatesOnTheGpuDataPlaneAreBitwiseTheTreeReduction) {
  REQUIRE_GPU();
  Pool pool;
  ServerProcess s0(pool.dir, pool.args(0, {"--backend", "cuda"}), "pool0");
  ServerProcess s1(pool.dir, pool.args(1, {"--backend", "cuda"}), "pool1");
  auto runs = pool.ranks("rows", [](int) {
    return std::vector<std::string>{"--steps", "3", "--data-plane", "cuda_ipc", "--device-buffers"};
  });
  for (auto& run : runs) ASSERT_EQ(wait_exit(run.pid, 120s), 0) << read_err(run.out).message;
  const auto ref = tree_reference("rows", 3, "cuda");
  for (int r = 0; r < kWorld; ++r) {
    expect_bitwise(runs[r].out, ref.updates, 0, 3, "rank " + std::to_string(r));
  }
}

TEST(PoolRelayFailure, RankLostInOneDomainFailsTheStepForEveryRankWithinTheTimeout) {
  Pool pool;
  ServerProcess s0(pool.dir, pool.args(0, {"--step-timeout-ms", "3000"}), "pool0");
  ServerProcess s1(pool.dir, pool.args(1, {"--step-timeout-ms", "3000"}), "pool1");
  auto runs = pool.ranks("replicated", [](int r) {
    std::vector<std::string> extra = {"--steps", "3", "--op-timeout-ms", "60000"};
    if (r == 3) extra.insert(extra.end(), {"--die-at-step", "1"});
    return extra;
  });
  EXPECT_EQ(wait_exit(runs[3].pid, 60s), 9);
  const auto ref = tree_reference("replicated", 1);
  for (int r = 0; r < 3; ++r) {
    // Step 0 completed everywhere; step 1 failed with an error that says why.
    EXPECT_EQ(wait_exit(runs[r].pid, 60s), 3) << "rank " << r;
    const auto e = read_err(runs[r].out);
    EXPECT_TRUE(e.code == "peer_lost" || e.code == "timeout") << "rank " << r << ": " << e.code;
    EXPECT_NE(e.message.find(e.code == "timeout" ? "relay server 1" : "rank 3"), std::string::npos)
        << "rank " << r << ": " << e.message;
    expect_bitwise(runs[r].out, ref.updates, 0, 1, "rank " + std::to_string(r));
  }
}

TEST(PoolRelayFailure, ServerKilledMidRunFailsTheOtherDomainWithItNamed) {
  Pool pool;
  PoolMidRun mid(pool, "3000", "60000");
  auto& runs = mid.runs;
  mid.s1.kill9();  // domain 1's server: owner of half the parameters, relay of the other half
  for (int r = 0; r < 2; ++r) {
    // Domain 0 learns it from its own server: the owner of its relayed parameters is gone, or the
    // relay of its owned ones is.
    EXPECT_EQ(wait_exit(runs[r].pid, 60s), 3) << "rank " << r;
    const auto e = read_err(runs[r].out);
    EXPECT_TRUE(e.code == "peer_lost" || e.code == "timeout") << e.code << ": " << e.message;
    EXPECT_NE(e.message.find("server 1"), std::string::npos) << e.message;
  }
  for (int r = 2; r < kWorld; ++r) {  // domain 1 lost its server outright
    EXPECT_NE(wait_exit(runs[r].pid, 60s).value_or(0), 0) << "rank " << r;
  }
}

// SIGTERM to one server of the pool (an orderly stop, not a crash): every rank learns it at
// once, with the server named and the stop's reason, not at the step timeout (a minute here).
// Domain 1's ranks hear it from their own server; domain 0's from theirs: the owner of its
// relayed parameters is shutting down, or the relay of its owned ones shut down (its goodbye),
// and a step that needs that relay's partial sum is refused until it reconnects.
TEST(PoolRelayFailure, ServerStoppedMidRunIsNamedAsStoppedToEveryRankAtOnce) {
  Pool pool;
  PoolMidRun mid(pool, "60000", "120000");
  auto& runs = mid.runs;
  EXPECT_EQ(mid.s1.terminate(), 0);  // SIGTERM: domain 1's server stops in order
  for (int r = 0; r < kWorld; ++r) {
    const auto rc = wait_exit(runs[r].pid, 30s);
    const auto e = read_err(runs[r].out);
    if (domain_of(r) == 1) {
      // The server's error, or the connection it then closed (exit 4: ConnectionLost), which
      // gives the error's text as the reason.
      EXPECT_TRUE((rc == 3 && e.code == "shutdown") || rc == 4)
          << "rank " << r << ": exit " << rc.value_or(-1) << ", " << e.code << ": " << e.message;
      EXPECT_NE(e.message.find("server shutting down (signal SIGTERM)"), std::string::npos)
          << "rank " << r << ": " << e.message;
      continue;
    }
    EXPECT_EQ(rc, 3) << "rank " << r;
    EXPECT_TRUE(e.code == "shutdown" || e.code == "peer_lost")
        << "rank " << r << ": " << e.code << ": " << e.message;
    EXPECT_NE(e.message.find("server 1"), std::string::npos) << "rank " << r << ": " << e.message;
    EXPECT_TRUE(e.message.find("server shutting down (signal SIGTERM)") != std::string::npos ||
                e.message.find("shut down (it said goodbye)") != std::string::npos)
        << "rank " << r << ": " << e.message;
  }
}

TEST(PoolRelayFailure, UnreachableOwnerIsNamedToTheRelaysRanks) {
  Pool pool;  // server 1 never starts
  ServerProcess s0(pool.dir, pool.args(0, {"--step-timeout-ms", "3000"}), "pool0");
  std::vector<ClientRun> runs;
  for (int r = 0; r < 2; ++r) {
    runs.push_back(start_client(pool.dir, {pool.sock0}, r, kWorld, "replicated",
                                {"--steps", "1", "--op-timeout-ms", "60000"}));
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(wait_exit(runs[r].pid, 60s), 3) << "rank " << r;
    const auto e = read_err(runs[r].out);
    // Either the owned parameters' registration (waiting for relay server 1) or the relayed
    // ones' (owner server 1 unreachable) fails first; both name server 1.
    EXPECT_TRUE(e.code == "peer_lost" || e.code == "timeout") << e.code << ": " << e.message;
    EXPECT_NE(e.message.find("server 1"), std::string::npos) << e.message;
  }
}

TEST(PoolRelayFailure, RankRegisteringWithAServerThePlanDoesNotRouteItToIsRefused) {
  Pool pool;
  ServerProcess s0(pool.dir, pool.args(0, {"--step-timeout-ms", "3000"}), "pool0");
  // Rank 2 is in domain 1: the plan sends its parameters to server 1, not server 0.
  auto run = start_client(pool.dir, {pool.sock0}, 2, kWorld, "replicated", {"--steps", "1"});
  EXPECT_EQ(wait_exit(run.pid, 60s), 3);
  const auto e = read_err(run.out);
  EXPECT_EQ(e.code, "bad_request");
  EXPECT_NE(e.message.find("not expected to register"), std::string::npos) << e.message;
}

TEST(PoolRelayFailure, ServerRefusesAPlanWithoutItsPool) {
  Pool pool;
  // Server 0 relays half the parameters, so it must know where their owner is.
  const auto pid =
      spawn({MUON_OFFLOADD, "--socket", pool.sock0, "--plan", pool.plan, "--server-id", "0"});
  EXPECT_EQ(wait_exit(pid, 20s), 1);
  const auto pid2 = spawn({MUON_OFFLOADD, "--socket", pool.sock0, "--plan", pool.plan,
                           "--server-id", "2", "--pool-servers", pool.sock0 + "," + pool.sock1});
  EXPECT_EQ(wait_exit(pid2, 20s), 1);
  // A swapped id: the pool says server 1 listens elsewhere.
  const auto pid3 = spawn({MUON_OFFLOADD, "--socket", pool.sock0, "--plan", pool.plan,
                           "--server-id", "1", "--pool-servers", pool.sock0 + "," + pool.sock1});
  EXPECT_EQ(wait_exit(pid3, 20s), 1);
}

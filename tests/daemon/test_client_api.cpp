// The C++ client API against a real muon-offloadd process: bad requests answered with errors that
// name the parameter while the session lives on, momentum fetch/load, gradient accumulation,
// bf16 on the wire, a server killed under a client (fail fast, reconnect, restore, go on
// bitwise), and a restore at another number of ranks.
#include <gtest/gtest.h>

#include <atomic>

#include <cstring>
#include <mutex>
#include <thread>

#include "client/client.hpp"
#include "client_fixtures.hpp"
#include "transport/bf16.hpp"

using namespace muon;
using namespace muon::testing;

namespace {

template <class F>
void expect_server_error(F&& f, const std::string& code, const std::string& needle) {
  try {
    f();
    FAIL() << "expected a ServerError " << code << " containing: " << needle;
  } catch (const client::ServerError& e) {
    EXPECT_EQ(error_code_name(e.code), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Registers `reg` (fp32 updates) straight through a connection, below Client's own checks, so
// that the server's checks are what answer; returns the message sent.
transport::RegisterParam register_on(client::Connection& conn,
                                     const client::ParameterRegistration& reg) {
  const auto m = client::register_message(reg);
  conn.wait_register(conn.send_register(m), reg.name);
  conn.expect_updates(reg.name, reg.want, 4);
  return m;
}

}  // namespace

TEST(ClientApi, BadRequestsNameTheParameterAndTheSessionLivesOn) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  // The connection level, below Client's own checks, so the server's checks are what answer.
  client::Connection conn(server.socket(), 0, 1, "api test", 5000ms, 20000ms);
  auto reg = one_param("w", {16, 24});
  const int64_t n = 16 * 24;
  const auto m = register_on(conn, reg);
  Reference ref(reg);
  auto push = [&](const std::string& name, int64_t step, int64_t offset,
                  const std::vector<float>& v) {
    conn.push(name, step, offset, reinterpret_cast<const std::byte*>(v.data()),
              static_cast<int64_t>(v.size()), 4, transport::ChunkKind::gradient);
  };
  std::vector<float> u(static_cast<size_t>(n));
  auto wait = [&](const std::string& name, int64_t step) {
    return conn.wait_update(name, step, reinterpret_cast<std::byte*>(u.data()));
  };
  const auto g0 = gradient(n, 0);
  push("w", 0, 0, g0);
  conn.commit("w", 0);
  ASSERT_TRUE(wait("w", 0));
  EXPECT_TRUE(same_bits(u, ref.step(g0)));

  push("w", 1, n - 2, std::vector<float>(4, 1.0f));
  expect_server_error([&] { wait("w", 1); }, "bad_request", "outside its 384 elements");
  conn.expect_updates("nope", {{0, 4}}, 4);
  push("nope", 0, 0, std::vector<float>(4, 1.0f));
  expect_server_error([&] { wait("nope", 0); }, "bad_request", "unknown parameter 'nope'");
  push("w", 5, 0, g0);
  expect_server_error([&] { wait("w", 5); }, "step_mismatch", "step gap: got step 5, expected 1");
  conn.commit("w", 2);
  expect_server_error([&] { wait("w", 2); }, "bad_request", "commit of step 2 that has no data");
  auto other = m;
  other.shape = {24, 16};
  expect_server_error([&] { conn.wait_register(conn.send_register(other), "w"); }, "bad_request",
                      "already registered with another shape");

  // None of that touched the momentum or the session: step 1 matches the reference.
  const auto g1 = gradient(n, 1);
  push("w", 1, 0, g1);
  conn.commit("w", 1);
  ASSERT_TRUE(wait("w", 1));
  EXPECT_TRUE(same_bits(u, ref.step(g1)));
  fs::remove_all(dir);
}

TEST(ClientApi, ReplayedStepIsRefusedAndALiveRankCannotConnectTwice) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  auto reg = one_param("w", {8, 8});
  {
    client::Client c(config_for(server.socket()));
    c.register_parameters({reg});
    const auto g = gradient(64, 0);
    run_step(c, "w", 0, g);
    // While rank 0 is connected, another rank 0 is refused, naming the rank.
    try {
      client::Client twin(config_for(server.socket()));
      FAIL() << "expected a refusal";
    } catch (const client::ServerError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 is already connected"), std::string::npos)
          << e.what();
    }
  }
  // A new session (after the first said goodbye) replays step 0: refused, naming the step.
  client::Client c(config_for(server.socket()));
  c.register_parameters({reg});
  const auto g = gradient(64, 0);
  c.push("w", 0, 0, g.data(), 64);
  c.commit("w", 0);
  std::vector<float> u(64);
  expect_server_error([&] { c.wait_update("w", 0, u.data()); }, "step_mismatch",
                      "step 0 was already applied (last applied step 0)");
  fs::remove_all(dir);
}

// update_state answers without waiting, as wait_update would find the update: pending before the
// server answers, complete once the values are here, failed once the server failed the step
// (the wait then throws its error), lost once the server is gone.
TEST(ClientApi, UpdateStateSaysWhatAWaitWouldFindWithoutWaiting) {
  using client::UpdateState;
  const auto dir = temp_dir();
  ServerProcess server(dir);
  client::Client c(config_for(server.socket()));
  c.register_parameters({one_param("w", {8, 8})});
  const auto poll = [&](int64_t step, UpdateState until) {
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    while (c.update_state("w", step) == UpdateState::pending &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_EQ(c.update_state("w", step), until) << "step " << step;
  };
  EXPECT_EQ(c.update_state("w", 0), UpdateState::pending);  // nothing pushed
  const auto g = gradient(64, 0);
  c.push("w", 0, 0, g.data(), 64);
  c.commit("w", 0);
  poll(0, UpdateState::complete);
  std::vector<float> u(64);
  EXPECT_TRUE(c.wait_update("w", 0, u.data()));
  c.push("w", 5, 0, g.data(), 64);  // a gap: the server refuses step 5
  c.commit("w", 5);                  // (the commit writes the push frame the client held)
  poll(5, UpdateState::failed);
  expect_server_error([&] { c.wait_update("w", 5, u.data()); }, "step_mismatch", "step 5");
  server.kill9();
  poll(1, UpdateState::lost);
  fs::remove_all(dir);
}

TEST(ClientApi, NonFiniteGradientUnderSkipPolicyGivesZerosAndKeepsMomentum) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  client::Client c(config_for(server.socket()));
  auto reg = one_param("w", {8, 12});
  reg.options.orthogonalize.nonfinite = NonFinitePolicy::skip;
  c.register_parameters({reg});
  Reference ref(reg);
  auto g = gradient(96, 0);
  g[5] = std::numeric_limits<float>::infinity();
  c.push("w", 0, 0, g.data(), 96);
  c.commit("w", 0);
  std::vector<float> u(96, 1.0f);
  EXPECT_FALSE(c.wait_update("w", 0, u.data()));
  for (float v : u) ASSERT_EQ(v, 0.0f);
  int64_t last = -2;
  auto m = c.fetch_momentum("w", &last);
  EXPECT_EQ(last, 0);
  for (float v : m) ASSERT_EQ(v, 0.0f);  // untouched: still the initial zeros
  const auto g1 = gradient(96, 1);
  EXPECT_TRUE(same_bits(run_step(c, "w", 1, g1), ref.step(g1)));
  fs::remove_all(dir);
}

TEST(ClientApi, MomentumFetchAndLoadCarryTheStateBitwise) {
  const auto dir = temp_dir();
  auto reg = one_param("layers.0.w", {20, 36});
  Reference ref(reg);
  std::vector<float> saved;
  int64_t last = -1;
  {
    ServerProcess a(dir, {}, "a");
    client::Client c(config_for(a.socket()));
    c.register_parameters({reg});
    for (int64_t s = 0; s < 2; ++s) {
      const auto g = gradient(720, s);
      EXPECT_TRUE(same_bits(run_step(c, reg.name, s, g), ref.step(g)));
    }
    saved = c.fetch_momentum(reg.name, &last);
  }
  EXPECT_EQ(last, 1);
  EXPECT_TRUE(same_bits(saved, ref.momentum));
  ServerProcess b(dir, {}, "b");
  client::Client c(config_for(b.socket()));
  c.register_parameters({reg});
  c.load_momentum(reg.name, last, saved.data());
  const auto g2 = gradient(720, 2);
  EXPECT_TRUE(same_bits(run_step(c, reg.name, 2, g2), ref.step(g2)));
  fs::remove_all(dir);
}

TEST(ClientApi, RepeatedPushesWithinAStepAccumulate) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  client::Client c(config_for(server.socket()));
  auto reg = one_param("w", {12, 20});
  c.register_parameters({reg});
  Reference ref(reg);
  const auto g = gradient(240, 0);
  // Two micro-batches of g/2 each (exact in fp32), cut into different chunks.
  std::vector<float> half(g.size());
  for (size_t i = 0; i < g.size(); ++i) half[i] = g[i] * 0.5f;
  for (int64_t off = 0; off < 240; off += 50)
    c.push("w", 0, off, half.data() + off, std::min<int64_t>(50, 240 - off));
  for (int64_t off = 0; off < 240; off += 33)
    c.push("w", 0, off, half.data() + off, std::min<int64_t>(33, 240 - off));
  c.commit("w", 0);
  std::vector<float> u(240);
  ASSERT_TRUE(c.wait_update("w", 0, u.data()));
  EXPECT_TRUE(same_bits(u, ref.step(g)));
  fs::remove_all(dir);
}

// On the shm data plane a push is cut into chunks of at most 256 KiB whatever the server's slot
// size (transport::kShmChunkBytes: cache-sized chunks pipeline, bench/README.md): 3,072,000
// fp32 elements into 4 MiB slots go as 47 chunks, not 3, and the step is bitwise the reference.
TEST(ClientApi, ShmPushesGoInChunksOfAtMost256KiB) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--slot-kib", "4096"});
  client::Connection conn(server.socket(), 0, 1, "chunk test", 5000ms, 60000ms);
  auto reg = one_param("w", {750, 64, 64});
  const int64_t n = 750 * 64 * 64;
  register_on(conn, reg);
  Reference ref(reg);
  const auto g = gradient(n, 0);
  const int64_t frames = conn.push("w", 0, 0, reinterpret_cast<const std::byte*>(g.data()), n, 4,
                                   transport::ChunkKind::gradient);
  EXPECT_EQ(frames, (n * 4 + (256 << 10) - 1) / (256 << 10));
  EXPECT_EQ(frames, 47);
  conn.commit("w", 0);
  std::vector<float> u(static_cast<size_t>(n));
  ASSERT_TRUE(conn.wait_update("w", 0, reinterpret_cast<std::byte*>(u.data())));
  EXPECT_TRUE(same_bits(u, ref.step(g)));
  fs::remove_all(dir);
}

// A shm session holds a gradient chunk's push frame for the next write (client/push_batch.hpp):
// up to 1 MiB of chunks (kPushBatchBytes) or half the tx ring go in one write. A held frame must still go out
// before the pusher waits on the server: here one chunk, held, then a flush with no commit. The
// flush returns only once the server has read the chunk out of its slot, so a held frame that
// stayed behind would make it time out. The commit that follows then gives the bitwise step.
TEST(ClientApi, AHeldPushFrameGoesOutBeforeTheClientWaits) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--tx-slots", "8"});
  client::Connection conn(server.socket(), 0, 1, "batch test", 5000ms, 3000ms);
  auto reg = one_param("w", {8, 16});
  const int64_t n = 8 * 16;
  register_on(conn, reg);
  Reference ref(reg);
  const auto g = gradient(n, 0);
  ASSERT_EQ(conn.push("w", 0, 0, reinterpret_cast<const std::byte*>(g.data()), n, 4,
                      transport::ChunkKind::gradient),
            1);
  EXPECT_NO_THROW(conn.flush());
  conn.commit("w", 0);
  std::vector<float> u(static_cast<size_t>(n));
  ASSERT_TRUE(conn.wait_update("w", 0, reinterpret_cast<std::byte*>(u.data())));
  EXPECT_TRUE(same_bits(u, ref.step(g)));
  // Step 1 in three pushes, all three frames still held at the commit (a batch here is four):
  // the commit goes out behind them in the same write, never ahead.
  const auto g1 = gradient(n, 1);
  for (int64_t off = 0; off < n; off += 48) {
    conn.push("w", 1, off, reinterpret_cast<const std::byte*>(g1.data() + off),
              std::min<int64_t>(48, n - off), 4, transport::ChunkKind::gradient);
  }
  conn.commit("w", 1);
  ASSERT_TRUE(conn.wait_update("w", 1, reinterpret_cast<std::byte*>(u.data())));
  EXPECT_TRUE(same_bits(u, ref.step(g1)));
  fs::remove_all(dir);
}

TEST(ClientApi, Bf16GradientsAndUpdatesOnTheWire) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  client::Client c(config_for(server.socket()));
  auto reg = one_param("w", {16, 32}, transport::DType::bf16, transport::DType::bf16);
  c.register_parameters({reg});
  Reference ref(reg);
  for (int64_t s = 0; s < 2; ++s) {
    const auto g = gradient(512, s);
    std::vector<uint16_t> gb(g.size());
    std::vector<float> g_rounded(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      gb[i] = transport::f32_to_bf16(g[i]);
      g_rounded[i] = transport::bf16_to_f32(gb[i]);
    }
    c.push("w", s, 0, gb.data(), 512);
    c.commit("w", s);
    std::vector<uint16_t> ub(512);
    ASSERT_TRUE(c.wait_update("w", s, ub.data()));
    const auto u = ref.step(g_rounded);
    for (size_t i = 0; i < u.size(); ++i) ASSERT_EQ(ub[i], transport::f32_to_bf16(u[i])) << i;
  }
  fs::remove_all(dir);
}

// An update larger than the session's result ring (8 slots of 64 KiB here): the server narrows
// the chunks that find a free slot straight into it and stages the others until the client
// returns slots (daemon/egress/egress.cpp). Both kinds, in order, give the update bitwise, fp32
// and bf16 alike, over two steps.
TEST(ClientApi, AnUpdateLargerThanTheResultRingComesBackBitwise) {
  const auto dir = temp_dir();
  ServerProcess server(dir);  // 64 KiB slots, 8 rx slots: 512 KiB of ring
  client::Client c(config_for(server.socket()));
  auto f32 = one_param("f32", {512, 768});  // 1.5 MiB: 24 chunks
  auto bf16 = one_param("bf16", {512, 1024}, transport::DType::f32, transport::DType::bf16);
  c.register_parameters({f32, bf16});  // bf16: 1 MiB of updates, 16 chunks
  Reference ref_f32(f32), ref_bf16(bf16);
  for (int64_t s = 0; s < 2; ++s) {
    const auto g1 = gradient(512 * 768, s, 0, 1);
    const auto g2 = gradient(512 * 1024, s, 0, 2);
    c.push("f32", s, 0, g1.data(), 512 * 768);
    c.push("bf16", s, 0, g2.data(), 512 * 1024);
    c.commit("f32", s);
    c.commit("bf16", s);
    std::vector<float> u1(g1.size());
    std::vector<uint16_t> u2(g2.size());
    ASSERT_TRUE(c.wait_update("f32", s, u1.data()));
    ASSERT_TRUE(c.wait_update("bf16", s, u2.data()));
    EXPECT_TRUE(same_bits(u1, ref_f32.step(g1))) << "step " << s;
    const auto want2 = ref_bf16.step(g2);
    for (size_t i = 0; i < want2.size(); ++i) {
      ASSERT_EQ(u2[i], transport::f32_to_bf16(want2[i])) << "step " << s << " element " << i;
    }
  }
  fs::remove_all(dir);
}

TEST(ClientApi, ServerKilledFailsFastThenRestoreReconnectAndGoOnBitwise) {
  const auto dir = temp_dir();
  const std::string snap = (dir / "m.safetensors").string();
  auto reg = one_param("w", {24, 40});
  Reference ref(reg);
  auto server = std::make_unique<ServerProcess>(dir, std::vector<std::string>{"--snapshot", snap});
  client::Client c(config_for(server->socket()));
  c.register_parameters({reg});
  for (int64_t s = 0; s < 2; ++s) {
    const auto g = gradient(960, s);
    EXPECT_TRUE(same_bits(run_step(c, "w", s, g), ref.step(g)));
  }
  c.snapshot();
  server->kill9();
  const auto g2 = gradient(960, 2);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    c.push("w", 2, 0, g2.data(), 960);
    c.commit("w", 2);
    std::vector<float> u(960);
    c.wait_update("w", 2, u.data());
    FAIL() << "expected ConnectionLost";
  } catch (const client::ConnectionLost& e) {
    EXPECT_NE(std::string(e.what()).find(server->socket()), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);  // fail fast, not at the op timeout
  server = std::make_unique<ServerProcess>(dir, std::vector<std::string>{"--restore", snap});
  c.reconnect();
  EXPECT_TRUE(same_bits(run_step(c, "w", 2, g2), ref.step(g2)));
  fs::remove_all(dir);
}

TEST(ClientApi, CompletionCallbackFiresOncePerParameterAndStep) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  client::Client c(config_for(server.socket()));
  std::mutex mu;
  std::vector<std::pair<std::string, int64_t>> seen;
  c.set_update_callback([&](const std::string& name, int64_t step) {
    std::lock_guard lk(mu);
    seen.emplace_back(name, step);
  });
  c.register_parameters({one_param("a", {8, 16}), one_param("b", {16, 8})});
  for (int64_t s = 0; s < 2; ++s) {
    for (const char* name : {"a", "b"}) {
      const auto g = gradient(128, s);
      c.push(name, s, 0, g.data(), 128);
      c.commit(name, s);
    }
    std::vector<float> u(128);
    c.wait_update("a", s, u.data());
    c.wait_update("b", s, u.data());
  }
  // The callback runs on the client's reader thread, possibly just after wait_update returned.
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard lk(mu);
      if (seen.size() >= 4) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::lock_guard lk(mu);
  std::sort(seen.begin(), seen.end());
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"a", 0}, {"a", 1}, {"b", 0}, {"b", 1}};
  EXPECT_EQ(seen, expected);
  fs::remove_all(dir);
}

TEST(ClientApi, OtherUsersAreRefusedEvenWhenTheSocketIsOpenedUp) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  const auto dir = temp_dir();
  ServerProcess server(dir);
  // Simulate a careless chmod: the peer-credential check must still refuse uid 65534.
  fs::permissions(dir, fs::perms::all);
  fs::permissions(server.socket(), fs::perms::all);
  const pid_t child = fork();
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(10);
    try {
      client::ClientConfig cfg;
      cfg.servers = {server.socket()};
      cfg.connect_timeout = 2000ms;
      cfg.op_timeout = 2000ms;
      client::Client c(cfg);
      _exit(0);  // must not get here
    } catch (const client::ConnectionLost&) {
      _exit(3);  // the server closed the connection: refused
    } catch (...) {
      _exit(4);
    }
  }
  EXPECT_EQ(wait_exit(child, 20s), 3);
  // The server's own uid still gets in.
  client::Client c(config_for(server.socket()));
  EXPECT_TRUE(c.health().ready);
  fs::remove_all(dir);
}

TEST(ClientApi, MomentumOfAParameterThatNeverSteppedIsZerosAtStepMinusOne) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  client::Client c(config_for(server.socket()));
  c.register_parameters({one_param("w", {4, 4}), one_param("v", {4, 4})});
  int64_t last = 7;
  const auto m = c.fetch_momentum("w", &last);
  EXPECT_EQ(last, -1);
  for (float x : m) EXPECT_EQ(x, 0.0f);
  // A refused fetch (unknown name) fails that fetch only; the session and the other parameters
  // go on.
  EXPECT_THROW(c.fetch_momentum("nope"), InvalidArgument);  // refused locally: not registered
  const auto g = gradient(16, 0);
  EXPECT_EQ(run_step(c, "v", 0, g).size(), 16u);
  fs::remove_all(dir);
}

// A rank that pushes nothing to a parameter is not paced by the server: the contributing rank can
// run several steps ahead. Each complete update is kept until asked for (this once lost step 0 to
// step 1 and timed out: a flake of the empty-shard equivalence test), and one asked for after more
// than Connection::kMaxHeldUpdates later steps is refused with a reason, not awaited forever.
TEST(ClientApi, NonContributingRankGetsEveryStepEvenWhenItAsksLate) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  const auto cfg0 = config_for(server.socket(), transport::DataPlane::shm, 0, 2);
  const auto cfg1 = config_for(server.socket(), transport::DataPlane::shm, 1, 2);
  auto reg1 = one_param("w", {8, 16});
  auto reg0 = reg1;
  reg0.push.clear();  // rank 0 only receives
  client::Client c0(cfg0), c1(cfg1);
  std::thread t([&] { c0.register_parameters({reg0}); });
  c1.register_parameters({reg1});
  t.join();
  Reference ref(reg1);
  constexpr int64_t kSteps = 20;
  std::vector<std::vector<float>> expected;
  for (int64_t s = 0; s < kSteps; ++s) {
    const auto g = gradient(128, s);
    expected.push_back(ref.step(g));
    ASSERT_TRUE(same_bits(run_step(c1, "w", s, g), expected.back())) << "step " << s;
  }
  // All 20 updates have reached rank 0's connection (same server, sent in order) once the
  // last one is ready.
  for (int i = 0; i < 1000 && !c0.update_ready("w", kSteps - 1); ++i)
    std::this_thread::sleep_for(10ms);
  std::vector<float> u(128);
  // The oldest ones were dropped unread (16 are kept): a clear error, not a wait.
  EXPECT_THROW(c0.wait_update("w", 0, u.data()), InvalidArgument);
  for (int64_t s = kSteps - 16; s < kSteps; ++s) {
    ASSERT_TRUE(c0.update_ready("w", s)) << "step " << s;
    c0.wait_update("w", s, u.data());
    EXPECT_TRUE(same_bits(u, expected[s])) << "step " << s;
  }
  // And while it keeps up, asking late by a few steps loses nothing.
  for (int64_t s = kSteps; s < kSteps + 3; ++s) {
    const auto g = gradient(128, s);
    expected.push_back(ref.step(g));
    run_step(c1, "w", s, g);
  }
  for (int64_t s = kSteps; s < kSteps + 3; ++s) {
    c0.wait_update("w", s, u.data());
    EXPECT_TRUE(same_bits(u, expected[s])) << "step " << s;
  }
  fs::remove_all(dir);
}

// A rank whose shard of a parameter is empty (no push, no want) leaves its step() before the
// others have pushed: a momentum fetch it makes then, for a checkpoint, names the step it
// expects (after_step) and the server answers once that step is applied, with its momentum;
// a fetch for a step that never comes is answered after the step timeout with what the server
// holds (the caller compares the step). Found by test_dcp.py on 4 ranks: rank 3 read step 0's
// state, or "momentum requested while a step is computing".
TEST(ClientApi, MomentumFetchAfterAStepWaitsUntilTheServerAppliedIt) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--step-timeout-ms", "1500"});
  const auto cfg0 = config_for(server.socket(), transport::DataPlane::shm, 0, 2);
  const auto cfg1 = config_for(server.socket(), transport::DataPlane::shm, 1, 2);
  auto reg1 = one_param("w", {8, 16});
  auto reg0 = reg1;
  reg0.push.clear();  // an empty shard: rank 0 neither pushes nor wants
  reg0.want.clear();
  client::Client c0(cfg0), c1(cfg1);
  std::thread t([&] { c0.register_parameters({reg0}); });
  c1.register_parameters({reg1});
  t.join();
  Reference ref(reg1);
  std::atomic<bool> answered{false};
  int64_t last = -7;
  std::vector<float> fetched;
  std::thread fetcher([&] {
    fetched = c0.fetch_momentum("w", &last, /*after_step=*/0);
    answered = true;
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(answered) << "answered before step 0 was pushed (last step " << last << ")";
  const auto g = gradient(128, 0);
  ASSERT_TRUE(same_bits(run_step(c1, "w", 0, g), ref.step(g)));
  fetcher.join();
  EXPECT_EQ(last, 0);
  EXPECT_TRUE(same_bits(fetched, ref.momentum));
  // Step 1 never comes: the answer after the step timeout holds step 0, and the caller sees it.
  const auto t0 = std::chrono::steady_clock::now();
  fetched = c0.fetch_momentum("w", &last, /*after_step=*/1);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 1000ms);
  EXPECT_EQ(last, 0);
  EXPECT_TRUE(same_bits(fetched, ref.momentum));
  // Without after_step: what the server holds, at once.
  EXPECT_EQ((c0.fetch_momentum("w", &last), last), 0);
  fs::remove_all(dir);
}

// A try of a step that failed (here: a peer left mid-step) can still have chunks in flight when
// the server starts gathering the step again; a retry must not be summed onto them. Found by the
// soak driver: rank 0's late chunk [32, 64) of the dropped try was counted twice in the retried
// step. The retry carries a higher attempt number and the server starts rank 0 over.
TEST(ClientApi, RetriedStepIsNotSummedOntoChunksOfTheFailedTry) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  const auto cfg0 = config_for(server.socket(), transport::DataPlane::shm, 0, 2);
  const auto cfg1 = config_for(server.socket(), transport::DataPlane::shm, 1, 2);
  const auto reg = one_param("w", {8, 8});
  auto c0 = std::make_unique<client::Client>(cfg0);
  auto c1 = std::make_unique<client::Client>(cfg1);
  auto register_both = [&] {
    std::thread t([&] { c0->register_parameters({reg}); });
    c1->register_parameters({reg});
    t.join();
  };
  register_both();
  std::vector<float> g0(64), g1(64);
  for (int64_t i = 0; i < 64; ++i) {
    g0[i] = grad_value(0, 0, 0, i);
    g1[i] = grad_value(0, 0, 1, i);
  }
  c0->push("w", 0, 0, g0.data(), 32);  // rank 0's first half of step 0
  c1->push("w", 0, 0, g1.data(), 8);
  c1.reset();  // rank 1 leaves mid-step: the server drops step 0
  c1 = std::make_unique<client::Client>(cfg1);
  c1->register_parameters({reg});            // answered: every rank is connected again
  c0->push("w", 0, 32, g0.data() + 32, 32);  // late: starts step 0 again on the server
  std::vector<float> u0(64), u1(64);
  EXPECT_THROW(c0->wait_update("w", 0, u0.data()), client::ServerError);  // peer_lost
  // The retry of step 0, whole, by both ranks.
  c0->push("w", 0, 0, g0.data(), 64);
  c0->commit("w", 0);
  c1->push("w", 0, 0, g1.data(), 64);
  c1->commit("w", 0);
  c0->wait_update("w", 0, u0.data());
  c1->wait_update("w", 0, u1.data());
  std::vector<float> sum(64);
  for (int64_t i = 0; i < 64; ++i) sum[i] = g0[i] + g1[i];  // rank order: 0 then 1
  Reference ref(reg);
  const auto expected = ref.step(sum);
  EXPECT_TRUE(same_bits(u0, expected));
  EXPECT_TRUE(same_bits(u1, expected));
  fs::remove_all(dir);
}

// A rank's own wait for an update may run out before the server's step timeout (a client
// timeout shorter than --step-timeout-ms): the Timeout then says what the server still waits for,
// from its status, and nothing is lost: the step completes once the missing rank comes.
TEST(ClientApi, AnUpdateWaitThatRunsOutNamesTheRanksTheServerStillWaitsFor) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--step-timeout-ms", "60000"});
  auto cfg0 = config_for(server.socket(), transport::DataPlane::shm, 0, 2);
  cfg0.op_timeout = 600ms;
  const auto cfg1 = config_for(server.socket(), transport::DataPlane::shm, 1, 2);
  const auto reg = one_param("w", {8, 16});
  client::Client c0(cfg0), c1(cfg1);
  std::thread t([&] { c0.register_parameters({reg}); });
  c1.register_parameters({reg});
  t.join();
  const auto g0 = gradient(128, 0, 0), g1 = gradient(128, 0, 1);
  c0.push("w", 0, 0, g0.data(), 128);
  c0.commit("w", 0);
  std::vector<float> u(128);
  try {
    c0.wait_update("w", 0, u.data());
    FAIL() << "expected a timeout";
  } catch (const client::Timeout& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the server is gathering its step 0 since"), std::string::npos) << msg;
    EXPECT_NE(msg.find("still waits for ranks 1 of the job's 2"), std::string::npos) << msg;
  }
  c1.push("w", 0, 0, g1.data(), 128);
  c1.commit("w", 0);
  c0.wait_update("w", 0, u.data());
  std::vector<float> u1(128);
  c1.wait_update("w", 0, u1.data());
  EXPECT_TRUE(same_bits(u, u1));
  fs::remove_all(dir);
}

TEST(ClientApi, RegistrationTimeoutSaysWhyTheMissingRankWasRefused) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--step-timeout-ms", "1500"});
  client::Connection r0(server.socket(), 0, 2, "api test 0", 5000ms, 20000ms);
  client::Connection r1(server.socket(), 1, 2, "api test 1", 5000ms, 20000ms);
  auto reg = one_param("w", {16, 24});
  const auto m = client::register_message(reg);
  auto other = m;
  other.shape = {24, 16};
  // Rank 0 registers [16, 24], rank 1 [24, 16], over two sockets: whichever registration the
  // server reads first is the first registrant, so the order is not the test's to choose. The
  // second is refused at once with the reason; the first waits for the other rank and its
  // timeout names that rank and why it never registered.
  const auto sent0 = r0.send_register(m);
  const auto sent1 = r1.send_register(other);
  struct Outcome {
    std::string code, message;
  };
  auto outcome = [](auto&& wait) {
    try {
      wait();
    } catch (const client::ServerError& e) {
      return Outcome{std::string(error_code_name(e.code)), e.what()};
    }
    return Outcome{"none", "answered without an error"};
  };
  const Outcome o1 = outcome([&] { r1.wait_register(sent1, "w"); });
  const Outcome o0 = outcome([&] { r0.wait_register(sent0, "w"); });
  const bool rank1_refused = o1.code == "bad_request";
  const Outcome& refused = rank1_refused ? o1 : o0;
  const Outcome& waited = rank1_refused ? o0 : o1;
  const int refused_rank = rank1_refused ? 1 : 0;
  EXPECT_EQ(refused.code, "bad_request") << refused.message;
  EXPECT_NE(refused.message.find("differs from the first registrant's in shape"),
            std::string::npos)
      << refused.message;
  EXPECT_EQ(waited.code, "timeout") << waited.message;
  const std::string needle =
      "rank " + std::to_string(refused_rank) + "'s registration was refused: parameter 'w'";
  EXPECT_NE(waited.message.find(needle), std::string::npos) << waited.message;
  fs::remove_all(dir);
}

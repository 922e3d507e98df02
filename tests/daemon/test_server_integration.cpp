// muon-offloadd end to end with real processes: a real server on a Unix socket, real client
// processes on shared memory. Updates are compared bitwise with the same kernels run in process
// on the reduced gradient.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "transport/asio.hpp"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "client_runs.hpp"
#include "kernels/device_probe.hpp"
#include "process.hpp"
#include "require_gpu.hpp"
#include "scenario.hpp"
#include "server_process.hpp"
#include "transport/frame.hpp"
#include "transport/messages.hpp"
#include "transport/shm_segment.hpp"

using namespace muon;
using namespace muon::testing;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

int count_segments_mapped(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find("/dev/shm/muon-") != std::string::npos;
  return n;
}

struct EquivalenceCase {
  int world;
  std::string mode;
};

class Equivalence : public ::testing::TestWithParam<EquivalenceCase> {};

}  // namespace

TEST_P(Equivalence, UpdatesAreBitwiseEqualToInProcessKernels) {
  const auto& c = GetParam();
  const auto dir = temp_dir();
  ServerProcess server(dir);
  std::vector<ClientRun> runs;
  for (int r = 0; r < c.world; ++r) {
    runs.push_back(start_client(dir, {server.socket()}, r, c.world, c.mode, {"--steps", "3"}));
  }
  for (auto& run : runs) ASSERT_EQ(wait_exit(run.pid, 120s), 0) << read_err(run.out).message;
  const auto ref = reference_updates(c.mode, c.world, 3, kThreads);
  for (int r = 0; r < c.world; ++r)
    expect_bitwise(runs[r].out, ref, 0, 3, "rank " + std::to_string(r));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Sharding, Equivalence,
    ::testing::Values(EquivalenceCase{1, "replicated"}, EquivalenceCase{2, "replicated"},
                      EquivalenceCase{2, "rows"}, EquivalenceCase{2, "flat_uneven"},
                      EquivalenceCase{2, "empty"}, EquivalenceCase{4, "rows"},
                      EquivalenceCase{4, "flat_uneven"}, EquivalenceCase{4, "empty"},
                      EquivalenceCase{4, "halves"}, EquivalenceCase{4, "replicated"}),
    [](const auto& info) { return std::to_string(info.param.world) + "_" + info.param.mode; });

// The GPU data plane end to end: a server on the CUDA backend (device reduction, device Muon
// step), two rank processes on CUDA IPC pushing from and receiving into device memory, updates
// bitwise equal to the CUDA backend run in process on the same reduced gradients. In the
// replicated job rank 1 stays on shm with host buffers: both planes served by one GPU server.
TEST(ServerIntegrationGpu, RankProcessesOverCudaIpcAreBitwiseTheCudaKernels) {
  REQUIRE_GPU();
  const auto dir = temp_dir();
  for (const std::string mode : {"flat_uneven", "replicated"}) {
    ServerProcess server(dir, {"--backend", "cuda"}, "gpu_" + mode);  // fresh momentum per job
    std::vector<ClientRun> runs;
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> extra = {"--steps", "3"};
      if (r == 0 || mode == "flat_uneven") {  // replicated: rank 1 stays on shm, host buffers
        extra.insert(extra.end(), {"--data-plane", "cuda_ipc", "--device-buffers"});
      }
      runs.push_back(start_client(dir, {server.socket()}, r, 2, mode, extra));
    }
    for (auto& run : runs) ASSERT_EQ(wait_exit(run.pid, 120s), 0) << read_err(run.out).message;
    const auto ref = reference_updates(mode, 2, 3, kThreads, -1, 0, "cuda");
    for (int r = 0; r < 2; ++r) {
      expect_bitwise(runs[r].out, ref, 0, 3, mode + " rank " + std::to_string(r));
    }
  }
  fs::remove_all(dir);
}

// gpu-review F2 / issue 19: a cuda_ipc rank killed mid-push (its ready events recorded on the
// server's receive stream, some never to come) must not wedge the server. The other rank gets
// peer_lost naming it well before the step timeout, the server still answers, and a rerun of
// the lost step by both ranks over cuda_ipc is bitwise the uninterrupted run.
TEST(ServerIntegrationGpu, CudaIpcRankKilledMidPushLeavesTheServerServing) {
  REQUIRE_GPU();
  const auto dir = temp_dir();
  const std::string mode = "flat_uneven";
  const std::vector<std::string> ipc = {"--data-plane", "cuda_ipc", "--device-buffers"};
  const auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), ipc.begin(), ipc.end());
    return args;
  };
  ServerProcess server(dir, {"--backend", "cuda", "--step-timeout-ms", "20000"}, "gpu_kill");
  const auto t0 = std::chrono::steady_clock::now();
  auto r0 = start_client(dir, {server.socket()}, 0, 2, mode, with({"--steps", "2"}));
  auto r1 = start_client(dir, {server.socket()}, 1, 2, mode,
                         with({"--steps", "2", "--die-at-step", "1"}));
  EXPECT_EQ(wait_exit(r1.pid, 120s), 9);
  EXPECT_EQ(wait_exit(r0.pid, 120s), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 60s);  // not the step timeout, not a hang
  const auto err = read_err(r0.out);
  EXPECT_EQ(err.code, "peer_lost") << err.message;
  EXPECT_NE(err.message.find("rank 1"), std::string::npos) << err.message;
  ASSERT_TRUE(alive(server.pid()));
  auto a0 = start_client(dir, {server.socket()}, 0, 2, mode,
                         with({"--start-step", "1", "--steps", "2"}));
  auto a1 = start_client(dir, {server.socket()}, 1, 2, mode,
                         with({"--start-step", "1", "--steps", "2"}));
  ASSERT_EQ(wait_exit(a0.pid, 120s), 0) << read_err(a0.out).message;
  ASSERT_EQ(wait_exit(a1.pid, 120s), 0) << read_err(a1.out).message;
  const auto ref = reference_updates(mode, 2, 3, kThreads, -1, 0, "cuda");
  expect_bitwise(a0.out, ref, 1, 2, "rank 0 after the loss");
  expect_bitwise(a1.out, ref, 1, 2, "rank 1 after the loss");
  fs::remove_all(dir);
}

TEST(ServerIntegration, SnapshotKillRestartIsBitwiseEqualToAnUninterruptedRun) {
  const auto dir = temp_dir();
  const std::string snap = (dir / "momentum.safetensors").string();
  const int world = 2;
  {
    ServerProcess server(dir, {"--snapshot", snap});
    auto r0 = start_client(dir, {server.socket()}, 0, world, "rows",
                           {"--steps", "2", "--snapshot", snap});
    auto r1 = start_client(dir, {server.socket()}, 1, world, "rows", {"--steps", "2"});
    ASSERT_EQ(wait_exit(r0.pid, 60s), 0) << read_err(r0.out).message;
    ASSERT_EQ(wait_exit(r1.pid, 60s), 0) << read_err(r1.out).message;
    server.kill9();  // no final snapshot: the restart must rely on the one requested above
  }
  ASSERT_TRUE(fs::exists(snap));
  ServerProcess restarted(dir, {"--restore", snap});
  auto r0 = start_client(dir, {restarted.socket()}, 0, world, "rows",
                         {"--start-step", "2", "--steps", "3"});
  auto r1 = start_client(dir, {restarted.socket()}, 1, world, "rows",
                         {"--start-step", "2", "--steps", "3"});
  ASSERT_EQ(wait_exit(r0.pid, 60s), 0) << read_err(r0.out).message;
  ASSERT_EQ(wait_exit(r1.pid, 60s), 0) << read_err(r1.out).message;
  const auto ref = reference_updates("rows", world, 5, kThreads);
  expect_bitwise(r0.out, ref, 2, 3, "rank 0 after restart");
  expect_bitwise(r1.out, ref, 2, 3, "rank 1 after restart");
  fs::remove_all(dir);
}

TEST(ServerIntegration, KilledClientGivesOthersAClearErrorAndLosesNothing) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--step-timeout-ms", "20000"});
  const int world = 2;
  const auto t0 = std::chrono::steady_clock::now();
  auto r0 = start_client(dir, {server.socket()}, 0, world, "rows", {"--steps", "2"});
  auto r1 = start_client(dir, {server.socket()}, 1, world, "rows",
                         {"--steps", "2", "--die-at-step", "1"});
  EXPECT_EQ(wait_exit(r1.pid, 60s), 9);
  EXPECT_EQ(wait_exit(r0.pid, 60s), 3);
  // Well before the 20 s step timeout: the loss is noticed from the closed socket.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  const auto err = read_err(r0.out);
  EXPECT_EQ(err.code, "peer_lost") << err.message;
  EXPECT_EQ(err.rank, 1) << err.message;
  EXPECT_NE(err.message.find("rank 1"), std::string::npos) << err.message;
  // The server is still up and has unmapped the lost client's shared memory.
  EXPECT_TRUE(alive(server.pid()));
  for (int i = 0; i < 500 && count_segments_mapped(server.pid()) > 0; ++i) {
    std::this_thread::sleep_for(10ms);  // the server notices both closed sockets
  }
  EXPECT_EQ(count_segments_mapped(server.pid()), 0);
  // Nothing of step 1 reached the momentum: rerunning step 1 (and 2) with both ranks gives the
  // uninterrupted run's updates.
  auto a0 =
      start_client(dir, {server.socket()}, 0, world, "rows", {"--start-step", "1", "--steps", "2"});
  auto a1 =
      start_client(dir, {server.socket()}, 1, world, "rows", {"--start-step", "1", "--steps", "2"});
  ASSERT_EQ(wait_exit(a0.pid, 60s), 0) << read_err(a0.out).message;
  ASSERT_EQ(wait_exit(a1.pid, 60s), 0) << read_err(a1.out).message;
  const auto ref = reference_updates("rows", world, 3, kThreads);
  expect_bitwise(a0.out, ref, 1, 2, "rank 0 after the loss");
  fs::remove_all(dir);
}

TEST(ServerIntegration, RankThatNeverPushesTimesOutWithItsName) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--step-timeout-ms", "1000"});
  auto r0 = start_client(dir, {server.socket()}, 0, 2, "rows", {"--steps", "1"});
  auto r1 = start_client(dir, {server.socket()}, 1, 2, "rows",
                         {"--steps", "1", "--skip-param", "blocks.0.mlp.w2"});
  EXPECT_EQ(wait_exit(r0.pid, 30s), 3);
  EXPECT_EQ(wait_exit(r1.pid, 30s), 3);
  for (const auto& run : {r0, r1}) {
    const auto err = read_err(run.out);
    EXPECT_EQ(err.code, "timeout") << err.message;
    EXPECT_EQ(err.param, "blocks.0.mlp.w2");
    EXPECT_NE(err.message.find("ranks [1]"), std::string::npos) << err.message;
  }
  fs::remove_all(dir);
}

TEST(ServerIntegration, NanGradientIsRefusedNamingTheParameter) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  auto r0 =
      start_client(dir, {server.socket()}, 0, 2, "rows", {"--steps", "2", "--nan-at-step", "1"});
  auto r1 = start_client(dir, {server.socket()}, 1, 2, "rows", {"--steps", "2"});
  EXPECT_EQ(wait_exit(r0.pid, 30s), 3);
  EXPECT_EQ(wait_exit(r1.pid, 30s), 3);
  for (const auto& run : {r0, r1}) {
    const auto err = read_err(run.out);
    EXPECT_EQ(err.code, "non_finite") << err.message;
    EXPECT_EQ(err.param, "blocks.0.mlp.w1");
    EXPECT_NE(err.message.find("blocks.0.mlp.w1"), std::string::npos) << err.message;
  }
  // Step 0 went through untouched by the refusal.
  const auto ref = reference_updates("rows", 2, 1, kThreads);
  expect_bitwise(r0.out, ref, 0, 1, "rank 0 step 0");
  fs::remove_all(dir);
}

TEST(ServerIntegration, TwoServersSideBySideOwnHalfTheParametersEach) {
  const auto dir = temp_dir();
  ServerProcess a(dir, {}, "a");
  ServerProcess b(dir, {}, "b");
  auto r0 = start_client(dir, {a.socket(), b.socket()}, 0, 2, "flat_uneven",
                         {"--steps", "2", "--split-servers"});
  auto r1 = start_client(dir, {a.socket(), b.socket()}, 1, 2, "flat_uneven",
                         {"--steps", "2", "--split-servers"});
  ASSERT_EQ(wait_exit(r0.pid, 60s), 0) << read_err(r0.out).message;
  ASSERT_EQ(wait_exit(r1.pid, 60s), 0) << read_err(r1.out).message;
  const auto ref = reference_updates("flat_uneven", 2, 2, kThreads);
  expect_bitwise(r0.out, ref, 0, 2, "rank 0");
  expect_bitwise(r1.out, ref, 0, 2, "rank 1");
  fs::remove_all(dir);
}

TEST(ServerIntegration, MalformedFramesHurtOnlyTheirSender) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  // A real job runs while abusive peers talk to the same server.
  auto r0 = start_client(dir, {server.socket()}, 0, 1, "replicated", {"--steps", "3"});
  using transport::MessageType;
  auto frame = [](MessageType t, const std::string& payload) {
    return transport::encode_frame({static_cast<uint16_t>(t), 7, payload});
  };
  auto expect_error = [&](const std::vector<std::byte>& bytes, const std::string& needle) {
    auto f = ServerProcess::roundtrip(server.socket(), bytes);
    ASSERT_EQ(f.type, static_cast<uint16_t>(MessageType::error));
    auto e = transport::decode<transport::ErrorMsg>(f.payload);
    EXPECT_NE(e.message.find(needle), std::string::npos) << e.message;
  };
  std::vector<std::byte> garbage(64, std::byte{0x41});
  expect_error(garbage, "bad frame magic");
  auto v1 = frame(MessageType::health, "{}");
  v1[4] = std::byte{1};  // version 1: JSON data chunks named by parameter name
  expect_error(v1, "protocol version mismatch: peer speaks 1");
  auto huge = frame(MessageType::health, "{}");
  huge[8] = std::byte{0};
  huge[9] = std::byte{0};
  huge[10] = std::byte{0};
  huge[11] = std::byte{0x10};  // 256 MiB
  expect_error(huge, "exceeds the limit");
  expect_error(frame(MessageType::push, R"({"name":"x","step":0,"offset":0,"count":1,"slot":0})"),
               "before hello");
  expect_error(frame(MessageType::hello, R"({"rank": 5, "world_size": 2})"), "'rank' = 5");
  expect_error(frame(MessageType::hello, "{not json"), "not valid JSON");
  expect_error(frame(static_cast<MessageType>(999), "{}"), "before hello");
  ASSERT_EQ(wait_exit(r0.pid, 60s), 0) << read_err(r0.out).message;
  expect_bitwise(r0.out, reference_updates("replicated", 1, 3, kThreads), 0, 3, "rank 0");
  fs::remove_all(dir);
}

// A push naming a parameter id its session was never handed (chunk_header.hpp) is answered
// bad_request naming the id, and its slot is released all the same (no credit lost: the slot's
// counter in the segment advances, and the pusher that asked to be woken gets one push_ack
// naming kWakeSlot); the session goes on (health answers after it).
TEST(ServerIntegration, APushNamingAnUnknownParameterIdLosesNothing) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  using transport::MessageType;
  boost::asio::io_context io;
  boost::asio::generic::stream_protocol::socket sock(io);
  sock.connect(transport::resolve(transport::parse_endpoint(server.socket()), io));
  transport::FrameDecoder dec;
  const auto send = [&](MessageType t, uint32_t id, const std::string& payload) {
    boost::asio::write(sock, boost::asio::buffer(transport::encode_frame(
                                 {static_cast<uint16_t>(t), id, payload})));
  };
  const auto next = [&] {
    std::array<std::byte, 4096> buf;
    for (;;) {
      if (auto f = dec.next()) return *f;
      const size_t n = sock.read_some(boost::asio::buffer(buf));
      dec.feed(buf.data(), n);
    }
  };
  send(MessageType::hello, 1, R"({"rank": 0, "world_size": 1})");
  const auto ok_frame = next();
  ASSERT_EQ(ok_frame.type, static_cast<uint16_t>(MessageType::hello_ok)) << ok_frame.payload;
  const auto ok = transport::decode<transport::HelloOk>(ok_frame.payload);
  const auto segment = transport::ShmSegment::open_and_unlink(
      ok.shm_name, transport::SegmentLayout{ok.tx_slots, ok.rx_slots, ok.slot_bytes});
  auto credits = segment.tx_credits();
  ASSERT_EQ(credits.released(0), 0u);
  credits.ask_wake();  // as a pusher that found no free slot and sleeps
  transport::Push push;
  push.param_id = 5;
  push.count = 1;
  push.slot = 0;
  send(MessageType::push, 0, transport::encode(push));
  bool woken = false, refused = false;
  for (int i = 0; i < 2; ++i) {
    const auto f = next();
    if (f.type == static_cast<uint16_t>(MessageType::push_ack)) {
      EXPECT_EQ(transport::decode<transport::SlotAck>(f.payload).slot, transport::kWakeSlot);
      woken = true;
    } else {
      ASSERT_EQ(f.type, static_cast<uint16_t>(MessageType::error)) << f.payload;
      const auto e = transport::decode<transport::ErrorMsg>(f.payload);
      EXPECT_EQ(e.code, ErrorCode::bad_request);
      EXPECT_NE(e.message.find("parameter id 5, which this session never handed out"),
                std::string::npos)
          << e.message;
      refused = true;
    }
  }
  EXPECT_TRUE(woken);
  EXPECT_TRUE(refused);
  EXPECT_EQ(credits.released(0), 1u);  // before the wake frame was sent
  EXPECT_EQ(credits.released(1), 0u);
  send(MessageType::health, 2, "{}");
  EXPECT_EQ(next().type, static_cast<uint16_t>(MessageType::health_ok));
  fs::remove_all(dir);
}

// The TCP control plane admits only a hello with the server's token: a wrong or missing token is
// answered "unauthorized" and the connection closed; nothing but health answers before hello
// (status names parameters); the right token gets hello_ok (shm on this host).
TEST(ServerIntegration, TcpControlPlaneNeedsTheToken) {
  const auto dir = temp_dir();
  const std::string token = "0123456789abcdef-secret";
  const auto file = write_token_file(dir, token);
  const uint16_t port = free_tcp_port();
  const std::string tcp = "tcp://127.0.0.1:" + std::to_string(port);
  ServerProcess server(
      dir, {"--listen", "127.0.0.1:" + std::to_string(port), "--auth-token-file", file});
  using transport::MessageType;
  const auto frame = [](MessageType t, const std::string& payload) {
    return transport::encode_frame({static_cast<uint16_t>(t), 7, payload});
  };
  const auto expect_refused = [&](const std::string& hello, const std::string& needle) {
    const auto f = ServerProcess::roundtrip(tcp, frame(MessageType::hello, hello));
    ASSERT_EQ(f.type, static_cast<uint16_t>(MessageType::error)) << f.payload;
    const auto e = transport::decode<transport::ErrorMsg>(f.payload);
    EXPECT_EQ(e.code, ErrorCode::unauthorized);
    EXPECT_NE(e.message.find(needle), std::string::npos) << e.message;
  };
  expect_refused(R"({"rank": 0, "world_size": 1})", "token");
  // The token is checked first: a peer without it learns nothing of the job (not even that the
  // world size is wrong once a job runs).
  ServerProcess::roundtrip(server.socket(),
                           frame(MessageType::hello, R"({"rank": 0, "world_size": 1})"));
  expect_refused(R"({"rank": 5, "world_size": 9})", "token");
  expect_refused(R"({"rank": 0, "world_size": 1, "token": "0123456789abcdef-secreT"})", "token");
  // status before hello: refused over TCP (it names parameters), answered on the Unix socket.
  EXPECT_EQ(ServerProcess::roundtrip(tcp, frame(MessageType::status, "{}")).type,
            static_cast<uint16_t>(MessageType::error));
  EXPECT_EQ(ServerProcess::roundtrip(server.socket(), frame(MessageType::status, "{}")).type,
            static_cast<uint16_t>(MessageType::status_ok));
  // A bad request before hello gets its answer, then the connection is closed.
  {
    boost::asio::io_context io;
    boost::asio::ip::tcp::socket sock(io);
    sock.connect({boost::asio::ip::make_address("127.0.0.1"), port});
    boost::asio::write(sock, boost::asio::buffer(frame(MessageType::hello, "{not json")));
    std::array<std::byte, 4096> buf;
    boost::system::error_code ec;
    size_t total = 0;
    for (int i = 0; i < 100 && !ec; ++i) total += sock.read_some(boost::asio::buffer(buf), ec);
    EXPECT_GT(total, 0u);                                    // the error frame
    EXPECT_EQ(ec, boost::asio::error::eof) << ec.message();  // then the server closed
  }
  // health answers; the right token gets a session.
  EXPECT_EQ(ServerProcess::roundtrip(tcp, frame(MessageType::health, "{}")).type,
            static_cast<uint16_t>(MessageType::health_ok));
  const auto ok = ServerProcess::roundtrip(
      tcp,
      frame(MessageType::hello, R"({"rank": 0, "world_size": 1, "token": ")" + token + R"("})"));
  ASSERT_EQ(ok.type, static_cast<uint16_t>(MessageType::hello_ok)) << ok.payload;
  EXPECT_EQ(transport::decode<transport::HelloOk>(ok.payload).data_plane,
            transport::DataPlane::shm);
  fs::remove_all(dir);
}

// --listen without a token file, or with one others can read, is refused at start with the
// reason; nothing listens.
TEST(ServerIntegration, TcpControlPlaneRefusesToStartWithoutAPrivateToken) {
  const auto dir = temp_dir();
  const std::string listen = "127.0.0.1:" + std::to_string(free_tcp_port());
  const auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {MUON_OFFLOADD, "--socket", (dir / "t.sock").string(),
                                     "--log-level", "warn"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto err = dir / "stderr.txt";
    const pid_t pid = spawn(argv, err.string());
    const auto rc = wait_exit(pid, 20s);
    std::ifstream f(err);
    return std::make_pair(rc, std::string(std::istreambuf_iterator<char>(f), {}));
  };
  auto [rc1, err1] = run({"--listen", listen});
  EXPECT_EQ(rc1, 1);
  EXPECT_NE(err1.find("needs --auth-token-file"), std::string::npos) << err1;
  const auto open_file =
      write_token_file(dir, "0123456789abcdef-secret",
                       fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_read);
  auto [rc2, err2] = run({"--listen", listen, "--auth-token-file", open_file});
  EXPECT_EQ(rc2, 1);
  EXPECT_NE(err2.find("group or others"), std::string::npos) << err2;
  fs::remove_all(dir);
}

TEST(ServerIntegration, SocketIsPrivate) {
  const auto dir = temp_dir();
  const auto sock_dir = dir / "run";
  ServerProcess server(sock_dir, {}, "private");
  struct stat st {};
  ASSERT_EQ(stat(server.socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(sock_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  fs::remove_all(dir);
}

TEST(ServerIntegration, SigtermWritesTheFinalSnapshotAndExitsCleanly) {
  const auto dir = temp_dir();
  const std::string snap = (dir / "final.safetensors").string();
  ServerProcess server(dir, {"--snapshot", snap});
  auto r0 = start_client(dir, {server.socket()}, 0, 1, "replicated", {"--steps", "2"});
  ASSERT_EQ(wait_exit(r0.pid, 60s), 0) << read_err(r0.out).message;
  EXPECT_EQ(server.terminate(), 0);
  EXPECT_TRUE(fs::exists(snap));
  EXPECT_FALSE(fs::exists(server.socket()));
  fs::remove_all(dir);
}

TEST(ServerIntegration, SessionMemoryIsMappedWhileConnectedAndReclaimedAfter) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  {
    client::ClientConfig cfg;
    cfg.servers = {server.socket()};
    client::Client c(cfg);
    EXPECT_EQ(c.health().ready, true);
    EXPECT_EQ(count_segments_mapped(server.pid()), 1);  // the session's rings
    // Nobody else can open it: the name was unlinked once both sides mapped it.
    std::ifstream maps("/proc/" + std::to_string(server.pid()) + "/maps");
    std::string line, name, mapped;
    while (std::getline(maps, line)) {
      if (auto at = line.find("/dev/shm/muon-"); at != std::string::npos) {
        name = line.substr(at, line.find(' ', at) - at);
        mapped = line;
      }
    }
    ASSERT_FALSE(name.empty());
    EXPECT_NE(mapped.find("(deleted)"), std::string::npos) << mapped;
    EXPECT_FALSE(fs::exists(name)) << name;
  }
  for (int i = 0; i < 500 && count_segments_mapped(server.pid()) > 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(count_segments_mapped(server.pid()), 0);
  fs::remove_all(dir);
}

TEST(ServerIntegration, RestoreAtAnotherNumberOfRanks) {
  // 2 ranks for steps 0-1, snapshot, kill; 4 ranks from the restored momentum for steps 2-4.
  const auto dir = temp_dir();
  const std::string snap = (dir / "momentum.safetensors").string();
  {
    ServerProcess server(dir, {"--snapshot", snap});
    auto r0 =
        start_client(dir, {server.socket()}, 0, 2, "rows", {"--steps", "2", "--snapshot", snap});
    auto r1 = start_client(dir, {server.socket()}, 1, 2, "rows", {"--steps", "2"});
    ASSERT_EQ(wait_exit(r0.pid, 60s), 0) << read_err(r0.out).message;
    ASSERT_EQ(wait_exit(r1.pid, 60s), 0) << read_err(r1.out).message;
    server.kill9();
  }
  ServerProcess restarted(dir, {"--restore", snap});
  std::vector<ClientRun> runs;
  for (int r = 0; r < 4; ++r) {
    runs.push_back(start_client(dir, {restarted.socket()}, r, 4, "rows",
                                {"--start-step", "2", "--steps", "3"}));
  }
  for (auto& run : runs) ASSERT_EQ(wait_exit(run.pid, 60s), 0) << read_err(run.out).message;
  const auto ref =
      reference_updates("rows", 2, 5, kThreads, /*resize_at_step=*/2, /*world_after=*/4);
  for (int r = 0; r < 4; ++r) expect_bitwise(runs[r].out, ref, 2, 3, "rank " + std::to_string(r));
  fs::remove_all(dir);
}

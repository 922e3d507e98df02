// GPU scenarios of issue 19 (gpu-review F1, F4, F7, F10) with real server and rank processes:
// what only a GPU can show, run by scripts/gpu_check.sh's `scenarios` stage (labels gpu,
// gpu_scenarios). Each skips with the reason where no GPU is usable (or, for NCCL, where NCCL
// refuses two ranks on one GPU). Updates are compared bitwise with the CUDA backend run in this
// process on the same reduced gradients (scenario.hpp); no timing is asserted beyond "well
// before the step timeout", which tells a hang from an answer.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

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


std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

const std::vector<std::string> kCudaIpc = {"--data-plane", "cuda_ipc", "--device-buffers"};
const std::vector<std::string> kNccl = {"--data-plane", "nccl", "--device-buffers"};

// One GPU: server and nccl ranks on GPU 0 are two NCCL "hosts" joined over loopback sockets
// (NCCL refuses two ranks of one communicator on one GPU of one host). The server inherits its
// host id at start, the ranks theirs (set before each is started).
void nccl_host(const char* id) {
  setenv("NCCL_HOSTID", id, 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("NCCL_IB_DISABLE", "1", 1);
}

// True when the rank exited because NCCL would not form its session's communicators here.
bool nccl_refused(int exit_code, const ErrFile& err) {
  return exit_code == 4 && err.message.find("ncclCommInitRankConfig") != std::string::npos;
}

}  // namespace

// gpu-review F1 / F4 / F10: an nccl rank gone (SIGKILL-like _exit) right after committing a step,
// so the server's ncclSends of that step's update chunks are posted (or about to be) towards a
// peer that will never receive them, while a cuda_ipc rank of the same job waits for its own
// update of the step. The server must not hang on them: its io thread posts a send only after
// the update frame is written and never waits for a send; the return stream waits only for the
// copy into the nccl rank's slot, not for its send. So the cuda_ipc rank gets its update of the
// step, then peer_lost naming the nccl rank at its next push, well before the step timeout; the
// server still answers; and a rerun of the next step by both ranks (the nccl one on a fresh
// session) is bitwise the CUDA kernels.
TEST(GpuScenario, NcclRankGoneWithItsUpdatesInFlightLeavesTheServerServing) {
  REQUIRE_GPU();
  const auto dir = temp_dir();
  const std::string mode = "flat_uneven";
  nccl_host("muon-offload-scenario-server");
  ServerProcess server(dir, {"--backend", "cuda", "--step-timeout-ms", "20000"}, "gpu_nccl_gone");
  nccl_host("muon-offload-scenario-rank");
  const auto t0 = std::chrono::steady_clock::now();
  auto r0 = start_client(dir, {server.socket()}, 0, 2, mode,
                         with({"--steps", "3", "--exit-after-commit-at-step", "1"}, kNccl));
  auto r1 = start_client(dir, {server.socket()}, 1, 2, mode, with({"--steps", "3"}, kCudaIpc));
  const int rc0 = wait_exit(r0.pid, 120s).value_or(-1);
  if (nccl_refused(rc0, read_err(r0.out))) {
    wait_exit(r1.pid, 60s);
    GTEST_SKIP() << "NCCL refused the session's communicators on this machine: "
                 << read_err(r0.out).message;
  }
  EXPECT_EQ(rc0, 9) << read_err(r0.out).message;
  EXPECT_EQ(wait_exit(r1.pid, 120s), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 60s);  // not the step timeout, not a hang
  const auto err = read_err(r1.out);
  EXPECT_EQ(err.code, "peer_lost") << err.message;
  EXPECT_EQ(err.rank, 0) << err.message;
  const auto ref = reference_updates(mode, 2, 3, kThreads, -1, 0, "cuda");
  expect_bitwise(r1.out, ref, 0, 2, "the cuda_ipc rank, steps 0-1 (its peer gone after step 1)");
  ASSERT_TRUE(alive(server.pid()));
  auto a0 = start_client(dir, {server.socket()}, 0, 2, mode,
                         with({"--start-step", "2", "--steps", "1"}, kNccl));
  auto a1 = start_client(dir, {server.socket()}, 1, 2, mode,
                         with({"--start-step", "2", "--steps", "1"}, kCudaIpc));
  ASSERT_EQ(wait_exit(a0.pid, 120s), 0) << read_err(a0.out).message;
  ASSERT_EQ(wait_exit(a1.pid, 120s), 0) << read_err(a1.out).message;
  expect_bitwise(a0.out, ref, 2, 1, "the nccl rank after the loss");
  expect_bitwise(a1.out, ref, 2, 1, "the cuda_ipc rank after the loss");
  fs::remove_all(dir);
}

// --cuda-graphs (gpu-review F7): every Newton-Schulz of a shape is captured into a CUDA graph on
// its first use and replayed after; the captured run must be bitwise the uncaptured kernels, on
// the first step (the capture, while the io thread serves a cuda_ipc rank and a shm rank: ring
// copies, host staging and read-backs on other streams) and on the replays after it.
TEST(GpuScenario, CudaGraphsServerIsBitwiseTheUncapturedKernels) {
  REQUIRE_GPU();
  const auto dir = temp_dir();
  const std::string mode = "replicated";
  ServerProcess server(dir, {"--backend", "cuda", "--cuda-graphs"}, "gpu_graphs");
  auto r0 = start_client(dir, {server.socket()}, 0, 2, mode, with({"--steps", "3"}, kCudaIpc));
  auto r1 = start_client(dir, {server.socket()}, 1, 2, mode, {"--steps", "3"});  // shm, host
  ASSERT_EQ(wait_exit(r0.pid, 120s), 0) << read_err(r0.out).message;
  ASSERT_EQ(wait_exit(r1.pid, 120s), 0) << read_err(r1.out).message;
  const auto ref = reference_updates(mode, 2, 3, kThreads, -1, 0, "cuda");  // no graphs
  expect_bitwise(r0.out, ref, 0, 3, "cuda_ipc rank, server with --cuda-graphs");
  expect_bitwise(r1.out, ref, 0, 3, "shm rank, server with --cuda-graphs");
  fs::remove_all(dir);
}

// The GPU data plane's copies between a parameter and host memory never block the io thread
// (issue 15): a shm rank's updates are read back into page-locked blocks on the return stream,
// a snapshot's momentum on the reduce stream, and a restored momentum is uploaded from a block;
// each completes through the Engine's CompletionQueue. A GPU server with a cuda_ipc rank and a
// shm rank takes a snapshot after step 1, is SIGKILLed, and a server restored from that file
// runs steps 2-4: every update, before and after, is bitwise the CUDA kernels run in process.
TEST(GpuScenario, SnapshotKillRestoreOnTheGpuDataPlaneIsBitwiseTheCudaKernels) {
  REQUIRE_GPU();
  const auto dir = temp_dir();
  const std::string mode = "rows";
  const std::string snap = (dir / "momentum.safetensors").string();
  const auto ref = reference_updates(mode, 2, 5, kThreads, -1, 0, "cuda");
  {
    ServerProcess server(dir, {"--backend", "cuda", "--snapshot", snap}, "gpu_snapshot");
    auto r0 = start_client(dir, {server.socket()}, 0, 2, mode,
                           with({"--steps", "2", "--snapshot", snap}, kCudaIpc));
    auto r1 = start_client(dir, {server.socket()}, 1, 2, mode, {"--steps", "2"});  // shm
    ASSERT_EQ(wait_exit(r0.pid, 120s), 0) << read_err(r0.out).message;
    ASSERT_EQ(wait_exit(r1.pid, 120s), 0) << read_err(r1.out).message;
    expect_bitwise(r0.out, ref, 0, 2, "cuda_ipc rank before the kill");
    expect_bitwise(r1.out, ref, 0, 2, "shm rank (updates read back) before the kill");
    server.kill9();  // no final snapshot: the restore must rely on the one requested above
  }
  ASSERT_TRUE(fs::exists(snap));
  ServerProcess restored(dir, {"--backend", "cuda", "--restore", snap}, "gpu_restored");
  auto a0 = start_client(dir, {restored.socket()}, 0, 2, mode,
                         with({"--start-step", "2", "--steps", "3"}, kCudaIpc));
  auto a1 = start_client(dir, {restored.socket()}, 1, 2, mode,
                         {"--start-step", "2", "--steps", "3"});
  ASSERT_EQ(wait_exit(a0.pid, 120s), 0) << read_err(a0.out).message;
  ASSERT_EQ(wait_exit(a1.pid, 120s), 0) << read_err(a1.out).message;
  expect_bitwise(a0.out, ref, 2, 3, "cuda_ipc rank after the restore");
  expect_bitwise(a1.out, ref, 2, 3, "shm rank after the restore");
  fs::remove_all(dir);
}

// The CUDA IPC data plane end to end (needs a GPU; skips with the reason elsewhere): a server on
// the CUDA backend, 2 ranks (threads, one Client each) pushing gradients from device memory
// (push_device) and receiving updates into device memory (wait_update_device), waiting for the
// parameters in the reverse of the server's order with small rings (updates must not stay in the
// ring slots meanwhile), plus host pushes / waits and momentum fetch on the same sessions. Every
// update and the fetched momentum must be bitwise those of the same run over shared memory with
// host buffers.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <thread>

#include "client_fixtures.hpp"
#include "cuda_ok.hpp"

using namespace muon;
using namespace muon::testing;

namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 3;

// Two parameters, each several 64 KiB slots long, so chunks of both interleave in the rings.
std::vector<client::ParameterRegistration> params() {
  return {one_param("a", {128, 256}), one_param("b", {96, 160})};
}

// updates[rank][step][param], momentum[param] (fetched by rank 0 after the last step).
struct RunResult {
  std::vector<std::vector<std::vector<std::vector<float>>>> updates;
  std::vector<std::vector<float>> momentum;
};

// One rank: rank 0 uses the device entry points, rank 1 the host ones (both planes take both).
void run_rank(const std::string& socket, transport::DataPlane plane, int rank, RunResult& out) {
  CUDA_OK(cudaSetDevice(0));
  client::Client c(config_for(socket, plane, rank, kWorld));
  const auto regs = params();
  c.register_parameters(regs);
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<float*> dgrad(regs.size()), dupd(regs.size());
  std::vector<int64_t> numel(regs.size());
  for (size_t p = 0; p < regs.size(); ++p) {
    numel[p] = regs[p].shape[0] * regs[p].shape[1];
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dgrad[p]), numel[p] * 4));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dupd[p]), numel[p] * 4));
  }
  out.updates[rank].assign(kSteps, {});
  for (int64_t step = 0; step < kSteps; ++step) {
    for (size_t p = 0; p < regs.size(); ++p) {
      auto g = gradient(numel[p], step, rank, static_cast<int>(p));
      for (auto& x : g) x /= kWorld;
      if (rank == 0) {
        CUDA_OK(cudaMemcpyAsync(dgrad[p], g.data(), numel[p] * 4, cudaMemcpyHostToDevice, stream));
        // Two pushes cut mid-slot: chunking must not change the bits.
        const int64_t cut = numel[p] / 3;
        c.push_device(regs[p].name, step, 0, dgrad[p], cut, stream);
        c.push_device(regs[p].name, step, cut, dgrad[p] + cut, numel[p] - cut, stream);
        CUDA_OK(cudaStreamSynchronize(stream));  // g (host) and dgrad are reused next step
      } else {
        c.push(regs[p].name, step, 0, g.data(), numel[p]);
      }
      c.commit(regs[p].name, step);
    }
    out.updates[rank][step].assign(regs.size(), {});
    for (size_t i = regs.size(); i-- > 0;) {  // the reverse of the server's order
      auto& u = out.updates[rank][step][i];
      u.assign(static_cast<size_t>(numel[i]), 0.0f);
      if (rank == 0) {
        ASSERT_TRUE(c.wait_update_device(regs[i].name, step, dupd[i], stream));
        CUDA_OK(cudaMemcpyAsync(u.data(), dupd[i], numel[i] * 4, cudaMemcpyDeviceToHost, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
      } else {
        ASSERT_TRUE(c.wait_update(regs[i].name, step, u.data()));
      }
    }
    c.report_step(step);
  }
  if (rank == 0) {
    for (size_t p = 0; p < regs.size(); ++p) {
      int64_t last = -1;
      out.momentum.push_back(c.fetch_momentum(regs[p].name, &last));
      EXPECT_EQ(last, kSteps - 1);
    }
  }
  for (size_t p = 0; p < regs.size(); ++p) {
    cudaFree(dgrad[p]);
    cudaFree(dupd[p]);
  }
  cudaStreamDestroy(stream);
}

RunResult run(transport::DataPlane plane) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--backend", "cuda", "--tx-slots", "2", "--rx-slots", "2"});
  RunResult r;
  r.updates.assign(kWorld, {});
  std::vector<std::thread> ranks;
  std::vector<std::string> errors(kWorld);
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        run_rank(server.socket(), plane, rank, r);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_EQ(errors[rank], "") << "rank " << rank << " over " << transport::data_plane_name(plane);
  }
  return r;
}

void skip_without_gpu(std::string* reason) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    *reason = std::string("CUDA unavailable: ") + cudaGetErrorString(e);
  } else if (n == 0) {
    *reason = "no CUDA device";
  }
}

}  // namespace

TEST(CudaIpcPlane, TwoRanksDevicePushesAndUpdatesBitwiseAsShm) {
  std::string reason;
  skip_without_gpu(&reason);
  if (!reason.empty()) GTEST_SKIP() << reason;
  const auto shm = run(transport::DataPlane::shm);
  if (HasFailure()) return;
  const auto ipc = run(transport::DataPlane::cuda_ipc);
  if (HasFailure()) return;
  for (int rank = 0; rank < kWorld; ++rank) {
    for (int step = 0; step < kSteps; ++step) {
      for (size_t p = 0; p < params().size(); ++p) {
        EXPECT_TRUE(same_bits(ipc.updates[rank][step][p], shm.updates[rank][step][p]))
            << "rank " << rank << " step " << step << " param " << p;
        // Both ranks receive the same update.
        EXPECT_TRUE(same_bits(ipc.updates[rank][step][p], ipc.updates[0][step][p]));
      }
    }
  }
  ASSERT_EQ(ipc.momentum.size(), shm.momentum.size());
  for (size_t p = 0; p < shm.momentum.size(); ++p) {
    EXPECT_TRUE(same_bits(ipc.momentum[p], shm.momentum[p])) << "momentum of param " << p;
  }
}

TEST(CudaIpcPlane, LoadMomentumThenStepMatchesShm) {
  std::string reason;
  skip_without_gpu(&reason);
  if (!reason.empty()) GTEST_SKIP() << reason;
  auto once = [](transport::DataPlane plane) {
    const auto dir = temp_dir();
    ServerProcess server(dir, {"--backend", "cuda"});
    client::Client c(config_for(server.socket(), plane));
    auto reg = one_param("w", {64, 48});
    c.register_parameters({reg});
    const int64_t n = 64 * 48;
    const auto m = gradient(n, 7, 0, 3);  // some momentum
    c.load_momentum("w", 4, m.data());
    int64_t last = -1;
    EXPECT_TRUE(same_bits(c.fetch_momentum("w", &last), m));
    EXPECT_EQ(last, 4);
    const auto g = gradient(n, 5);
    c.push("w", 5, 0, g.data(), n);
    c.commit("w", 5);
    std::vector<float> u(static_cast<size_t>(n));
    EXPECT_TRUE(c.wait_update("w", 5, u.data()));
    return u;
  };
  const auto shm = once(transport::DataPlane::shm);
  const auto ipc = once(transport::DataPlane::cuda_ipc);
  EXPECT_TRUE(same_bits(ipc, shm));
}

// gpu-review F5: wait_update_device runs on the rings' device and checks the caller's stream like
// push_device. With another device current, a stream of the rings' device works (it failed in
// cudaEventRecord before), and a stream of another device (also the null stream, which means the
// current device's) is refused as InvalidArgument with the update still held. Needs 2 GPUs.
TEST(CudaIpcPlane, WaitUpdateDeviceRunsOnTheRingsDeviceWhateverIsCurrent) {
  std::string reason;
  skip_without_gpu(&reason);
  int gpus = 0;
  if (reason.empty() && cudaGetDeviceCount(&gpus) == cudaSuccess && gpus < 2) {
    reason = "needs 2 GPUs (another device current than the rings')";
  }
  if (!reason.empty()) GTEST_SKIP() << reason;
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--backend", "cuda"});
  const int64_t n = 64 * 48;
  const auto g = gradient(n, 0);
  std::vector<float> expected(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  {
    CUDA_OK(cudaSetDevice(0));
    client::Client shm(config_for(server.socket(), transport::DataPlane::shm));
    shm.register_parameters({one_param("ref", {64, 48})});
    shm.push("ref", 0, 0, g.data(), n);
    shm.commit("ref", 0);
    ASSERT_TRUE(shm.wait_update("ref", 0, expected.data()));
  }
  CUDA_OK(cudaSetDevice(0));  // the rings open on the device current at connect
  client::Client c(config_for(server.socket(), transport::DataPlane::cuda_ipc));
  c.register_parameters({one_param("w", {64, 48})});
  cudaStream_t on0 = nullptr, on1 = nullptr;
  float* dst = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&on0, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dst), n * 4));
  c.push("w", 0, 0, g.data(), n);
  c.commit("w", 0);
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaStreamCreateWithFlags(&on1, cudaStreamNonBlocking));
  EXPECT_THROW(c.wait_update_device("w", 0, dst, on1), InvalidArgument);
  EXPECT_THROW(c.wait_update_device("w", 0, dst, nullptr), InvalidArgument);
  ASSERT_TRUE(c.wait_update_device("w", 0, dst, on0));  // still held, device 1 current
  int current = -1;
  CUDA_OK(cudaGetDevice(&current));
  EXPECT_EQ(current, 1);  // the caller's device comes back
  CUDA_OK(cudaMemcpyAsync(got.data(), dst, n * 4, cudaMemcpyDeviceToHost, on0));
  CUDA_OK(cudaStreamSynchronize(on0));
  EXPECT_TRUE(same_bits(got, expected));
  cudaStreamDestroy(on1);
  CUDA_OK(cudaSetDevice(0));
  cudaStreamDestroy(on0);
  cudaFree(dst);
}

// The nccl data plane end to end (needs a GPU and a client built with NCCL; skips with the reason
// elsewhere): a server on the CUDA backend (on GPU 1 where there are two; on one GPU the two
// processes get different NCCL_HOSTIDs, so NCCL joins them over loopback sockets instead of
// refusing two ranks on one GPU; the test skips saying so if NCCL still refuses), one client
// with data plane nccl on GPU 0 pushing from device memory (push_device, cut mid-slot) and from
// host memory, receiving updates into device memory (wait_update_device) and the host, loading
// and fetching momentum. Every update and the fetched momentum must be bitwise those of the same
// run over shared memory with host buffers.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <optional>

#include "client/plane.hpp"
#include "client_fixtures.hpp"
#include "cuda_ok.hpp"

using namespace muon;
using namespace muon::testing;

namespace {

constexpr int kSteps = 2;

struct RunResult {
  std::vector<std::vector<float>> updates;       // by step: device pushes and waits
  std::vector<std::vector<float>> host_updates;  // by step: host pushes and waits
  std::vector<float> momentum;                   // after load_momentum
};

// updates of "a" (device entry points) and "b" (host entry points) over `plane`; momentum of "b"
// loaded and fetched back first. Sets *skip when NCCL refuses the communicators.
RunResult run(transport::DataPlane plane, int server_device, std::string* skip) {
  RunResult r;
  const auto dir = temp_dir();
  // On a one-GPU machine server and client share GPU 0, which NCCL refuses within one host
  // ("Duplicate GPU detected"): different NCCL_HOSTIDs make them two hosts to NCCL, joined over
  // sockets on the loopback interface. Set before the server starts (it inherits them) and
  // changed for this process before its first NCCL call.
  const bool one_gpu = server_device == 0;
  if (one_gpu) {
    setenv("NCCL_HOSTID", "muon-offload-test-server", 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    setenv("NCCL_IB_DISABLE", "1", 1);
  }
  ServerProcess server(dir, {"--backend", "cuda", "--cuda-device", std::to_string(server_device)});
  if (one_gpu) setenv("NCCL_HOSTID", "muon-offload-test-client", 1);
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  std::optional<client::Client> c;
  try {
    c.emplace(config_for(server.socket(), plane));
  } catch (const DeviceError& e) {
    if (plane == transport::DataPlane::nccl) {
      *skip = std::string(
                  "NCCL refused the session's communicators (client on GPU 0, server on "
                  "GPU ") +
              std::to_string(server_device) + "): " + e.what();
      return r;
    }
    throw;
  }
  const auto a = one_param("a", {128, 256});  // several 64 KiB slots
  const auto b = one_param("b", {48, 40});
  c->register_parameters({a, b});
  const int64_t na = 128 * 256, nb = 48 * 40;
  const auto m = gradient(nb, 7, 0, 3);
  c->load_momentum("b", 0, m.data());
  r.momentum = c->fetch_momentum("b");
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  float *dgrad = nullptr, *dupd = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dgrad), na * 4), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dupd), na * 4), cudaSuccess);
  for (int64_t step = 1; step <= kSteps; ++step) {
    const auto ga = gradient(na, step, 0, 0);
    const auto gb = gradient(nb, step, 0, 1);
    EXPECT_EQ(cudaMemcpyAsync(dgrad, ga.data(), na * 4, cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    const int64_t cut = na / 3;
    c->push_device("a", step, 0, dgrad, cut, stream);
    c->push_device("a", step, cut, dgrad + cut, na - cut, stream);
    c->commit("a", step);
    c->push("b", step, 0, gb.data(), nb);
    c->commit("b", step);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // dgrad is reused next step
    std::vector<float> ua(static_cast<size_t>(na)), ub(static_cast<size_t>(nb));
    EXPECT_TRUE(c->wait_update("b", step, ub.data()));
    EXPECT_TRUE(c->wait_update_device("a", step, dupd, stream));
    EXPECT_EQ(cudaMemcpyAsync(ua.data(), dupd, na * 4, cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    r.updates.push_back(std::move(ua));
    r.host_updates.push_back(std::move(ub));
  }
  c.reset();  // before the buffers the connection's streams may still read
  cudaFree(dgrad);
  cudaFree(dupd);
  cudaStreamDestroy(stream);
  return r;
}

}  // namespace

TEST(NcclPlane, DeviceAndHostPushesAndUpdatesBitwiseAsShm) {
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    GTEST_SKIP() << "CUDA unavailable: " << cudaGetErrorString(e);
  }
  if (n == 0) GTEST_SKIP() << "no CUDA device";
  if (!client::nccl_plane_built()) GTEST_SKIP() << "this client was built without NCCL";
  const int server_device = n >= 2 ? 1 : 0;
  std::string skip;
  const auto shm = run(transport::DataPlane::shm, server_device, &skip);
  if (HasFailure()) return;
  const auto nccl = run(transport::DataPlane::nccl, server_device, &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  if (HasFailure()) return;
  ASSERT_EQ(nccl.updates.size(), shm.updates.size());
  for (size_t s = 0; s < shm.updates.size(); ++s) {
    EXPECT_TRUE(same_bits(nccl.updates[s], shm.updates[s])) << "device update, step " << s + 1;
    EXPECT_TRUE(same_bits(nccl.host_updates[s], shm.host_updates[s]))
        << "host update, step " << s + 1;
  }
  EXPECT_TRUE(same_bits(nccl.momentum, shm.momentum));
}

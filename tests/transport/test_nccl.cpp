// NCCL point-to-point: the communicator bootstrapped from an ncclUniqueId that went through its
// hex form (as through the control plane), grouped send/receive of fp32 and bf16 tiles. One GPU:
// a one-rank communicator sending to itself, and an init that times out because the second rank
// never joins (a dead peer gives an error, not a hang). Two GPUs: two processes exchanging tiles.
// Skips with the reason where the GPUs are missing.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <string>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/device_probe.hpp"
#include "kernels/device_stream.hpp"
#include "tests/daemon/process.hpp"
#include "tests/transport/nccl_tiles.hpp"
#include "transport/nccl_comm.hpp"
#include "transport/nccl_id.hpp"

using namespace muon;
using namespace muon::transport;
using muon::testing::NcclTileBuffers;

namespace {

// Skips the calling test unless `gpus` GPUs are usable.
#define REQUIRE_GPUS(gpus)                                             \
  do {                                                                 \
    const std::string reason = cuda_unavailable_reason(gpus);          \
    if (!reason.empty()) GTEST_SKIP() << "no usable GPUs: " << reason; \
    MUON_CUDA_CHECK(cudaSetDevice(0));                                 \
  } while (0)

}  // namespace

TEST(Nccl, OneRankSendsTilesToItselfThroughAnIdThatWentThroughHex) {
  REQUIRE_GPUS(1);
  const NcclIdBytes id = nccl_id_from_hex(nccl_id_to_hex(new_nccl_id()));
  NcclComm comm(id, 1, 0, std::chrono::seconds(60));
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.nranks(), 1);
  NcclTileBuffers tiles(5);
  DeviceStream stream;
  comm.exchange(0, tiles.send, tiles.recv, stream.get());
  comm.wait(stream.get(), std::chrono::seconds(60));
  EXPECT_TRUE(tiles.received(5));
  EXPECT_THROW(comm.exchange(1, tiles.send, {}, stream.get()), InvalidArgument);
}

TEST(Nccl, InitTimesOutWhenThePeerNeverJoins) {
  REQUIRE_GPUS(1);
  const NcclIdBytes id = new_nccl_id();
  try {
    NcclComm comm(id, 2, 0, std::chrono::seconds(3));
    ADD_FAILURE() << "a 2-rank communicator formed with one rank";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  }
}

TEST(Nccl, RejectsARankOutsideTheCommunicator) {
  REQUIRE_GPUS(1);
  EXPECT_THROW(NcclComm(new_nccl_id(), 2, 2), InvalidArgument);
}

TEST(Nccl, TwoProcessesOnTwoGpusExchangeTiles) {
  REQUIRE_GPUS(2);
  const NcclIdBytes id = new_nccl_id();
  const pid_t child = muon::testing::spawn({NCCL_PEER_CHILD, nccl_id_to_hex(id), "1", "8", "3"});
  NcclTileBuffers tiles(3);
  {
    NcclComm comm(id, 2, 0, std::chrono::seconds(60));
    DeviceStream stream;
    comm.exchange(1, tiles.send, tiles.recv, stream.get());
    comm.wait(stream.get(), std::chrono::seconds(60));
  }
  EXPECT_TRUE(tiles.received(8));
  EXPECT_EQ(muon::testing::wait_exit(child, std::chrono::seconds(60)), 0);
}

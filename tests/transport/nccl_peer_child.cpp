// The second rank of the NCCL tests: joins the communicator from the hex unique id on the command
// line, exchanges kNcclTiles with rank 0 in one group and checks what it received; with
// "idle" as the expected seed it joins and then posts nothing, until it is killed (a peer that
// is alive but never takes rank 0's transfers: the abort scenario).
//   nccl_peer_child <id hex> <device> <send seed> <expected seed | idle>
// Exit status 0 on success, 2 on a usage error, 3 on wrong bytes, 4 on an exception.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include "core/cuda_check.hpp"
#include "kernels/device_stream.hpp"
#include "tests/transport/nccl_tiles.hpp"
#include "transport/nccl_comm.hpp"
#include "transport/nccl_id.hpp"

using namespace muon;
using namespace muon::transport;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: nccl_peer_child ID_HEX DEVICE SEND_SEED EXPECTED_SEED\n");
    return 2;
  }
  try {
    MUON_CUDA_CHECK(cudaSetDevice(std::stoi(argv[2])));
    const NcclIdBytes id = nccl_id_from_hex(argv[1]);
    muon::testing::NcclTileBuffers tiles(static_cast<unsigned>(std::stoul(argv[3])));
    NcclComm comm(id, 2, 1);
    if (std::string(argv[4]) == "idle") {
      std::this_thread::sleep_for(std::chrono::minutes(2));
      return 0;
    }
    DeviceStream stream;
    comm.exchange(0, tiles.send, tiles.recv, stream.get());
    comm.wait(stream.get(), std::chrono::seconds(60));
    if (!tiles.received(static_cast<unsigned>(std::stoul(argv[4])))) {
      std::fprintf(stderr, "nccl_peer_child: received tiles do not hold rank 0's pattern\n");
      return 3;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_peer_child: %s\n", e.what());
    return 4;
  }
}

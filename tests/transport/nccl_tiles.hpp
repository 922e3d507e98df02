// The tiles both ranks of the NCCL tests send and check: three tiles (fp32, bf16, and one of a
// little over 4 MiB), filled with a pattern per seed; NCCL moves bytes, so any bits survive.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

#include "core/cuda_check.hpp"
#include "tests/transport/ipc_pattern.hpp"
#include "transport/nccl_comm.hpp"

namespace muon::testing {

struct TileSpec {
  size_t count;
  DType dtype;
};
inline constexpr TileSpec kNcclTiles[] = {
    {1000, DType::f32}, {777, DType::bf16}, {(size_t{1} << 20) + 1, DType::f32}};

inline size_t tile_bytes(const TileSpec& t) {
  return t.count * (t.dtype == DType::bf16 ? 2 : 4);
}

/// Device buffers for kNcclTiles: send tiles holding pattern(seed * 10 + i), zeroed receive tiles.
class NcclTileBuffers {
 public:
  explicit NcclTileBuffers(unsigned send_seed) {
    for (size_t i = 0; i < std::size(kNcclTiles); ++i) {
      const TileSpec& t = kNcclTiles[i];
      const size_t bytes = tile_bytes(t);
      void *s = nullptr, *r = nullptr;
      MUON_CUDA_CHECK(cudaMalloc(&s, bytes));
      owned_.push_back(s);
      MUON_CUDA_CHECK(cudaMalloc(&r, bytes));
      owned_.push_back(r);
      const auto p = ipc_pattern(bytes, send_seed * 10 + static_cast<unsigned>(i));
      MUON_CUDA_CHECK(cudaMemcpy(s, p.data(), bytes, cudaMemcpyHostToDevice));
      MUON_CUDA_CHECK(cudaMemset(r, 0, bytes));
      send.push_back({s, t.count, t.dtype});
      recv.push_back({r, t.count, t.dtype});
    }
  }
  NcclTileBuffers(const NcclTileBuffers&) = delete;
  NcclTileBuffers& operator=(const NcclTileBuffers&) = delete;
  ~NcclTileBuffers() {
    for (void* p : owned_) MUON_CUDA_CHECK_NOTHROW(cudaFree(p));
  }

  /// Whether every receive tile holds the pattern a peer with `seed` sent.
  bool received(unsigned seed) const {
    for (size_t i = 0; i < recv.size(); ++i) {
      const size_t bytes = tile_bytes(kNcclTiles[i]);
      std::vector<uint8_t> got(bytes);
      MUON_CUDA_CHECK(cudaMemcpy(got.data(), recv[i].data, bytes, cudaMemcpyDeviceToHost));
      if (got != ipc_pattern(bytes, seed * 10 + static_cast<unsigned>(i))) return false;
    }
    return true;
  }

  std::vector<transport::SendTile> send;
  std::vector<transport::RecvTile> recv;

 private:
  std::vector<void*> owned_;
};

}  // namespace muon::testing

// CUDA IPC between two processes on one GPU: this process exports (a DeviceRing, or a region at
// an offset inside a larger cudaMalloc segment), a child process (cuda_ipc_child, spawned with
// posix_spawn) opens it and copies a pattern in or out; this process checks the bytes. Plus the
// allocation lookup. Skips with the reason where no GPU is usable.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/device_probe.hpp"
#include "kernels/device_stream.hpp"
#include "tests/daemon/process.hpp"
#include "tests/transport/ipc_pattern.hpp"
#include "transport/cuda_ipc.hpp"

using namespace muon;
using namespace muon::transport;
using muon::testing::ipc_pattern;

namespace {

constexpr auto kChildTimeout = std::chrono::seconds(60);

// Runs cuda_ipc_child with `args`; returns its exit status (-1 on timeout).
int run_child(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {CUDA_IPC_CHILD};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto code = muon::testing::wait_exit(muon::testing::spawn(argv), kChildTimeout);
  return code ? *code : -1;
}

std::vector<uint8_t> download(const void* device, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  MUON_CUDA_CHECK(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  return host;
}

bool all_zero(const std::vector<uint8_t>& v) {
  for (uint8_t b : v)
    if (b != 0) return false;
  return true;
}

class CudaIpc : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = cuda_unavailable_reason();
    if (!reason.empty()) GTEST_SKIP() << "no usable GPU: " << reason;
    MUON_CUDA_CHECK(cudaSetDevice(0));
  }
};

}  // namespace

TEST_F(CudaIpc, ChildCopiesATileIntoTheRingAndThisProcessWaitsOnTheReadyEvent) {
  const uint64_t slots = 4, slot_bytes = 1 << 20;
  DeviceRing ring(slots, slot_bytes);
  const size_t bytes = slot_bytes - 12;  // not a whole slot
  const std::string json = ring_descriptor_to_json(ring.descriptor()).dump();
  ASSERT_EQ(run_child({"ring-in", json, "2", std::to_string(bytes), "7"}), 0);
  DeviceStream stream;
  ring.wait_ready(2, stream.get());
  std::vector<uint8_t> got(bytes);
  MUON_CUDA_CHECK(
      cudaMemcpyAsync(got.data(), ring.slot(2), bytes, cudaMemcpyDeviceToHost, stream.get()));
  stream.synchronize();
  EXPECT_EQ(got, ipc_pattern(bytes, 7));
  EXPECT_TRUE(all_zero(download(ring.slot(1), slot_bytes))) << "slot 1 untouched";
  EXPECT_TRUE(all_zero(download(ring.slot(3), slot_bytes))) << "slot 3 untouched";
  EXPECT_TRUE(all_zero(download(static_cast<char*>(ring.slot(2)) + bytes, 12)))
      << "slot 2 past the tile untouched";
}

TEST_F(CudaIpc, ChildReadsAResultThisProcessMarkedReady) {
  DeviceRing ring(2, 1 << 16);
  const size_t bytes = 1 << 16;
  const auto pattern = ipc_pattern(bytes, 11);
  DeviceStream stream;
  ring.wait_free(1, stream.get());  // never recorded yet: no wait
  MUON_CUDA_CHECK(
      cudaMemcpyAsync(ring.slot(1), pattern.data(), bytes, cudaMemcpyHostToDevice, stream.get()));
  ring.mark_ready(1, stream.get());
  stream.synchronize();
  const std::string json = ring_descriptor_to_json(ring.descriptor()).dump();
  EXPECT_EQ(run_child({"ring-out", json, "1", std::to_string(bytes), "11"}), 0);
  ring.wait_free(1, stream.get());  // the child's free record: done before it exited
  stream.synchronize();
}

TEST_F(CudaIpc, RegionAtAnOffsetInsideALargerAllocationIsExportedAtItsBase) {
  // A torch tensor inside a caching-allocator segment: export at the base, copy to base+offset.
  const size_t segment = 64 << 20, offset = (5 << 20) + 256, bytes = (1 << 20) + 3;
  void* base = nullptr;
  MUON_CUDA_CHECK(cudaMalloc(&base, segment));
  MUON_CUDA_CHECK(cudaMemset(base, 0, segment));
  char* tensor = static_cast<char*>(base) + offset;
  const DeviceAllocation a = find_allocation(tensor);
  EXPECT_EQ(a.base, base);
  EXPECT_EQ(a.offset, offset);
  EXPECT_GE(a.size, segment);
  const ExportedRegion r = export_region(tensor, bytes);
  EXPECT_EQ(r.offset, offset);
  EXPECT_EQ(r.bytes, bytes);
  EXPECT_EQ(run_child({"region", region_to_json(r).dump(), "23"}), 0);
  const auto all = download(base, segment);
  EXPECT_EQ(std::vector<uint8_t>(all.begin() + offset, all.begin() + offset + bytes),
            ipc_pattern(bytes, 23));
  EXPECT_TRUE(all_zero(std::vector<uint8_t>(all.begin(), all.begin() + offset)));
  EXPECT_TRUE(all_zero(std::vector<uint8_t>(all.begin() + offset + bytes, all.end())));
  MUON_CUDA_CHECK(cudaFree(base));
}

TEST_F(CudaIpc, AllocationLookupRejectsHostMemoryAndRegionsPastTheEnd) {
  int on_the_stack = 0;
  EXPECT_THROW(find_allocation(&on_the_stack), InvalidArgument);
  void* p = nullptr;
  MUON_CUDA_CHECK(cudaMalloc(&p, 4096));
  EXPECT_THROW(export_region(static_cast<char*>(p) + 4000, 4096), InvalidArgument);
  EXPECT_NO_THROW(export_region(static_cast<char*>(p) + 4000, 96));
  MUON_CUDA_CHECK(cudaFree(p));
}

TEST_F(CudaIpc, RingRejectsBadSlotsAndOversizedCopies) {
  EXPECT_THROW(DeviceRing(0, 16), InvalidArgument);
  DeviceRing ring(2, 64);
  EXPECT_THROW(ring.slot(2), InvalidArgument);
  DeviceStream stream;
  EXPECT_THROW(ring.mark_ready(5, stream.get()), InvalidArgument);
  EXPECT_EQ(ring.descriptor().ready.size(), 2u);
  EXPECT_EQ(ring.descriptor().free.size(), 2u);
}

// The shm data plane (client/plane_shm.cpp) against a real shared-memory ring pair: the test is
// the server (transport::ShmSegment::create), the plane maps the segment as a client does. What
// the plane copies into tx slots is read back through the server's own mapping, and what the
// server writes into rx slots arrives in the plane's holds and in host memory, byte for byte.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "client/plane.hpp"
#include "core/error.hpp"

using namespace muon;

namespace {

constexpr uint64_t kSlotBytes = 64;  // 16 fp32 or 32 bf16 elements per slot

transport::SegmentLayout layout() {
  return transport::SegmentLayout{2, 3, kSlotBytes};
}

// A connection's chunking in miniature: chunks of at most a slot, in slots 0, 1, 0, ... (the
// credits of a real connection), each checked in the server's mapping right after the plane
// copied it (before the next chunk can reuse the slot).
struct Chunker {
  const transport::ShmSegment& server;
  const std::vector<std::byte>& expect;  // the pushed bytes
  int64_t count;
  size_t elem_bytes;
  int64_t frames = 0;

  int64_t operator()(const client::ChunkMoves& moves) {
    EXPECT_TRUE(moves.into_slot);
    EXPECT_FALSE(moves.after_frame);  // shm: the bytes are in the slot before the frame
    const int64_t per_slot = static_cast<int64_t>(kSlotBytes / elem_bytes);
    for (int64_t first = 0; first < count; first += per_slot) {
      const int64_t n = std::min(per_slot, count - first);
      const auto slot = static_cast<uint32_t>(frames % 2);
      std::memset(server.tx_slot(slot), 0xEE, kSlotBytes);
      moves.into_slot(slot, first, n);
      const size_t bytes = static_cast<size_t>(n) * elem_bytes;
      const std::vector<std::byte> got(server.tx_slot(slot), server.tx_slot(slot) + bytes);
      const std::vector<std::byte> want(expect.begin() + first * elem_bytes,
                                        expect.begin() + first * elem_bytes + bytes);
      EXPECT_EQ(got, want) << "chunk at element " << first << " in slot " << slot;
      // Nothing past the chunk was written.
      if (bytes < kSlotBytes) {
        EXPECT_EQ(server.tx_slot(slot)[bytes], std::byte{0xEE});
      }
      ++frames;
    }
    return frames;
  }
};

std::vector<std::byte> pattern(size_t bytes, unsigned seed) {
  std::vector<std::byte> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<std::byte>((i * 7 + seed) & 0xFF);
  return v;
}

}  // namespace

TEST(ShmPlane, PushesLandInTheServersTxSlotsChunkByChunk) {
  auto server = transport::ShmSegment::create(layout());
  auto plane = client::make_shm_plane(server.name(), layout());
  EXPECT_FALSE(plane->on_device());
  EXPECT_FALSE(plane->maps_server_memory());
  EXPECT_EQ(plane->push_stream(), nullptr);

  // 40 fp32 values: chunks of 16, 16 and 8 elements.
  std::vector<float> values(40);
  std::iota(values.begin(), values.end(), -3.25f);
  std::vector<std::byte> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  Chunker f32{server, bytes, 40, 4};
  EXPECT_EQ(plane->push_host(bytes.data(), 4, std::ref(f32)), 3);
  EXPECT_EQ(f32.frames, 3);

  // 70 bf16 values: chunks of 32, 32 and 6 elements.
  const auto bf16 = pattern(140, 3);
  Chunker b16{server, bf16, 70, 2};
  EXPECT_EQ(plane->push_host(bf16.data(), 2, std::ref(b16)), 3);
}

TEST(ShmPlane, UpdateChunksFromTheServersRxSlotsArriveInAHold) {
  auto server = transport::ShmSegment::create(layout());
  auto plane = client::make_shm_plane(server.name(), layout());
  plane->enter_reader_thread();

  // One bf16 update of 48 elements (96 bytes) in two chunks: 32 elements in rx slot 2, 16 in 0.
  const auto update = pattern(96, 11);
  std::memcpy(server.rx_slot(2), update.data(), 64);
  std::memcpy(server.rx_slot(0), update.data() + 64, 32);
  std::memset(server.rx_slot(1), 0x5A, kSlotBytes);  // a chunk this client does not keep

  auto hold = plane->make_hold(96);
  ASSERT_EQ(hold->bytes(), 96u);
  ASSERT_NE(hold->data(), nullptr);
  hold->begin_fill(plane->reader_stream());
  auto* dst = static_cast<std::byte*>(hold->data());
  plane->receive(0, dst + 64, 16, 2);  // the chunks may come in any order
  plane->receive(1, nullptr, 32, 2);   // dropped: the hold is untouched
  plane->receive(2, dst, 32, 2);
  hold->end_fill(plane->reader_stream());

  std::vector<std::byte> got(96, std::byte{0});
  hold->copy_to_host(got.data());
  EXPECT_EQ(got, update);
  // A hold in host memory cannot be copied to a device: the plane has none.
  EXPECT_THROW(hold->copy_to_device(got.data(), nullptr), InvalidArgument);
  // A fresh hold starts zeroed (the bytes of a step not yet received).
  auto fresh = plane->make_hold(8);
  std::vector<std::byte> zeros(8, std::byte{1});
  fresh->copy_to_host(zeros.data());
  EXPECT_EQ(zeros, std::vector<std::byte>(8, std::byte{0}));
}

TEST(ShmPlane, MomentumChunksArriveInHostMemory) {
  auto server = transport::ShmSegment::create(layout());
  auto plane = client::make_shm_plane(server.name(), layout());
  std::vector<float> momentum(20, 0.0f);
  std::vector<float> sent(20);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = 0.5f * static_cast<float>(i) - 4.0f;
  std::memcpy(server.rx_slot(1), sent.data(), 16 * 4);
  std::memcpy(server.rx_slot(2), sent.data() + 16, 4 * 4);
  plane->receive_to_host(1, momentum.data(), 16, 4);
  plane->receive_to_host(2, momentum.data() + 16, 4, 4);
  EXPECT_EQ(momentum, sent);
  plane->receive_to_host(1, nullptr, 16, 4);  // outside the fetched range: nothing written
  EXPECT_EQ(momentum, sent);
}

TEST(ShmPlane, MapsTheSegmentOnceAndRefusesDevicePushes) {
  auto server = transport::ShmSegment::create(layout());
  auto plane = client::make_shm_plane(server.name(), layout());
  // The name is gone once mapped: no other process can open the session's memory.
  EXPECT_THROW(client::make_shm_plane(server.name(), layout()), Error);
  const std::vector<std::byte> data(16);
  int64_t calls = 0;
  EXPECT_THROW(plane->push_device(data.data(), 4, nullptr,
                                  [&](const client::ChunkMoves&) { return ++calls; }),
               InvalidArgument);
  EXPECT_EQ(calls, 0);
  EXPECT_THROW(plane->device(), InvalidArgument);
}

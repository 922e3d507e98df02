// The credit logic the GPU data plane's result rings share with shared memory, on the CPU: a
// session whose rings are device rings (use_device_rings) takes a chunk straight into a free
// slot (send_chunk_direct, the device-to-device path) only while nothing waits before it; a
// chunk without a credit waits as host bytes and is written through the session's rx writer,
// in order, as update_acks return slots; every update frame names the slot its bytes went to.
// While the data plane is held (an nccl join), the client's frames from its first push on wait
// for it, in order.
// A real Session on a real socket pair; the peer's side reads the frames.
#include <gtest/gtest.h>

#include "transport/asio.hpp"

#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "core/error.hpp"
#include "daemon/session.hpp"
#include "transport/frame.hpp"
#include "transport/messages.hpp"

using namespace muon;
using namespace muon::daemon;
namespace asio = boost::asio;

namespace {

struct Peer {
  asio::local::stream_protocol::socket socket;
  transport::FrameDecoder decoder;
  // Reads until `n` update frames arrived.
  std::vector<transport::Update> read_updates(size_t n) {
    std::vector<transport::Update> out;
    std::array<std::byte, 4096> buf;
    while (out.size() < n) {
      while (auto f = decoder.next()) {
        EXPECT_EQ(f->type, static_cast<uint16_t>(transport::MessageType::update));
        out.push_back(transport::decode<transport::Update>(f->payload));
      }
      if (out.size() >= n) break;
      const size_t got = socket.read_some(asio::buffer(buf));
      decoder.feed(buf.data(), got);
    }
    return out;
  }
};

transport::Update chunk(int64_t offset) {
  transport::Update u;
  u.name = "w";
  u.step = 3;
  u.offset = offset;
  u.count = 2;
  return u;
}

}  // namespace

TEST(SessionRings, DirectWhileCreditsLastThenQueuedBytesInOrderThroughTheWriter) {
  asio::io_context io;
  asio::local::stream_protocol::socket server_side(io), client_side(io);
  asio::local::connect_pair(server_side, client_side);
  auto session = std::make_shared<Session>(
      Session::Socket(std::move(server_side)), 1, [](const auto&, transport::Frame) {},
      [](const auto&, const std::string&) {});
  std::map<uint32_t, std::vector<std::byte>> written;  // what the writer put in each slot
  std::vector<uint32_t> writes;
  session->use_device_rings(
      nullptr, 2,
      [&](uint32_t slot, const transport::Update& u, const std::vector<std::byte>& data) {
        EXPECT_EQ(data.size(), static_cast<size_t>(u.count) * 4);
        written[slot] = data;
        writes.push_back(slot);
      });
  std::vector<uint32_t> direct;
  const auto write_direct = [&](uint32_t slot) { direct.push_back(slot); };
  // Two credits: two chunks go straight to slots 0 and 1.
  EXPECT_TRUE(session->send_chunk_direct(chunk(0), write_direct));
  EXPECT_TRUE(session->send_chunk_direct(chunk(2), write_direct));
  EXPECT_EQ(direct, (std::vector<uint32_t>{0, 1}));
  // No credit left: refused; the caller queues host bytes instead.
  EXPECT_FALSE(session->send_chunk_direct(chunk(4), write_direct));
  session->send_chunk(chunk(4), std::vector<std::byte>(8, std::byte{4}));
  session->send_chunk(chunk(6), std::vector<std::byte>(8, std::byte{6}));
  // A chunk is waiting: a direct write would overtake it, so it is refused even with a credit.
  session->release_rx_slot(1);  // slot 1 back: the first queued chunk takes it at once
  EXPECT_EQ(writes, (std::vector<uint32_t>{1}));
  EXPECT_EQ(written[1], std::vector<std::byte>(8, std::byte{4}));
  EXPECT_FALSE(session->send_chunk_direct(chunk(8), write_direct));
  session->release_rx_slot(0);
  EXPECT_EQ(writes, (std::vector<uint32_t>{1, 0}));
  EXPECT_EQ(written[0], std::vector<std::byte>(8, std::byte{6}));
  EXPECT_EQ(session->pending_chunks(), 0u);
  // Returning a slot that holds nothing is a protocol error.
  session->release_rx_slot(1);
  EXPECT_THROW(session->release_rx_slot(1), transport::ProtocolError);
  // The frames the peer sees: offsets in order, each naming the slot its bytes are in.
  io.run_for(std::chrono::milliseconds(200));
  Peer peer{std::move(client_side), {}};
  const auto updates = peer.read_updates(4);
  ASSERT_EQ(updates.size(), 4u);
  const std::vector<std::pair<int64_t, uint32_t>> expected = {{0, 0}, {2, 1}, {4, 1}, {6, 0}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(updates[i].offset, expected[i].first) << i;
    EXPECT_EQ(updates[i].slot, expected[i].second) << i;
  }
  session->close("done");
  io.run_for(std::chrono::milliseconds(50));
}

// A write into a result slot that fails (a CUDA or NCCL error) ends the session with an error
// frame saying so: the client may already wait for the bytes.
TEST(SessionRings, FailedWriteSendsAnErrorAndCloses) {
  asio::io_context io;
  asio::local::stream_protocol::socket server_side(io), client_side(io);
  asio::local::connect_pair(server_side, client_side);
  std::string closed_why;
  auto session = std::make_shared<Session>(
      Session::Socket(std::move(server_side)), 1, [](const auto&, transport::Frame) {},
      [&](const auto&, const std::string& why) { closed_why = why; });
  session->use_device_rings(
      nullptr, 1, [](uint32_t, const transport::Update&, const std::vector<std::byte>&) {},
      /*frame_first=*/true);
  EXPECT_TRUE(session->send_chunk_direct(
      chunk(0), [](uint32_t) { throw DeviceError("ncclSend failed: remote process exited"); }));
  io.run_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(session->closed());
  EXPECT_NE(closed_why.find("ncclSend failed"), std::string::npos) << closed_why;
  // What the client saw: the update frame (announced first on this plane), then the error.
  transport::FrameDecoder decoder;
  std::array<std::byte, 4096> buf;
  std::vector<transport::Frame> frames;
  boost::system::error_code ec;
  while (frames.size() < 2) {
    const size_t n = client_side.read_some(asio::buffer(buf), ec);
    if (ec) break;
    decoder.feed(buf.data(), n);
    while (auto f = decoder.next()) frames.push_back(*f);
  }
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].type, static_cast<uint16_t>(transport::MessageType::update));
  ASSERT_EQ(frames[1].type, static_cast<uint16_t>(transport::MessageType::error));
  const auto e = transport::decode<transport::ErrorMsg>(frames[1].payload);
  EXPECT_EQ(e.code, "data_plane");
  EXPECT_NE(e.message.find("ncclSend failed"), std::string::npos) << e.message;
}

// An nccl session whose communicators are still being joined (hold_data_plane) holds the
// client's first push and every frame after it, then hands them to the handler in order once
// the plane is ready; frames before the first push go through at once. No handler waits.
TEST(SessionRings, HeldDataPlaneKeepsAPushAndWhatFollowsUntilReady) {
  using transport::MessageType;
  asio::io_context io;
  asio::local::stream_protocol::socket server_side(io), client_side(io);
  asio::local::connect_pair(server_side, client_side);
  std::vector<std::pair<uint16_t, uint32_t>> handled;  // (type, request id), in order
  auto session = std::make_shared<Session>(
      Session::Socket(std::move(server_side)), 1,
      [&](const auto&, transport::Frame f) { handled.emplace_back(f.type, f.request_id); },
      [](const auto&, const std::string&) {});
  session->hold_data_plane();
  session->start();
  const auto send = [&](MessageType type, uint32_t request) {
    const auto bytes = transport::encode_frame({static_cast<uint16_t>(type), request, "{}"});
    asio::write(client_side, asio::buffer(bytes));
  };
  const auto t = [](MessageType type, uint32_t request) {
    return std::make_pair(static_cast<uint16_t>(type), request);
  };
  send(MessageType::register_param, 1);
  send(MessageType::push, 2);
  send(MessageType::commit, 3);
  send(MessageType::health, 4);  // after the push: held too, so the order holds
  io.run_for(std::chrono::milliseconds(200));
  EXPECT_EQ(handled, (std::vector{t(MessageType::register_param, 1)}));
  session->set_data_plane_ready();
  EXPECT_EQ(handled, (std::vector{t(MessageType::register_param, 1), t(MessageType::push, 2),
                                  t(MessageType::commit, 3), t(MessageType::health, 4)}));
  send(MessageType::push, 5);  // once ready, straight through
  io.run_for(std::chrono::milliseconds(200));
  ASSERT_EQ(handled.size(), 5u);
  EXPECT_EQ(handled.back(), t(MessageType::push, 5));
  EXPECT_FALSE(session->closed());
}

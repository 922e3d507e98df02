// The credit logic every data plane's result ring shares, on the CPU: a session takes a chunk
// straight into a free slot (send_chunk_direct, the device-to-device path) only while nothing
// waits before it; a chunk without a credit waits as host bytes and is written through its
// plane's write_host, in order, as update_acks return slots; every update frame names the slot
// its bytes went to. The plane here records what it is given (the device planes need a GPU);
// the shared-memory plane itself is tested at the end, through a client's mapping.
// While the data plane is held (an nccl join), the client's frames from its first push on wait
// for it, in order; a push_ack waits, in order, until the plane has read its slot.
// A real Session on a real socket pair; the peer's side reads the frames.
#include <gtest/gtest.h>

#include "transport/asio.hpp"

#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "core/error.hpp"
#include "daemon/planes/shm_plane.hpp"
#include "daemon/session.hpp"
#include "kernels/bf16.hpp"
#include "kernels/streaming_copy.hpp"
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

// A real Session on one end of a socket pair; the test holds the other end.
struct SessionOnPair {
  SessionOnPair(Session::FrameHandler on_frame, Session::CloseHandler on_close) {
    asio::local::stream_protocol::socket server_side(io);
    asio::local::connect_pair(server_side, client_side);
    session = std::make_shared<Session>(Session::Socket(std::move(server_side)), 1,
                                        std::move(on_frame), std::move(on_close));
  }
  asio::io_context io;
  asio::local::stream_protocol::socket client_side{io};
  std::shared_ptr<Session> session;
};

using Handled = std::vector<std::pair<uint16_t, uint32_t>>;  // (type, request id), in order

// A frame handler that records what it is handed.
Session::FrameHandler recording(Handled& handled) {
  return
      [&handled](const auto&, transport::Frame f) { handled.emplace_back(f.type, f.request_id); };
}

// Writes a frame of `type` (empty JSON payload) as a client would.
void send_frame(asio::local::stream_protocol::socket& s, transport::MessageType type,
                uint32_t request) {
  const auto bytes = transport::encode_frame({static_cast<uint16_t>(type), request, "{}"});
  asio::write(s, asio::buffer(bytes));
}

std::pair<uint16_t, uint32_t> typed(transport::MessageType type, uint32_t request) {
  return {static_cast<uint16_t>(type), request};
}

// A data plane that hands each host write to `write`, and asks `gate` (when set) before each
// frame (the session's side of the credits and the gate is what these tests look at); reading
// chunks is not its job here.
class RecordingPlane final : public ServerPlane {
 public:
  using Write = std::function<AfterFrame(uint32_t slot, const std::vector<std::byte>& data,
                                         transport::DType dtype)>;
  using Gate = std::function<bool(const transport::Frame&)>;
  using Released = std::function<bool(uint32_t slot)>;
  RecordingPlane(uint32_t rx_slots, Write write, Gate gate = {}, Released released = {})
      : rx_slots_(rx_slots),
        write_(std::move(write)),
        gate_(std::move(gate)),
        released_(std::move(released)) {}
  transport::DataPlane kind() const override { return transport::DataPlane::cuda_ipc; }
  void describe(transport::HelloOk&) const override {}
  uint32_t rx_slots() const override { return rx_slots_; }
  bool gates_frames() const override { return static_cast<bool>(gate_); }
  bool frame_ready(const transport::Frame& f) override { return gate_(f); }
  Contribution receive(uint32_t, int64_t, transport::DType) override {
    throw InvalidArgument("not read in this test");
  }
  void read_received(uint32_t, void*, size_t) override {}
  void end_receive(uint32_t) override {}
  bool slot_released(uint32_t slot) override { return !released_ || released_(slot); }
  AfterFrame write_host(uint32_t slot, const std::byte* data, size_t bytes,
                        transport::DType dtype) override {
    return write_(slot, std::vector<std::byte>(data, data + bytes), dtype);
  }

 private:
  uint32_t rx_slots_;
  Write write_;
  Gate gate_;
  Released released_;
};

// A recording plane whose writes do nothing else.
std::unique_ptr<ServerPlane> quiet_plane(uint32_t rx_slots) {
  return std::make_unique<RecordingPlane>(
      rx_slots, [](uint32_t, const std::vector<std::byte>&, transport::DType) {
        return AfterFrame{};
      });
}

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
  SessionOnPair pair([](const auto&, transport::Frame) {}, [](const auto&, const std::string&) {});
  auto& [io, client_side, session] = pair;
  std::map<uint32_t, std::vector<std::byte>> written;  // what the writer put in each slot
  std::vector<uint32_t> writes;
  session->use_plane(std::make_unique<RecordingPlane>(
      2, [&](uint32_t slot, const std::vector<std::byte>& data, transport::DType dtype) {
        EXPECT_EQ(data.size(), 8u);
        EXPECT_EQ(dtype, transport::DType::f32);
        written[slot] = data;
        writes.push_back(slot);
        return Session::AfterFrame{};
      }));
  std::vector<uint32_t> direct;
  const auto write_direct = [&](uint32_t slot) {
    direct.push_back(slot);
    return Session::AfterFrame{};
  };
  // Two credits: two chunks go straight to slots 0 and 1.
  EXPECT_TRUE(session->send_chunk_direct(chunk(0), write_direct));
  EXPECT_TRUE(session->send_chunk_direct(chunk(2), write_direct));
  EXPECT_EQ(direct, (std::vector<uint32_t>{0, 1}));
  // No credit left: refused; the caller queues host bytes instead.
  EXPECT_FALSE(session->send_chunk_direct(chunk(4), write_direct));
  session->send_chunk(chunk(4), transport::DType::f32, std::vector<std::byte>(8, std::byte{4}));
  session->send_chunk(chunk(6), transport::DType::f32, std::vector<std::byte>(8, std::byte{6}));
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
    // Binary chunks name the parameter by the session's id, not by name.
    EXPECT_EQ(updates[i].param_id, 0u) << i;
    EXPECT_EQ(updates[i].name, "") << i;
  }
  EXPECT_EQ(session->param_name(0), "w");
  session->close("done");
  io.run_for(std::chrono::milliseconds(50));
}

// A write into a result slot that fails (a CUDA or NCCL error) ends the session with an error
// frame saying so: the client may already wait for the bytes.
TEST(SessionRings, FailedWriteSendsAnErrorAndCloses) {
  std::string closed_why;
  SessionOnPair pair([](const auto&, transport::Frame) {},
                     [&](const auto&, const std::string& why) { closed_why = why; });
  auto& [io, client_side, session] = pair;
  session->use_plane(quiet_plane(1));
  // The write succeeds; the transfer after the frame (an ncclSend) fails.
  EXPECT_TRUE(session->send_chunk_direct(chunk(0), [](uint32_t) -> Session::AfterFrame {
    return [] { throw DeviceError("ncclSend failed: remote process exited"); };
  }));
  io.run_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(session->closed());
  EXPECT_NE(closed_why.find("ncclSend failed"), std::string::npos) << closed_why;
  // What the client saw: the update frame, then the error.
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
  EXPECT_EQ(e.code, ErrorCode::data_plane);
  EXPECT_NE(e.message.find("ncclSend failed"), std::string::npos) << e.message;
}

// An nccl session whose communicators are still being joined (hold_data_plane) holds the
// client's first push and every frame after it, then hands them to the handler in order once
// the plane is ready; frames before the first push go through at once. No handler waits.
TEST(SessionRings, HeldDataPlaneKeepsAPushAndWhatFollowsUntilReady) {
  using transport::MessageType;
  Handled handled;
  SessionOnPair pair(recording(handled), [](const auto&, const std::string&) {});
  auto& [io, client_side, session] = pair;
  session->hold_data_plane();
  session->start();
  send_frame(client_side, MessageType::register_param, 1);
  send_frame(client_side, MessageType::push, 2);
  send_frame(client_side, MessageType::commit, 3);
  send_frame(client_side, MessageType::health, 4);  // after the push: held too, so the order holds
  io.run_for(std::chrono::milliseconds(200));
  EXPECT_EQ(handled, (std::vector{typed(MessageType::register_param, 1)}));
  session->set_data_plane_ready();
  EXPECT_EQ(handled,
            (std::vector{typed(MessageType::register_param, 1), typed(MessageType::push, 2),
                         typed(MessageType::commit, 3), typed(MessageType::health, 4)}));
  send_frame(client_side, MessageType::push, 5);  // once ready, straight through
  io.run_for(std::chrono::milliseconds(200));
  ASSERT_EQ(handled.size(), 5u);
  EXPECT_EQ(handled.back(), typed(MessageType::push, 5));
  EXPECT_FALSE(session->closed());
}

namespace {

// The frames the peer can read right now (non-blocking), appended to `frames`.
void drain(asio::local::stream_protocol::socket& peer, transport::FrameDecoder& decoder,
           std::vector<transport::Frame>& frames) {
  std::array<std::byte, 4096> buf;
  peer.non_blocking(true);
  for (;;) {
    boost::system::error_code ec;
    const size_t n = peer.read_some(asio::buffer(buf), ec);
    if (ec) break;
    decoder.feed(buf.data(), n);
  }
  while (auto f = decoder.next()) frames.push_back(std::move(*f));
}

}  // namespace

// gpu-review F1: on the nccl plane a result chunk's ncclSend spins on the GPU until the client
// posts its receive, which it does when the chunk's update frame arrives; any device-wide
// synchronization on the io thread meanwhile (a cudaFree) would then wait for a frame only that
// thread can write. So the transfer that follows a frame (what the slot write returns) runs only
// once that frame is in the socket: when each one runs, the peer can already read its frame,
// for chunks written directly and for chunks that waited for a credit alike, in frame order.
TEST(SessionRings, TransfersStartOnlyOnceTheirFrameIsWritten) {
  SessionOnPair pair([](const auto&, transport::Frame) {}, [](const auto&, const std::string&) {});
  auto& [io, client_side, session] = pair;
  transport::FrameDecoder decoder;
  std::vector<transport::Frame> seen;  // frames the peer had read by each transfer
  std::vector<int64_t> transfers;      // offsets, in the order their transfers started
  std::vector<bool> frame_was_there;   // per transfer: its frame readable at that moment
  const auto transfer_after = [&](int64_t offset) -> Session::AfterFrame {
    return [&, offset] {
      drain(client_side, decoder, seen);
      bool there = false;
      for (const auto& f : seen) {
        const auto u = transport::decode<transport::Update>(f.payload);
        there = there || u.offset == offset;
      }
      transfers.push_back(offset);
      frame_was_there.push_back(there);
    };
  };
  // The chunk that waits for a credit is the one at offset 4.
  session->use_plane(std::make_unique<RecordingPlane>(
      2, [&](uint32_t, const std::vector<std::byte>&, transport::DType) {
        return transfer_after(4);
      }));
  EXPECT_TRUE(session->send_chunk_direct(chunk(0), [&](uint32_t) { return transfer_after(0); }));
  EXPECT_TRUE(session->send_chunk_direct(chunk(2), [&](uint32_t) { return transfer_after(2); }));
  session->send_chunk(chunk(4), transport::DType::f32, std::vector<std::byte>(8));  // no credit
  // Nothing ran the io context yet: the frames are queued, no transfer may have started.
  EXPECT_TRUE(transfers.empty());
  io.run_for(std::chrono::milliseconds(100));
  EXPECT_EQ(transfers, (std::vector<int64_t>{0, 2}));
  session->release_rx_slot(0);  // the waiting chunk takes slot 0; its transfer follows its frame
  EXPECT_EQ(transfers.size(), 2u);
  io.restart();  // it ran out of work above
  io.run_for(std::chrono::milliseconds(100));
  EXPECT_EQ(transfers, (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(frame_was_there, (std::vector<bool>{true, true, true}));
  session->close("done");
  io.run_for(std::chrono::milliseconds(50));
}

// A session that closes with frames still queued drops their transfers unrun: the client never
// reads those frames, so it never posts the matching receives.
TEST(SessionRings, AClosingSessionStartsNoTransfer) {
  SessionOnPair pair([](const auto&, transport::Frame) {}, [](const auto&, const std::string&) {});
  auto& [io, client_side, session] = pair;
  int started = 0;
  session->use_plane(quiet_plane(2));
  EXPECT_TRUE(session->send_chunk_direct(
      chunk(0), [&](uint32_t) -> Session::AfterFrame { return [&] { ++started; }; }));
  session->close("client said goodbye");
  io.run_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(session->closed());
  EXPECT_EQ(started, 0);
}

// gpu-review F2: on the cuda_ipc plane a push is handled only once the client's copy into its
// slot is done on the GPU (and an update_ack once its copy out is), so that no stream of the
// server waits on a client's event. The session asks its gate on the io thread, holds the frame
// and every frame after it in order while the gate says no, and asks again by itself (no new
// bytes needed); frames before it go through at once; a gate that throws lets the frame through
// (its handler reports what is wrong with it).
TEST(SessionRings, GatedFramesWaitInOrderUntilTheGateOpens) {
  using transport::MessageType;
  Handled handled;
  SessionOnPair pair(recording(handled), [](const auto&, const std::string&) {});
  auto& [io, client_side, session] = pair;
  bool copy_done = false;
  int asked = 0;
  session->gate_frames([&](const transport::Frame& f) {
    ++asked;
    if (f.request_id == 9) throw InvalidArgument("slot 9 of 2");
    return f.type != static_cast<uint16_t>(MessageType::push) || copy_done;
  });
  session->start();
  send_frame(client_side, MessageType::register_param, 1);
  send_frame(client_side, MessageType::push, 2);
  send_frame(client_side, MessageType::commit, 3);  // behind the push: held too
  io.run_for(std::chrono::milliseconds(100));
  EXPECT_EQ(handled, (std::vector{typed(MessageType::register_param, 1)}));
  EXPECT_GT(asked, 3) << "the gate is asked again while it says no";
  copy_done = true;  // the GPU passed the client's copy: the next poll lets both through
  io.run_for(std::chrono::milliseconds(100));
  EXPECT_EQ(handled, (std::vector{typed(MessageType::register_param, 1),
                                  typed(MessageType::push, 2), typed(MessageType::commit, 3)}));
  send_frame(client_side, MessageType::push, 9);  // the gate throws: handled, the handler judges it
  io.run_for(std::chrono::milliseconds(100));
  ASSERT_EQ(handled.size(), 4u);
  EXPECT_EQ(handled.back(), typed(MessageType::push, 9));
  EXPECT_FALSE(session->closed());
  session->close("done");
  io.run_for(std::chrono::milliseconds(50));
}

// The session's parameter ids: handed out 0, 1, 2 in first-named order, stable per name, and an
// id never handed out refused with a message naming it (the push handler answers bad_request).
TEST(SessionRings, ParameterIdsAreHandedOutInOrderAndUnknownOnesAreNamed) {
  SessionOnPair pair([](const auto&, transport::Frame) {}, [](const auto&, const std::string&) {});
  auto& session = pair.session;
  EXPECT_EQ(session->param_id("a"), 0u);
  EXPECT_EQ(session->param_id("b"), 1u);
  EXPECT_EQ(session->param_id("a"), 0u);
  EXPECT_EQ(session->param_id("c"), 2u);
  EXPECT_EQ(session->param_name(1), "b");
  try {
    (void)session->param_name(3);
    ADD_FAILURE() << "id 3 was never handed out";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter id 3, which this session never handed out"),
              std::string::npos)
        << e.what();
  }
}

// A plane that gates frames is asked before each one once the session has it (use_plane wires
// its frame_ready into the session's gate): a push waits until the plane says its slot is
// written.
TEST(SessionRings, APlaneThatGatesFramesIsAskedBeforeEachOne) {
  using transport::MessageType;
  Handled handled;
  SessionOnPair pair(recording(handled), [](const auto&, const std::string&) {});
  auto& [io, client_side, session] = pair;
  bool open = false;
  session->use_plane(std::make_unique<RecordingPlane>(
      1, [](uint32_t, const std::vector<std::byte>&, transport::DType) { return AfterFrame{}; },
      [&open](const transport::Frame& f) {
        return f.type != static_cast<uint16_t>(MessageType::push) || open;
      }));
  session->start();
  send_frame(client_side, MessageType::push, 1);
  io.run_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(handled.empty());
  open = true;
  io.run_for(std::chrono::milliseconds(100));
  EXPECT_EQ(handled, (std::vector{typed(MessageType::push, 1)}));
  session->close("done");
  io.run_for(std::chrono::milliseconds(50));
}

// A push_ack returns its slot only once the plane's reads of it are done (a shm chunk's copy
// onto a GPU server's device, polled instead of waited for): it waits, and the frames queued
// after it wait behind it, in order, until the plane says the slot is released.
TEST(SessionRings, PushAcksWaitInOrderUntilThePlaneReleasedTheirSlots) {
  using transport::MessageType;
  SessionOnPair pair([](const auto&, transport::Frame) {}, [](const auto&, const std::string&) {});
  auto& [io, client_side, session] = pair;
  bool copied = false;
  int asked = 0;
  session->use_plane(std::make_unique<RecordingPlane>(
      1, [](uint32_t, const std::vector<std::byte>&, transport::DType) { return AfterFrame{}; },
      RecordingPlane::Gate{}, [&](uint32_t slot) {
        ++asked;
        return slot != 1 || copied;
      }));
  session->ack_push(0);  // released at once
  session->ack_push(1);  // its copy still runs
  session->send(MessageType::health_ok, "{}", 7);
  io.run_for(std::chrono::milliseconds(100));
  EXPECT_GT(asked, 3) << "the plane is asked again while it says no";
  transport::FrameDecoder decoder;
  std::array<std::byte, 4096> buf;
  auto read_frames = [&](size_t n) {
    std::vector<transport::Frame> out;
    while (out.size() < n) {
      while (auto f = decoder.next()) out.push_back(std::move(*f));
      if (out.size() >= n) break;
      decoder.feed(buf.data(), client_side.read_some(asio::buffer(buf)));
    }
    return out;
  };
  auto first = read_frames(1);
  ASSERT_EQ(first[0].type, static_cast<uint16_t>(MessageType::push_ack));
  EXPECT_EQ(transport::decode<transport::SlotAck>(first[0].payload).slot, 0u);
  EXPECT_EQ(client_side.available(), 0u) << "slot 1's ack, and what follows it, wait";
  copied = true;
  io.run_for(std::chrono::milliseconds(100));
  auto rest = read_frames(2);
  ASSERT_EQ(rest[0].type, static_cast<uint16_t>(MessageType::push_ack));
  EXPECT_EQ(transport::decode<transport::SlotAck>(rest[0].payload).slot, 1u);
  EXPECT_EQ(rest[1].type, static_cast<uint16_t>(MessageType::health_ok));
  EXPECT_EQ(rest[1].request_id, 7u);
  session->close("done");
  io.run_for(std::chrono::milliseconds(50));
}

// A shm session releases its tx slots in the segment's credit words, through a client's own
// mapping: no push_ack at all while the pusher does not sleep; one push_ack naming kWakeSlot for
// a pusher that asked to be woken, and then none again.
TEST(SessionRings, AShmSessionReleasesSlotsInItsSegmentAndWakesOnlyASleeper) {
  using transport::MessageType;
  SessionOnPair pair([](const auto&, transport::Frame) {}, [](const auto&, const std::string&) {});
  auto& [io, client_side, session] = pair;
  transport::SegmentLayout layout{2, 2, 4096};
  auto plane = make_shm_plane(layout);
  ASSERT_TRUE(plane->releases_in_segment());
  transport::HelloOk ok;
  plane->describe(ok);
  const auto client = transport::ShmSegment::open_and_unlink(ok.shm_name, layout);
  auto credits = client.tx_credits();
  session->use_plane(std::move(plane));

  session->ack_push(0);
  session->ack_push(1);
  session->ack_push(0);
  io.run_for(std::chrono::milliseconds(50));
  EXPECT_EQ(credits.released(0), 2u);
  EXPECT_EQ(credits.released(1), 1u);
  EXPECT_EQ(client_side.available(), 0u) << "no frame for a pusher that does not sleep";

  credits.ask_wake();
  session->ack_push(1);
  session->ack_push(1);
  io.run_for(std::chrono::milliseconds(50));
  EXPECT_EQ(credits.released(1), 3u);
  std::array<std::byte, 64> buf;
  transport::FrameDecoder decoder;
  decoder.feed(buf.data(), client_side.read_some(asio::buffer(buf)));
  const auto wake = decoder.next();
  ASSERT_TRUE(wake.has_value());
  EXPECT_EQ(wake->type, static_cast<uint16_t>(MessageType::push_ack));
  EXPECT_EQ(transport::decode<transport::SlotAck>(wake->payload).slot, transport::kWakeSlot);
  EXPECT_FALSE(decoder.next().has_value());
  EXPECT_EQ(client_side.available(), 0u) << "one wake per request";
  session->close("done");
  io.run_for(std::chrono::milliseconds(50));
}

// A plane that releases in its segment but whose reads of a slot still run (a shm chunk's copy
// onto a GPU server's device): the slots are released in the order of the acks, each once its
// reads are done, polled; a release waits behind an earlier one still running.
TEST(SessionRings, SegmentReleasesWaitInOrderUntilThePlaneReadTheirSlots) {
  SessionOnPair pair([](const auto&, transport::Frame) {}, [](const auto&, const std::string&) {});
  auto& [io, client_side, session] = pair;
  struct SegmentPlane final : ServerPlane {
    std::map<uint32_t, bool> done;
    std::vector<uint32_t> released;
    transport::DataPlane kind() const override { return transport::DataPlane::shm; }
    void describe(transport::HelloOk&) const override {}
    uint32_t rx_slots() const override { return 1; }
    Contribution receive(uint32_t, int64_t, transport::DType) override { return {}; }
    void read_received(uint32_t, void*, size_t) override {}
    void end_receive(uint32_t) override {}
    bool slot_released(uint32_t slot) override { return done[slot]; }
    bool releases_in_segment() const override { return true; }
    bool release_slot(uint32_t slot) override {
      released.push_back(slot);
      return false;
    }
    AfterFrame write_host(uint32_t, const std::byte*, size_t, transport::DType) override {
      return {};
    }
  };
  auto owned = std::make_unique<SegmentPlane>();
  SegmentPlane& plane = *owned;
  session->use_plane(std::move(owned));
  plane.done[1] = true;
  session->ack_push(0);  // its copy still runs
  session->ack_push(1);  // done, but behind slot 0
  io.run_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(plane.released.empty());
  plane.done[0] = true;
  io.run_for(std::chrono::milliseconds(50));
  EXPECT_EQ(plane.released, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(client_side.available(), 0u);
  session->close("done");
  io.run_for(std::chrono::milliseconds(50));
}

// The shared-memory plane, through a client's own mapping of its segment (as the client library
// maps it): a pushed chunk is read where it lies, fp32 and bf16 (the store widens bf16 exactly);
// an update's bytes land in the rx slot the client reads; closing unlinks a name no client
// mapped.
TEST(ShmPlane, ChunksAreReadInPlaceAndUpdatesLandInTheClientsMapping) {
  transport::SegmentLayout layout;
  layout.tx_slots = 2;
  layout.rx_slots = 3;
  layout.slot_bytes = 4096;
  auto plane = make_shm_plane(layout);
  EXPECT_EQ(plane->kind(), transport::DataPlane::shm);
  EXPECT_EQ(plane->rx_slots(), 3u);
  EXPECT_FALSE(plane->writes_device_updates());
  EXPECT_FALSE(plane->matches_transfers_in_order());
  transport::HelloOk ok;
  plane->describe(ok);
  ASSERT_FALSE(ok.shm_name.empty());
  auto client = transport::ShmSegment::open_and_unlink(ok.shm_name, layout);

  const std::vector<float> grad = {1.5f, -0.0f, 3.0e-39f, -7.25f};  // a subnormal, a -0
  std::memcpy(client.tx_slot(1), grad.data(), grad.size() * 4);
  auto store = make_host_contribution_store();
  store->resize(0, 4);
  store->write(0, 0, plane->receive(1, 4, transport::DType::f32), 0, 4, false);
  std::vector<float> out(4);
  store->read(0, 0, out.data(), 4, false);
  EXPECT_EQ(std::memcmp(out.data(), grad.data(), 16), 0);
  std::vector<float> copied(4);
  plane->read_received(1, copied.data(), 16);
  EXPECT_EQ(std::memcmp(copied.data(), grad.data(), 16), 0);

  const std::vector<uint16_t> bf16 = {f32_to_bf16(1.5f), f32_to_bf16(-2.0f), 0x8000, 0x7f80};
  std::memcpy(client.tx_slot(0), bf16.data(), bf16.size() * 2);
  store->write(0, 0, plane->receive(0, 4, transport::DType::bf16), 0, 4, false);
  store->read(0, 0, out.data(), 4, false);
  for (size_t i = 0; i < 4; ++i) {
    const float want = bf16_to_f32(bf16[i]);
    EXPECT_EQ(std::memcmp(&out[i], &want, 4), 0) << i;
  }
  plane->end_receive(0);

  std::vector<std::byte> update(24);
  for (size_t i = 0; i < update.size(); ++i) update[i] = std::byte(i * 7);
  const AfterFrame after = plane->write_host(2, update.data(), update.size(), transport::DType::f32);
  EXPECT_FALSE(after);  // nothing follows the frame on shared memory
  EXPECT_EQ(std::memcmp(client.rx_slot(2), update.data(), update.size()), 0);

  auto unmapped = make_shm_plane(layout);
  transport::HelloOk ok2;
  unmapped->describe(ok2);
  unmapped->closing();
  EXPECT_THROW(transport::ShmSegment::open_and_unlink(ok2.shm_name, layout), Error);
}

// A contribution buffer of kStreamingCopyBytes or more takes its first fp32 writes with
// streaming stores (kernels/streaming_copy.hpp): chunks written at odd offsets read back bit for
// bit, and a second write of elements already written in the step adds onto them exactly as the
// reduction's own loop does.
TEST(HostContributionStore, ALargeBufferReadsBackBitwiseAndAddsRepeatedChunks) {
  const int64_t n = static_cast<int64_t>(kStreamingCopyBytes / sizeof(float)) + 5;
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    a[static_cast<size_t>(i)] = static_cast<float>(i % 977) * 0.37f - 101.0f;
    b[static_cast<size_t>(i)] = static_cast<float>(i % 131) * -1.3e-3f;
  }
  a[7] = -0.0f;
  a[8] = 3.0e-39f;  // a subnormal
  auto store = make_host_contribution_store();
  store->resize(0, n);
  const Contribution first{a.data(), transport::DType::f32, false, n};
  for (int64_t off = 0; off < n; off += 65533) {  // chunks that leave every alignment
    store->write(0, off, first, off, std::min<int64_t>(65533, n - off), false);
  }
  const Contribution second{b.data(), transport::DType::f32, false, n};
  const int64_t again = 1001, again_n = 70001;
  store->write(0, again, second, again, again_n, true);
  std::vector<float> out(static_cast<size_t>(n));
  store->read(0, 0, out.data(), n, false);
  for (int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<size_t>(i);
    const float want = i >= again && i < again + again_n ? a[k] + b[k] : a[k];
    ASSERT_EQ(std::memcmp(&out[k], &want, 4), 0) << "element " << i;
  }
}

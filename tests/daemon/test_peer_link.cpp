// PeerLink (daemon/pool/peer_link.hpp), the asynchronous session a server opens to a peer server,
// against a real muon-offloadd process: driven from this test's own io_context, as a compute rank
// of a job of one (the protocol a relay or a replica session speaks is the same). Updates and
// momentum are bitwise the CPU kernels'; a missing server, a refused hello, a refused
// registration and a server killed under the link end every call owed with the right kind.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <optional>
#include <thread>

#include "daemon/pool/peer_link.hpp"
#include "kernels/backend.hpp"
#include "kernels/bf16.hpp"
#include "server_process.hpp"

namespace muon::testing {
namespace {

using daemon::LinkError;
using daemon::LinkResult;
using daemon::PeerLink;
using daemon::PeerLinkConfig;
using daemon::PeerLinkEvents;

// Runs `io` until `done()` or `limit` passes; false on the limit.
template <class Pred>
bool run_until(boost::asio::io_context& io, Pred done, std::chrono::milliseconds limit = 20s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    io.restart();
    io.run_for(5ms);
  }
  return true;
}

PeerLinkConfig rank0(const std::string& endpoint) {
  PeerLinkConfig c;
  c.endpoint = endpoint;
  c.rank = 0;
  c.world_size = 1;
  c.client_name = "test_peer_link";
  c.connect_timeout = 5s;
  c.op_timeout = 20s;
  return c;
}

transport::RegisterParam whole(const std::string& name, int64_t rows, int64_t cols,
                               DType dtype = DType::f32) {
  transport::RegisterParam r;
  r.name = name;
  r.shape = {rows, cols};
  r.grad_dtype = dtype;
  r.update_dtype = dtype;
  r.push = {{0, rows * cols}};
  r.want = {{0, rows * cols}};
  return r;
}

std::vector<float> gradient(int64_t n, int64_t step) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    g[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i) + 1.3f * step) * 0.01f;
  }
  return g;
}

struct Recorder {
  std::map<std::pair<std::string, int64_t>, std::vector<std::byte>> updates;
  std::vector<transport::ErrorMsg> errors;
  std::optional<LinkError> lost;
  bool connected = false;
  PeerLinkEvents events() {
    PeerLinkEvents e;
    e.connected = [this](const transport::HelloOk&) { connected = true; };
    e.update = [this](const std::string& name, int64_t step, bool applied,
                      std::vector<std::byte> values) {
      EXPECT_TRUE(applied);
      updates[{name, step}] = std::move(values);
    };
    e.error = [this](const transport::ErrorMsg& m) { errors.push_back(m); };
    e.lost = [this](const LinkError& why) { lost = why; };
    return e;
  }
};

class PeerLinkTest : public ::testing::Test {
 protected:
  fs::path dir = temp_dir();
  boost::asio::io_context io;
  Recorder rec;
};

// Three steps of a 384x512 matrix, fp32 and bf16: 12 chunks of 64 KiB slots (fp32) through a
// ring of 8, called before the hello is even answered; every update bitwise the kernels', the
// momentum fetched after them too.
TEST_F(PeerLinkTest, StepsThroughTheRingAreBitwiseTheKernels) {
  ServerProcess server(dir);
  auto link = PeerLink::open(io, rank0(server.socket()), rec.events());
  const int64_t rows = 384, cols = 512, n = rows * cols;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const std::string name = std::string("w_") + dtype_name(dtype);
    auto reg = whole(name, rows, cols, dtype);
    std::optional<LinkResult> registered;
    link->expect_updates(name, reg.want, dtype);
    link->register_param(reg, [&](LinkResult r, transport::RegisterOk) { registered = r; });
    BackendConfig bc;
    bc.cpu_threads = kThreads;
    auto backend = make_backend("cpu", bc);
    std::vector<float> momentum(static_cast<size_t>(n), 0.0f);
    for (int64_t step = 0; step < 3; ++step) {
      auto g = std::make_shared<std::vector<float>>(gradient(n, step));
      auto wire = std::make_shared<std::vector<uint16_t>>();
      std::span<const std::byte> bytes = std::as_bytes(std::span(*g));
      std::shared_ptr<const void> keep = g;
      if (dtype == DType::bf16) {  // the server widens what it receives: the reference does too
        wire->resize(static_cast<size_t>(n));
        narrow_from_f32(DType::bf16, std::span<const float>(*g), wire->data());
        widen_to_f32(DType::bf16, wire->data(), std::span(*g));
        bytes = std::as_bytes(std::span(*wire));
        keep = wire;
      }
      std::optional<LinkResult> pushed, committed;
      link->push(name, step, 0, bytes, dtype, transport::ChunkKind::gradient, keep,
                 [&](LinkResult r) { pushed = r; });
      link->commit(name, step, [&](LinkResult r) { committed = r; });
      ASSERT_TRUE(run_until(io, [&] { return rec.updates.count({name, step}) != 0; }))
          << "no update of " << name << " step " << step;
      ASSERT_TRUE(registered && !*registered);
      ASSERT_TRUE(pushed && !*pushed) << (*pushed)->message;
      ASSERT_TRUE(committed && !*committed);
      std::vector<float> expect(static_cast<size_t>(n));
      backend->muon_update(name, matrix_shape_from_dims(reg.shape, name), g->data(),
                           momentum.data(), expect.data(), reg.options);
      const auto& got = rec.updates[{name, step}];
      ASSERT_EQ(got.size(), static_cast<size_t>(n) * dtype_bytes(dtype));
      std::vector<float> widened(static_cast<size_t>(n));
      widen_to_f32(dtype, got.data(), std::span(widened));
      if (dtype == DType::bf16) {  // the server narrows its fp32 update for the wire
        std::vector<uint16_t> narrow(static_cast<size_t>(n));
        narrow_from_f32(DType::bf16, std::span<const float>(expect), narrow.data());
        widen_to_f32(DType::bf16, narrow.data(), std::span(expect));
      }
      EXPECT_EQ(std::memcmp(widened.data(), expect.data(), widened.size() * 4), 0)
          << name << " step " << step;
    }
    std::optional<LinkResult> fetched;
    std::vector<float> got_momentum;
    int64_t last = -2;
    link->fetch_momentum(name, n, 2, [&](LinkResult r, std::vector<float> v, int64_t s) {
      fetched = r;
      got_momentum = std::move(v);
      last = s;
    });
    ASSERT_TRUE(run_until(io, [&] { return fetched.has_value(); }));
    ASSERT_FALSE(*fetched) << (*fetched)->message;
    EXPECT_EQ(last, 2);
    EXPECT_EQ(std::memcmp(got_momentum.data(), momentum.data(), momentum.size() * 4), 0);
  }
  EXPECT_TRUE(rec.errors.empty());
  EXPECT_FALSE(rec.lost);
  link->close();
}

// No server: every call owed fails as lost, never connected, naming the endpoint, once the
// connect timeout has passed; the lost event says the same.
TEST_F(PeerLinkTest, NoServerFailsEveryCallAsNeverConnected) {
  auto cfg = rank0((dir / "nobody.sock").string());
  cfg.connect_timeout = 300ms;
  auto link = PeerLink::open(io, cfg, rec.events());
  std::optional<LinkResult> registered, pushed;
  auto g = std::make_shared<std::vector<float>>(64, 1.0f);
  link->register_param(whole("w", 8, 8), [&](LinkResult r, transport::RegisterOk) { registered = r; });
  link->push("w", 0, 0, std::as_bytes(std::span(*g)), DType::f32, transport::ChunkKind::gradient, g,
             [&](LinkResult r) { pushed = r; });
  const auto began = std::chrono::steady_clock::now();
  ASSERT_TRUE(run_until(io, [&] { return registered && pushed && rec.lost; }, 10s));
  EXPECT_GE(std::chrono::steady_clock::now() - began, 250ms);
  for (const auto* r : {&*registered, &*pushed}) {
    ASSERT_TRUE(r->has_value());
    EXPECT_EQ((*r)->kind, LinkError::Kind::lost);
    EXPECT_TRUE((*r)->never_connected);
    EXPECT_NE((*r)->message.find("cannot connect to muon-offloadd at '" + cfg.endpoint),
              std::string::npos)
        << (*r)->message;
  }
  EXPECT_TRUE(rec.lost->never_connected);
  EXPECT_FALSE(link->alive());
  EXPECT_FALSE(rec.connected);
  // Later calls fail at once, later (never inside the call).
  std::optional<LinkResult> late;
  link->commit("w", 0, [&](LinkResult r) { late = r; });
  EXPECT_FALSE(late.has_value());
  ASSERT_TRUE(run_until(io, [&] { return late.has_value(); }, 1s));
  EXPECT_EQ((*late)->kind, LinkError::Kind::lost);
}

// A tcp hello without the server's token is refused: the calls fail as refused, unauthorized.
TEST_F(PeerLinkTest, TcpHelloWithoutTheTokenIsRefused) {
  const auto port = free_tcp_port();
  const auto token = write_token_file(dir, "s3cret-token-0123456789abcdef");
  ServerProcess server(dir, {"--listen", "127.0.0.1:" + std::to_string(port),
                             "--auth-token-file", token});
  auto cfg = rank0("tcp://127.0.0.1:" + std::to_string(port));
  cfg.auth_token = "wrong";
  auto link = PeerLink::open(io, cfg, rec.events());
  std::optional<LinkResult> registered;
  link->register_param(whole("w", 8, 8), [&](LinkResult r, transport::RegisterOk) { registered = r; });
  ASSERT_TRUE(run_until(io, [&] { return registered.has_value(); }));
  ASSERT_TRUE(registered->has_value());
  EXPECT_EQ((*registered)->kind, LinkError::Kind::refused);
  EXPECT_EQ((*registered)->code, ErrorCode::unauthorized);
  EXPECT_TRUE((*registered)->never_connected);
  EXPECT_NE((*registered)->message.find("refused the hello"), std::string::npos);
}

// The server refuses a registration (a shape it cannot take): that call alone fails, refused
// with the server's code; the link stays up and a good registration after it is answered.
TEST_F(PeerLinkTest, ARefusedRegistrationFailsThatCallAlone) {
  ServerProcess server(dir);
  auto link = PeerLink::open(io, rank0(server.socket()), rec.events());
  auto bad = whole("bad", 8, 8);
  bad.push = {{0, 65}};  // beyond the 64 elements
  std::optional<LinkResult> refused, good;
  link->register_param(bad, [&](LinkResult r, transport::RegisterOk) { refused = r; });
  link->register_param(whole("good", 8, 8),
                       [&](LinkResult r, transport::RegisterOk) { good = r; });
  ASSERT_TRUE(run_until(io, [&] { return refused && good; }));
  ASSERT_TRUE(refused->has_value());
  EXPECT_EQ((*refused)->kind, LinkError::Kind::refused);
  EXPECT_EQ((*refused)->code, ErrorCode::bad_request);
  EXPECT_NE((*refused)->message.find("'bad'"), std::string::npos) << (*refused)->message;
  EXPECT_FALSE(*good);
  EXPECT_TRUE(link->alive());
}

// The server killed under the link: the update owed never comes, the link is lost (not never
// connected), a fetch queued meanwhile fails, and so does every later call.
TEST_F(PeerLinkTest, ServerKilledEndsWhatIsOwed) {
  auto server = std::make_unique<ServerProcess>(dir);
  auto link = PeerLink::open(io, rank0(server->socket()), rec.events());
  std::optional<LinkResult> registered;
  link->expect_updates("w", {{0, 64}}, DType::f32);
  link->register_param(whole("w", 8, 8), [&](LinkResult r, transport::RegisterOk) { registered = r; });
  ASSERT_TRUE(run_until(io, [&] { return registered.has_value(); }));
  ASSERT_FALSE(*registered);
  server->kill9();
  std::optional<LinkResult> fetched;
  link->fetch_momentum("w", 64, -1, [&](LinkResult r, std::vector<float>, int64_t) { fetched = r; });
  ASSERT_TRUE(run_until(io, [&] { return rec.lost && fetched; }));
  EXPECT_EQ(rec.lost->kind, LinkError::Kind::lost);
  EXPECT_FALSE(rec.lost->never_connected);
  ASSERT_TRUE(fetched->has_value());
  EXPECT_EQ((*fetched)->kind, LinkError::Kind::lost);
  EXPECT_NE((*fetched)->message.find("lost"), std::string::npos) << (*fetched)->message;
  EXPECT_FALSE(link->alive());
}

// close(): nothing owed is called any more, not even later.
TEST_F(PeerLinkTest, CloseCallsNothingOwed) {
  ServerProcess server(dir);
  auto link = PeerLink::open(io, rank0(server.socket()), rec.events());
  bool called = false;
  link->register_param(whole("w", 8, 8), [&](LinkResult, transport::RegisterOk) { called = true; });
  link->close();
  io.run_for(200ms);
  EXPECT_FALSE(called);
  EXPECT_FALSE(rec.lost);
}

// Rank 1 of a job of two on a raw socket: says hello, then reports whether the server tells it
// within `wait` that rank 0 was lost (an error frame: peer_lost naming rank 0).
class RawRank1 {
 public:
  explicit RawRank1(const std::string& socket) : sock_(io_) {
    sock_.connect(transport::resolve(transport::parse_endpoint(socket), io_));
    const auto hello = transport::encode_frame(
        {static_cast<uint16_t>(transport::MessageType::hello), 1,
         transport::encode(transport::Hello{1, 2, "raw rank 1"})});
    boost::asio::write(sock_, boost::asio::buffer(hello));
    const auto ok = next(5s);
    if (!ok || ok->type != static_cast<uint16_t>(transport::MessageType::hello_ok)) {
      throw std::runtime_error("raw rank 1: no hello_ok");
    }
  }
  bool told_rank0_lost(std::chrono::milliseconds wait) {
    const auto end = std::chrono::steady_clock::now() + wait;
    while (auto f = next(std::chrono::duration_cast<std::chrono::milliseconds>(
               end - std::chrono::steady_clock::now()))) {
      if (f->type != static_cast<uint16_t>(transport::MessageType::error)) continue;
      const auto e = transport::decode<transport::ErrorMsg>(f->payload);
      if (e.code == ErrorCode::peer_lost && e.rank == 0) return true;
    }
    return false;
  }

 private:
  // The next frame within `wait`, or nullopt.
  std::optional<transport::Frame> next(std::chrono::milliseconds wait) {
    const auto end = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < end) {
      if (auto f = decoder_.next()) return f;
      sock_.non_blocking(true);
      std::array<std::byte, 4096> buf;
      boost::system::error_code ec;
      const size_t n = sock_.read_some(boost::asio::buffer(buf), ec);
      if (ec == boost::asio::error::would_block) {
        std::this_thread::sleep_for(5ms);
        continue;
      }
      if (ec) return std::nullopt;
      decoder_.feed(buf.data(), n);
    }
    return decoder_.next();
  }
  boost::asio::io_context io_;
  boost::asio::generic::stream_protocol::socket sock_;
  transport::FrameDecoder decoder_;
};

// leave() says goodbye: the server does not take the link's rank for lost and tells the job's
// other ranks nothing; close() (no goodbye) is a lost rank, and they are told at once.
TEST_F(PeerLinkTest, LeaveSaysGoodbyeCloseIsALostRank) {
  ServerProcess server(dir);
  for (const bool orderly : {true, false}) {
    auto cfg = rank0(server.socket());
    cfg.world_size = 2;
    Recorder r;
    auto link = PeerLink::open(io, cfg, r.events());
    ASSERT_TRUE(run_until(io, [&] { return r.connected; }));
    RawRank1 other(server.socket());
    if (orderly) link->leave();
    else link->close();
    run_until(io, [] { return false; }, 200ms);  // the goodbye goes out
    EXPECT_EQ(other.told_rank0_lost(1s), !orderly) << (orderly ? "leave()" : "close()");
    EXPECT_FALSE(r.lost);  // neither raises the lost event
  }
}

}  // namespace
}  // namespace muon::testing

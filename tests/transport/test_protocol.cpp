// Control-plane frames and messages: round trips, stream reassembly, and a clear error for each
// kind of bad input.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <limits>
#include <random>

#include "kernels/bf16.hpp"
#include "transport/frame.hpp"
#include "transport/messages.hpp"

using namespace muon;
using namespace muon::transport;

namespace {

template <class F>
void expect_protocol_error(F&& f, const std::string& needle) {
  try {
    f();
    FAIL() << "expected ProtocolError containing: " << needle;
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Frame, RoundTripAndReassemblyFromAnyCut) {
  std::vector<Frame> frames = {{2, 1, R"({"rank":0,"world_size":1})"}, {4, 2, "{}"}, {8, 0, ""}};
  std::vector<std::byte> stream;
  for (const auto& f : frames) {
    auto b = encode_frame(f);
    stream.insert(stream.end(), b.begin(), b.end());
  }
  std::mt19937 rng(1);
  for (int trial = 0; trial < 50; ++trial) {
    FrameDecoder d;
    std::vector<Frame> got;
    for (size_t pos = 0; pos < stream.size();) {
      const size_t n = std::min(stream.size() - pos, size_t{1} + rng() % 7);
      d.feed(stream.data() + pos, n);
      pos += n;
      while (auto f = d.next()) got.push_back(*f);
    }
    ASSERT_EQ(got.size(), frames.size());
    for (size_t i = 0; i < frames.size(); ++i) {
      EXPECT_EQ(got[i].type, frames[i].type);
      EXPECT_EQ(got[i].request_id, frames[i].request_id);
      EXPECT_EQ(got[i].payload, frames[i].payload);
    }
    EXPECT_EQ(d.buffered(), 0u);
  }
}

TEST(Frame, BadHeadersAreRefusedAndTheDecoderStaysFailed) {
  auto good = encode_frame({4, 1, "{}"});
  auto bad_magic = good;
  bad_magic[0] = std::byte{'X'};
  expect_protocol_error([&] { decode_frame_header(bad_magic.data()); }, "bad frame magic");
  auto v9 = good;
  v9[4] = std::byte{9};
  expect_protocol_error([&] { decode_frame_header(v9.data()); },
                        "protocol version mismatch: peer speaks 9, this build speaks " +
                            std::to_string(kProtocolVersion));
  auto big = good;
  big[11] = std::byte{0x7f};
  expect_protocol_error([&] { decode_frame_header(big.data()); }, "exceeds the limit");
  expect_protocol_error(
      [&] {
        encode_frame({4, 1, std::string(kMaxPayload + 1, 'x')});
      },
      "exceeds the limit");
  FrameDecoder d;
  d.feed(bad_magic.data(), bad_magic.size());
  expect_protocol_error([&] { d.next(); }, "bad frame magic");
  expect_protocol_error([&] { d.feed(good.data(), good.size()); }, "already failed");
}

TEST(Frame, BufferedCountsTheHeaderOfAnIncompleteFrame) {
  // fuzz_frame input: a health frame, then a commit frame whose last 3 payload bytes have not
  // arrived yet. buffered() said 18 (the header already parsed was not counted), not 34.
  // The frames are encoded here so the input speaks this build's protocol version.
  auto bytes = encode_frame({4, 9, ""});                                   // health, request 9
  const auto commit_frame = encode_frame({10, 4, R"({"name":"w","step":7})"});  // 21-byte payload
  ASSERT_EQ(commit_frame.size(), 16u + 21u);
  bytes.insert(bytes.end(), commit_frame.begin(), commit_frame.end() - 3);  // 18 of the 21
  ASSERT_EQ(bytes.size(), 50u);
  FrameDecoder d;
  d.feed(bytes.data(), bytes.size());
  EXPECT_EQ(d.buffered(), 50u);
  const auto health = d.next();
  ASSERT_TRUE(health.has_value());
  EXPECT_EQ(health->request_id, 9u);
  EXPECT_EQ(d.buffered(), 34u);
  EXPECT_FALSE(d.next().has_value());
  EXPECT_EQ(d.buffered(), 34u);
  d.feed(commit_frame.data() + commit_frame.size() - 3, 3);
  const auto commit = d.next();
  ASSERT_TRUE(commit.has_value());
  EXPECT_EQ(commit->payload, R"({"name":"w","step":7})");
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(Messages, RegisterRoundTripKeepsEveryOption) {
  RegisterParam m;
  m.name = "layers.0.attn.qkv";
  m.shape = {3072, 1024};
  m.grad_dtype = DType::bf16;
  m.update_dtype = DType::f32;
  m.options.momentum = {MomentumConvention::ema, 0.9f, false};
  m.options.orthogonalize.schedule = "polar_express";
  m.options.orthogonalize.steps = 8;
  m.options.orthogonalize.coefficients = {3.0, -3.2, 1.2};
  m.options.orthogonalize.eps = 1e-6f;
  m.options.orthogonalize.eps_mode = EpsMode::clamp;
  m.options.orthogonalize.scale_rule = ScaleRule::match_adamw;
  m.options.orthogonalize.extra_scale = 0.5;
  m.options.orthogonalize.row_splits = {1024, 1024, 1024};
  m.options.orthogonalize.algorithm = NsAlgorithm::syrk;
  m.options.orthogonalize.precision = Precision::bf16;
  m.options.orthogonalize.nonfinite = NonFinitePolicy::skip;
  m.push = {{0, 100}, {200, 300}};
  m.want = {{0, 3072 * 1024}};
  const auto back = decode<RegisterParam>(encode(m));
  EXPECT_EQ(encode(back), encode(m));
  EXPECT_EQ(back.options.orthogonalize.row_splits, m.options.orthogonalize.row_splits);
  EXPECT_EQ(back.options.orthogonalize.coefficients, m.options.orthogonalize.coefficients);
  EXPECT_EQ(back.options.momentum.convention, MomentumConvention::ema);
  EXPECT_EQ(back.push[1].end, 300);
}

TEST(Messages, AColumnShardRegistersAsOneBlockEntryAndExpandsToItsRows) {
  // Columns [1024, 2048) of a 14336 x 4096 matrix: 14336 ranges, more than a list may hold as
  // pairs (4096), one entry as a block.
  RegisterParam m;
  m.name = "layers.0.mlp.down";
  m.shape = {14336, 4096};
  for (int64_t r = 0; r < 14336; ++r) m.push.push_back({r * 4096 + 1024, r * 4096 + 2048});
  m.want = m.push;
  m.packed = true;
  const auto wire = encode(m);
  const auto j = nlohmann::json::parse(wire);
  EXPECT_EQ(j["push"], nlohmann::json::parse("[[1024, 2048, 14336, 4096]]"));
  EXPECT_EQ(j["packed"], true);
  const auto back = decode<RegisterParam>(wire);
  EXPECT_EQ(back.push, m.push);
  EXPECT_EQ(back.want, m.want);
  EXPECT_TRUE(back.packed);
  // Absent (older clients): element offsets.
  auto older = j;
  older.erase("packed");
  EXPECT_FALSE(decode<RegisterParam>(older.dump()).packed);
  // A malformed block is a protocol error naming the field.
  auto bad = j;
  bad["push"] = nlohmann::json::parse("[[0, 8, 3, 4]]");
  try {
    decode<RegisterParam>(bad.dump());
    FAIL() << "overlapping rows accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("field 'push': block [0, 8) x 3 rows, pitch 4 has "
                                         "overlapping rows"),
              std::string::npos)
        << e.what();
  }
  bad["push"] = nlohmann::json::parse("[[0, 8, 3]]");
  EXPECT_THROW(decode<RegisterParam>(bad.dump()), ProtocolError);
}

TEST(Messages, HelloOkSaysWhatSurvivesACrash) {
  HelloOk ok;
  ok.server_version = "muon-offloadd test";
  ok.shm_name = "/x";
  ok.tx_slots = ok.rx_slots = 4;
  ok.slot_bytes = 4096;
  ok.snapshot_path = "/var/lib/momentum.safetensors";
  ok.snapshot_every = 50;
  const auto back = decode<HelloOk>(encode(ok));
  EXPECT_EQ(back.snapshot_path, ok.snapshot_path);
  EXPECT_EQ(back.snapshot_every, 50);
  // Absent on the wire: no snapshot, none periodic (a server that does not say).
  ok.snapshot_path.clear();
  ok.snapshot_every = 0;
  const auto text = encode(ok);
  EXPECT_EQ(text.find("snapshot"), std::string::npos);
  EXPECT_EQ(decode<HelloOk>(text).snapshot_every, 0);
  expect_protocol_error(
      [] {
        decode<HelloOk>(R"({"session":"1","server_version":"v","shm_name":"/x","tx_slots":4,)"
                        R"("rx_slots":4,"slot_bytes":4096,"snapshot_every":-3})");
      },
      "field 'snapshot_every' = -3 is outside");
}

// A push chunk is a slot, but at most 256 KiB on shm (kShmChunkBytes), whatever the slot size;
// the device planes fill whole slots.
TEST(Messages, PushChunksAreASlotAndAtMost256KiBOnShm) {
  HelloOk ok;
  ok.slot_bytes = 64 << 10;
  EXPECT_EQ(push_chunk_bytes(ok), uint64_t{64} << 10);
  ok.slot_bytes = 4 << 20;
  EXPECT_EQ(push_chunk_bytes(ok), uint64_t{256} << 10);
  ok.data_plane = DataPlane::cuda_ipc;
  EXPECT_EQ(push_chunk_bytes(ok), uint64_t{4} << 20);
  ok.data_plane = DataPlane::nccl;
  EXPECT_EQ(push_chunk_bytes(ok), uint64_t{4} << 20);
}

TEST(Messages, RelayHelloCarriesItsServerIdAndARankAboveTheComputeRanks) {
  Hello h;
  h.world_size = 8;
  h.relay_server = 3;
  h.rank = relay_rank(8, 3);
  const auto back = decode<Hello>(encode(h));
  EXPECT_EQ(back.relay_server, 3);
  EXPECT_EQ(back.rank, 11);
  EXPECT_EQ(decode<Hello>(encode(Hello{})).relay_server, -1);  // absent: a compute rank
  EXPECT_EQ(encode(Hello{}).find("relay_server"), std::string::npos);
  // A relay's rank is exactly world_size + its id; a compute rank stays below world_size.
  expect_protocol_error([] { decode<Hello>(R"({"rank":3,"world_size":8,"relay_server":3})"); },
                        "field 'rank' = 3 is outside [11, 11]");
  expect_protocol_error([] { decode<Hello>(R"({"rank":8,"world_size":8,"relay_server":-1})"); },
                        "field 'relay_server' = -1 is outside [0, 65535]");
  expect_protocol_error([] { decode<Hello>(R"({"rank":11,"world_size":8})"); },
                        "field 'rank' = 11 is outside [0, 7]");
}

TEST(Messages, ReplicaHelloAndSealRoundTrip) {
  Hello h;
  h.world_size = 8;
  h.replica_server = 2;
  h.rank = replica_rank(8, 2);
  const auto back = decode<Hello>(encode(h));
  EXPECT_EQ(back.replica_server, 2);
  EXPECT_EQ(back.relay_server, -1);
  EXPECT_EQ(back.rank, 8 + kMaxRelayServers + 2);  // above every relay rank
  EXPECT_EQ(encode(Hello{}).find("replica_server"), std::string::npos);
  expect_protocol_error([] { decode<Hello>(R"({"rank":11,"world_size":8,"replica_server":2})"); },
                        "field 'rank' = 11 is outside");
  expect_protocol_error(
      [] { decode<Hello>(R"({"rank":11,"world_size":8,"relay_server":3,"replica_server":3})"); },
      "not both");
  RegisterParam seal;
  seal.name = "w";
  seal.shape = {4, 4};
  seal.replica = true;
  seal.replica_step = -1;
  seal.replica_outcome = "registered";
  const auto s2 = decode<RegisterParam>(encode(seal));
  EXPECT_TRUE(s2.replica);
  EXPECT_EQ(s2.replica_step, -1);
  EXPECT_EQ(s2.replica_outcome, "registered");
  EXPECT_TRUE(s2.replica_registrants.empty());  // an owner that sends none
  EXPECT_EQ(encode(seal).find("replica_registrants"), std::string::npos);
  // The owner's registrants and their ranges (a column block as one block on the wire).
  seal.replica_registrants = {{1, {{0, 16}}, {{0, 16}}, false},
                              {relay_rank(8, 0), {{1, 3}, {5, 7}, {9, 11}}, {}, true}};
  const auto s3 = decode<RegisterParam>(encode(seal));
  ASSERT_EQ(s3.replica_registrants.size(), 2u);
  EXPECT_EQ(s3.replica_registrants[0].rank, 1);
  EXPECT_EQ(s3.replica_registrants[0].push, (std::vector<Range>{{0, 16}}));
  EXPECT_FALSE(s3.replica_registrants[0].packed);
  EXPECT_EQ(s3.replica_registrants[1].rank, relay_rank(8, 0));
  EXPECT_EQ(s3.replica_registrants[1].push, (std::vector<Range>{{1, 3}, {5, 7}, {9, 11}}));
  EXPECT_TRUE(s3.replica_registrants[1].want.empty());
  EXPECT_TRUE(s3.replica_registrants[1].packed);
  std::string bad = encode(seal);
  bad.replace(bad.find("\"rank\":1,"), 9, "\"rank\":-1,");
  expect_protocol_error([&] { decode<RegisterParam>(bad); },
                        "register_param.replica_registrants[]: field 'rank' = -1");
  seal.replica_registrants.clear();
  // A registration carries none of it.
  seal.replica = false;
  EXPECT_EQ(encode(seal).find("replica"), std::string::npos);
  EXPECT_FALSE(decode<RegisterParam>(encode(seal)).replica);
  for (auto k : {ChunkKind::replica_momentum, ChunkKind::replica_update}) {
    Push p{"w", 3, 0, 16, 1, k};
    EXPECT_EQ(decode<Push>(encode(p)).kind, k);
  }
}

TEST(Messages, EachBadFieldIsNamed) {
  expect_protocol_error([] { decode<Hello>("[1,2]"); }, "hello: payload must be a JSON object");
  expect_protocol_error([] { decode<Hello>(R"({"rank":0})"); }, "missing field 'world_size'");
  expect_protocol_error([] { decode<Hello>(R"({"rank":"0","world_size":2})"); },
                        "field 'rank' must be an integer");
  expect_protocol_error([] { decode<Hello>(R"({"rank":2,"world_size":2})"); },
                        "field 'rank' = 2 is outside [0, 1]");
  // Push, Update and SlotAck are binary: tests/transport/test_chunk_header.cpp.
  RegisterParam base;
  base.name = "w";
  base.shape = {4, 4};
  base.push = {{0, 16}};
  base.want = {{0, 16}};
  auto with = [&](const std::string& key, const std::string& value) {
    auto j = encode(base);
    const auto at = j.find("\"" + key + "\":");
    const auto start = at + key.size() + 3;
    size_t end = start;
    int depth = 0;
    for (; end < j.size(); ++end) {
      const char ch = j[end];
      if (ch == '[' || ch == '{') ++depth;
      if (ch == ']' || ch == '}') {
        if (depth == 0) break;
        --depth;
      }
      if (ch == ',' && depth == 0) break;
    }
    return j.substr(0, start) + value + j.substr(end);
  };
  expect_protocol_error([&] { decode<RegisterParam>(with("shape", "[16]")); },
                        "a flat buffer without a matrix shape is refused");
  expect_protocol_error([&] { decode<RegisterParam>(with("shape", "[4,0]")); },
                        "must hold positive integers");
  expect_protocol_error([&] { decode<RegisterParam>(with("push", "[[5,2]]")); },
                        "invalid range [5, 2)");
  expect_protocol_error([&] { decode<RegisterParam>(with("grad_dtype", "\"f16\"")); },
                        "unknown dtype 'f16'");
  expect_protocol_error([&] { decode<RegisterParam>(with("name", "\"\"")); },
                        "'name' must not be empty");
  // The scale rule is checked while decoding (the schedule name later, at registration).
  auto bad_scale = with(
      "options",
      R"({"momentum":"sum","mu":0.95,"nesterov":true,"schedule":"keller","steps":0,"eps":1e-7,"eps_mode":"add","scale":"spectral","extra_scale":1,"row_splits":[],"algorithm":"plain","precision":"default","nonfinite":"error"})");
  expect_protocol_error([&] { decode<RegisterParam>(bad_scale); }, "unknown scale rule 'spectral'");
}

TEST(Messages, FloatOptionsBeyondTheFloatRangeAreRefused) {
  // fuzz_frame input (round trip broken): mu = 1e39 became inf, which encode() wrote as null, so
  // a registration with client-held momentum (mu unchecked) gave a snapshot that cannot be read.
  const std::string options =
      R"({"momentum":"none","mu":1e39,"nesterov":true,"schedule":"keller","steps":0,)"
      R"("eps":1e-7,"eps_mode":"add","scale":"keller","extra_scale":1,"row_splits":[],)"
      R"("algorithm":"plain","precision":"default","nonfinite":"error"})";
  expect_protocol_error([&] { options_from_json(options); },
                        "field 'mu' = 1e+39 is outside the range of a float");
  auto eps = options;
  eps.replace(eps.find("1e39"), 4, "0.9");
  eps.replace(eps.find("1e-7"), 4, "-4e38");
  expect_protocol_error([&] { options_from_json(eps); }, "field 'eps' = -4e+38 is outside");
  // The largest float itself still round-trips.
  auto largest = options;
  largest.replace(largest.find("1e39"), 4, "3.4028234663852886e38");
  const auto back = options_from_json(largest);
  EXPECT_EQ(back.momentum.mu, std::numeric_limits<float>::max());
  EXPECT_EQ(options_to_json(options_from_json(options_to_json(back))), options_to_json(back));
}

TEST(Bf16, RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  const float nan = bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()));
  EXPECT_TRUE(std::isnan(nan));
  // The largest finite float rounds to infinity in bf16, as torch does.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
}

TEST(Messages, ErrorsCarryTheirCodeAsNameAndStableInteger) {
  const ErrorMsg e{ErrorCode::peer_lost, "rank 1 disconnected", "w", 7, 1};
  const auto wire = nlohmann::json::parse(encode(e));
  EXPECT_EQ(wire.at("code"), "peer_lost");
  EXPECT_EQ(wire.at("code_id"), 5);
  const auto back = decode<ErrorMsg>(encode(e));
  EXPECT_EQ(back.code, ErrorCode::peer_lost);
  EXPECT_EQ(back.step, 7);
  // A peer that predates code_id: the name alone; a name this build does not know: internal.
  EXPECT_EQ(decode<ErrorMsg>(R"({"code":"timeout","message":"m"})").code, ErrorCode::timeout);
  const auto future = decode<ErrorMsg>(R"({"code":"from_the_future","code_id":99,"message":"m"})");
  EXPECT_EQ(future.code, ErrorCode::internal);
  EXPECT_EQ(nlohmann::json::parse(encode(future)).at("code"), "internal");
  // Name and integer must agree when both are known.
  expect_protocol_error(
      [] { decode<ErrorMsg>(R"({"code":"timeout","code_id":5,"message":"m"})"); },
      "field 'code_id' = 5 is not the code 'timeout' (6)");
}

// The binary data-chunk payloads (transport/chunk_header.hpp): Push, Update and SlotAck round
// trips field by field, the header's bytes at their documented offsets, and every malformed
// payload (short, long, bad magic, bad kind, flags, ids, ranges) refused with a ProtocolError
// that names the message and the field.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "transport/chunk_header.hpp"
#include "transport/messages.hpp"

using namespace muon;
using namespace muon::transport;

namespace {

template <class F>
void expect_chunk_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no ProtocolError (expected one containing '" << needle << "')";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

uint64_t le(const std::string& p, size_t at, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i)
    v |= uint64_t{static_cast<unsigned char>(p[at + i])} << (8 * i);
  return v;
}
void set_le(std::string& p, size_t at, size_t bytes, uint64_t v) {
  for (size_t i = 0; i < bytes; ++i) p[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

Push sample_push() {
  Push m;
  m.param_id = 7;
  m.step = (int64_t{1} << 40) + 3;
  m.offset = 123456789;
  m.count = 4096;
  m.slot = 65536;
  m.kind = ChunkKind::momentum;
  m.attempt = 5;
  return m;
}

}  // namespace

TEST(ChunkMessages, PushRoundTripsAtTheDocumentedOffsets) {
  const Push m = sample_push();
  const std::string p = encode(m);
  ASSERT_EQ(p.size(), kChunkHeaderBytes);
  EXPECT_EQ(le(p, 0, 4), kChunkMagic);
  EXPECT_EQ(le(p, 4, 1), 1u);  // momentum
  EXPECT_EQ(le(p, 5, 1), 0u);
  EXPECT_EQ(le(p, 6, 2), 0u);
  EXPECT_EQ(le(p, 8, 4), 7u);
  EXPECT_EQ(le(p, 12, 4), 65536u);
  EXPECT_EQ(le(p, 16, 4), 5u);
  EXPECT_EQ(le(p, 24, 8), (uint64_t{1} << 40) + 3);
  EXPECT_EQ(le(p, 32, 8), 123456789u);
  EXPECT_EQ(le(p, 40, 8), 4096u);
  const Push d = decode<Push>(p);
  EXPECT_EQ(d.param_id, 7u);
  EXPECT_EQ(d.name, "");
  EXPECT_EQ(d.step, m.step);
  EXPECT_EQ(d.offset, m.offset);
  EXPECT_EQ(d.count, m.count);
  EXPECT_EQ(d.slot, m.slot);
  EXPECT_EQ(d.kind, ChunkKind::momentum);
  EXPECT_EQ(d.attempt, 5u);
}

TEST(ChunkMessages, ReplicaChunksCarryTheirNameInsteadOfAnId) {
  for (auto k : {ChunkKind::replica_momentum, ChunkKind::replica_update}) {
    Push m{"layers.3.w", 9, 0, 16, 1, k};  // param_id: kNoParamId
    const std::string p = encode(m);
    EXPECT_EQ(p.size(), kChunkHeaderBytes + m.name.size());
    EXPECT_EQ(le(p, 8, 4), kNoParamId);
    const Push d = decode<Push>(p);
    EXPECT_EQ(d.name, "layers.3.w");
    EXPECT_EQ(d.param_id, kNoParamId);
    EXPECT_EQ(d.kind, k);
    EXPECT_EQ(d.step, 9);
  }
  // With an id, the name stays home.
  Push m{"w", 1, 0, 1, 0, ChunkKind::gradient, 0, 3};
  EXPECT_EQ(encode(m).size(), kChunkHeaderBytes);
}

TEST(ChunkMessages, UpdateRoundTripsItsFlags) {
  for (bool last : {false, true}) {
    for (bool applied : {false, true}) {
      Update u;
      u.param_id = 2;
      u.step = -1;  // never-stepped momentum
      u.offset = 64;
      u.count = 32;
      u.slot = 3;
      u.kind = ChunkKind::momentum;
      u.last = last;
      u.applied = applied;
      const std::string p = encode(u);
      EXPECT_EQ(le(p, 5, 1), (last ? 1u : 0u) | (applied ? 2u : 0u));
      const Update d = decode<Update>(p);
      EXPECT_EQ(d.param_id, 2u);
      EXPECT_EQ(d.step, -1);
      EXPECT_EQ(d.offset, 64);
      EXPECT_EQ(d.count, 32);
      EXPECT_EQ(d.slot, 3u);
      EXPECT_EQ(d.kind, ChunkKind::momentum);
      EXPECT_EQ(d.last, last);
      EXPECT_EQ(d.applied, applied);
    }
  }
}

TEST(ChunkMessages, SlotAckIsEightBytes) {
  const std::string p = encode(SlotAck{4242});
  ASSERT_EQ(p.size(), kSlotAckBytes);
  EXPECT_EQ(le(p, 0, 4), kSlotAckMagic);
  EXPECT_EQ(decode<SlotAck>(p).slot, 4242u);
  expect_chunk_error([] { decode<SlotAck>(R"({"slot":1})"); }, "slot_ack: payload of 10 bytes");
  std::string bad = p;
  bad[0] = 'X';
  expect_chunk_error([&] { decode<SlotAck>(bad); }, "slot_ack: bad magic");
  bad = p;
  set_le(bad, 4, 4, 70000);
  expect_chunk_error([&] { decode<SlotAck>(bad); }, "field 'slot' = 70000 is outside");
}

TEST(ChunkMessages, MalformedChunksAreRefusedNamingTheField) {
  const std::string good = encode(sample_push());
  // A JSON push of protocol 1, a short header, a long one.
  expect_chunk_error([] { decode<Push>(R"({"name":"w","step":0,"offset":0,"count":1,"slot":0})"); },
                     "push: not a chunk header (bad magic");
  expect_chunk_error([&] { decode<Push>(good.substr(0, 47)); },
                     "push: payload of 47 bytes is shorter than the 48-byte chunk header");
  expect_chunk_error([&] { decode<Update>(""); }, "update: payload of 0 bytes is shorter");
  expect_chunk_error([&] { decode<Push>(good + "x"); }, "is not the header and the 0-byte name");
  const auto with = [&](size_t at, size_t bytes, uint64_t v) {
    std::string p = good;
    set_le(p, at, bytes, v);
    return p;
  };
  expect_chunk_error([&] { decode<Push>(with(0, 4, 0x4E4F554D)); }, "not a chunk header");
  expect_chunk_error([&] { decode<Push>(with(4, 1, 4)); }, "field 'kind' = 4 is not a chunk kind");
  expect_chunk_error([&] { decode<Push>(with(5, 1, 1)); }, "push: field 'flags' = 1");
  expect_chunk_error([&] { decode<Push>(with(8, 4, kNoParamId)); }, "by param_id or by name");
  expect_chunk_error([&] { decode<Push>(with(8, 4, kMaxParamIds)); }, "field 'param_id' = ");
  expect_chunk_error([&] { decode<Push>(with(12, 4, 65537)); }, "field 'slot' = 65537");
  expect_chunk_error([&] { decode<Push>(with(16, 4, (1u << 30) + 1)); }, "field 'attempt'");
  expect_chunk_error([&] { decode<Push>(with(20, 4, 1)); }, "reserved header bytes");
  expect_chunk_error([&] { decode<Push>(with(24, 8, static_cast<uint64_t>(-1))); },
                     "push: field 'step' = -1 is outside");
  expect_chunk_error([&] { decode<Push>(with(32, 8, static_cast<uint64_t>(-5))); },
                     "field 'offset' = -5");
  expect_chunk_error([&] { decode<Push>(with(40, 8, (uint64_t{1} << 40) + 1)); },
                     "field 'count' = ");
  // A name announced but missing, and a name beside an id.
  expect_chunk_error([&] { decode<Push>(with(6, 2, 3)); }, "the 3-byte name it announces");
  std::string named = with(6, 2, 1) + "w";
  expect_chunk_error([&] { decode<Push>(named); }, "by param_id or by name");
  // An update: unknown flag bits, an attempt.
  Update u;
  u.param_id = 0;
  const std::string up = encode(u);
  std::string bad = up;
  set_le(bad, 5, 1, 4);
  expect_chunk_error([&] { decode<Update>(bad); }, "update: field 'flags' = 4");
  bad = up;
  set_le(bad, 16, 4, 1);
  expect_chunk_error([&] { decode<Update>(bad); }, "update: field 'attempt' must be 0");
}

TEST(ChunkMessages, RegisterOkHandsOutTheIdOptionally) {
  RegisterOk ok{"w", 2, 41, 5};
  const auto d = decode<RegisterOk>(encode(ok));
  EXPECT_EQ(d.param_id, 5u);
  EXPECT_EQ(d.last_step, 41);
  // A replica seal's answer has none.
  EXPECT_EQ(decode<RegisterOk>(encode(RegisterOk{"w", 0, 3})).param_id, kNoParamId);
  EXPECT_EQ(encode(RegisterOk{"w", 0, 3}).find("param_id"), std::string::npos);
  expect_chunk_error(
      [] {
        decode<RegisterOk>(R"({"name":"w","contributors":1,"last_step":-1,)"
                           R"("param_id":-1})");
      },
      "field 'param_id' = -1 is outside");
}

// Writes the seed corpus of the fuzz harnesses: valid frames of every message type (and a few
// bad headers) for fuzz_frame, valid and refused registrations for fuzz_registration. The files
// are checked in under tests/fuzz/corpus/<harness>/; rerun after a protocol change:
//
//   build-fuzz/tests/fuzz/fuzz_write_seeds tests/fuzz/corpus
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "tests/fuzz/frame_input.hpp"
#include "tests/fuzz/registration_input.hpp"
#include "transport/frame.hpp"
#include "transport/messages.hpp"

namespace {

namespace fs = std::filesystem;
using namespace muon;
using namespace muon::transport;

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::vector<std::byte> frame(MessageType type, uint32_t request_id, const std::string& payload) {
  return encode_frame({static_cast<uint16_t>(type), request_id, payload});
}

RegisterParam qkv_registration() {
  RegisterParam m;
  m.name = "layers.0.attn.qkv";
  m.shape = {96, 32};
  m.grad_dtype = DType::bf16;
  m.options.momentum = {MomentumConvention::ema, 0.9f, false};
  m.options.orthogonalize.schedule = "polar_express";
  m.options.orthogonalize.steps = 8;
  m.options.orthogonalize.row_splits = {32, 32, 32};
  m.options.orthogonalize.algorithm = NsAlgorithm::syrk;
  m.push = {{0, 1536}};
  m.want = {{0, 3072}};
  return m;
}

void write_frame_seeds(const fs::path& dir) {
  fs::create_directories(dir);
  const std::vector<std::pair<std::string, std::vector<std::byte>>> frames = {
      {"hello", frame(MessageType::hello, 1, encode(Hello{1, 2, "trainer pid 1234"}))},
      {"hello_ok", frame(MessageType::hello_ok, 1,
                         encode(HelloOk{"s1", "muon-offloadd 0.1.0", "/muon-abc", 8, 8, 1 << 20}))},
      {"health", frame(MessageType::health, 2, "")},
      {"health_ok", frame(MessageType::health_ok, 2, encode(HealthOk{true, 3, 12}))},
      {"register_param", frame(MessageType::register_param, 3, encode(qkv_registration()))},
      {"register_ok", frame(MessageType::register_ok, 3, encode(RegisterOk{"w", 2, 41, 0}))},
      {"push",  // binary (transport/chunk_header.hpp), naming parameter id 0
       frame(MessageType::push, 0, encode(Push{"", 7, 128, 64, 3, ChunkKind::gradient, 1, 0}))},
      {"push_replica",  // a replica chunk names its parameter
       frame(MessageType::push, 0,
             encode(Push{"w", 7, 0, 64, 2, ChunkKind::replica_momentum, 0, kNoParamId}))},
      {"push_ack", frame(MessageType::push_ack, 0, encode(SlotAck{3}))},
      {"commit", frame(MessageType::commit, 4, encode(Commit{"w", 7}))},
      {"update", frame(MessageType::update, 0,
                       encode(Update{"", 7, 0, 64, 1, ChunkKind::gradient, true, true, 0}))},
      {"update_momentum",
       frame(MessageType::update, 0,
             encode(Update{"", -1, 64, 64, 2, ChunkKind::momentum, false, true, 0}))},
      {"update_ack", frame(MessageType::update_ack, 0, encode(SlotAck{1}))},
      {"snapshot", frame(MessageType::snapshot, 5, encode(SnapshotRequest{"/tmp/m.safetensors"}))},
      {"snapshot_ok",
       frame(MessageType::snapshot_ok, 5, encode(SnapshotOk{"/tmp/m.safetensors", 4}))},
      {"state_fetch", frame(MessageType::state_fetch, 6, encode(StateFetch{"w"}))},
      {"goodbye", frame(MessageType::goodbye, 0, "")},
      {"status", frame(MessageType::status, 7, "")},
      {"status_ok", frame(MessageType::status_ok, 7, R"({"sessions":1,"parameters":[]})")},
      {"error", frame(MessageType::error, 3,
                      encode(ErrorMsg{ErrorCode::peer_lost, "rank 1 disconnected", "w", 7, 1}))},
      {"step_report", frame(MessageType::step_report, 0,
                            encode(StepReport{7, 1500000, 1 << 20, 12, "layers.3.mlp.fc"}))},
      {"options",
       frame(MessageType::register_param, 8, options_to_json(qkv_registration().options))},
  };
  uint8_t seed = 0;
  std::vector<std::byte> session;  // one client's whole conversation, fed in small pieces
  for (const auto& [name, bytes] : frames) {
    write_file(dir / (name + ".bin"), fuzz::frame_input(seed, bytes));
    seed = static_cast<uint8_t>(seed + 37);
    session.insert(session.end(), bytes.begin(), bytes.end());
  }
  write_file(dir / "session.bin", fuzz::frame_input(5, session));
  // Bad headers: the decoder must fail cleanly, after the frames before them.
  auto good = frame(MessageType::health, 9, "");
  auto bad_magic = good;
  bad_magic[0] = std::byte{'X'};
  auto bad_version = good;
  bad_version[4] = std::byte{9};
  auto too_long = good;
  too_long[11] = std::byte{0x7f};
  auto truncated = frame(MessageType::commit, 4, encode(Commit{"w", 7}));
  truncated.resize(truncated.size() - 3);
  for (const auto& [name, tail] : {std::pair{"bad_magic", bad_magic},
                                   {"bad_version", bad_version},
                                   {"too_long", too_long},
                                   {"truncated", truncated}}) {
    auto bytes = good;
    bytes.insert(bytes.end(), tail.begin(), tail.end());
    write_file(dir / (std::string(name) + ".bin"), fuzz::frame_input(3, bytes));
  }
}

void write_registration_seeds(const fs::path& dir) {
  fs::create_directories(dir);
  using fuzz::RegistrationCall;
  using fuzz::RegistrationInput;
  const std::string qkv_options = options_to_json(qkv_registration().options);
  const std::vector<std::pair<std::string, RegistrationInput>> seeds = {
      // two ranks, one row shard each: 1 contributor
      {"row_shards", {2, 1, 4, 6, 0, "", {{0, 0, {{0, 12}}, {{0, 24}}}, {1, 0, {{12, 24}}, {}}}}},
      // data parallel: both ranks push everything, 2 contributors
      {"data_parallel",
       {2, 1, 8, 8, 3, "", {{1, 0, {{0, 64}}, {{0, 64}}}, {0, 0, {{0, 64}}, {{0, 64}}}}}},
      // uneven flat shards given out of order, an empty range, a rank that pushes nothing
      {"flat_uneven",
       {3,
        1,
        5,
        7,
        0,
        "",
        {{0, 0, {{20, 35}, {0, 7}, {7, 7}}, {}},
         {1, 0, {{7, 20}}, {{0, 35}}},
         {2, 0, {}, {{10, 12}}}}}},
      // an MoE stack [4, 16, 8] with non-default options from JSON
      {"expert_stack",
       {1,
        4,
        16,
        8,
        1,
        R"({"momentum":"ema","mu":0.9,"nesterov":false,"schedule":"polar_express","steps":8,"eps":1e-6,"eps_mode":"clamp","scale":"match_adamw","extra_scale":0.5,"row_splits":[],"algorithm":"gram","precision":"bf16","nonfinite":"skip"})",
        {{0, 0, {{0, 512}}, {{0, 512}}}}}},
      // fused QKV: row splits that add up to the rows
      {"fused_qkv", {1, 1, 96, 32, 1, qkv_options, {{0, 0, {{0, 3072}}, {{0, 3072}}}}}},
      // refused: overlap within a rank, then a corrected re-registration
      {"overlap_then_fixed",
       {1, 1, 4, 4, 0, "", {{0, 0, {{0, 10}, {8, 16}}, {}}, {0, 0, {{0, 8}, {8, 16}}, {}}}}},
      // refused: a spec mismatch (another name), an out-of-range rank and range
      {"mismatches",
       {2,
        1,
        4,
        4,
        0,
        "",
        {{0, 0, {{0, 16}}, {}},
         {1, 1, {{0, 16}}, {}},
         {2, 0, {}, {}},
         {1, 0, {{0, 17}}, {}},
         {1, 0, {{0, 16}}, {}}}}},
      // refused at finish: uneven coverage
      {"uneven_coverage", {2, 1, 2, 5, 0, "", {{0, 0, {{0, 10}}, {}}, {1, 0, {{0, 5}}, {}}}}},
      // refused: an empty shape and world size 0
      {"empty_shape", {1, 1, 0, 5, 0, "", {{0, 0, {}, {}}}}},
      {"world_zero", {0, 1, 4, 4, 0, "", {}}},
      // regression (fixed): row splits that wrap around int64 to the 2 rows must be refused
      {"row_splits_wrap",
       {1,
        1,
        2,
        4,
        0,
        R"({"momentum":"sum","mu":0.95,"nesterov":true,"schedule":"keller","steps":0,"eps":1e-7,"eps_mode":"add","scale":"keller","extra_scale":1,"row_splits":[9223372036854775807,9223372036854775807,4],"algorithm":"plain","precision":"default","nonfinite":"error"})",
        {{0, 0, {{0, 8}}, {}}}}},
  };
  for (const auto& [name, input] : seeds) write_file(dir / (name + ".bin"), fuzz::serialize(input));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " CORPUS_DIR   (writes CORPUS_DIR/{frame,registration})\n";
    return 2;
  }
  try {
    write_frame_seeds(fs::path(argv[1]) / "frame");
    write_registration_seeds(fs::path(argv[1]) / "registration");
  } catch (const std::exception& e) {
    std::cerr << "fuzz_write_seeds: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

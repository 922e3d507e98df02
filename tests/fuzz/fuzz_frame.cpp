// libFuzzer harness: the control-plane frame decoder and every message decoder
// (transport/frame.hpp, transport/messages.hpp) on arbitrary byte streams cut in arbitrary places.
//
// Input: frame_input.hpp (a split seed, then the stream). Invariants, each a crash when broken:
// - FrameDecoder throws only ProtocolError; once it failed, next() returns nothing and feed()
//   throws ProtocolError;
// - the frames, the failure and its message do not depend on how the stream was cut (fed whole
//   vs fed in the seed's pieces);
// - each returned frame re-encodes to exactly the bytes it was decoded from;
// - every decode<T>() and options_from_json() throws only ProtocolError, and what one accepts
//   re-encodes to a payload that decodes again to the same encoding; all of them run on the
//   payloads of the first kFramesForEveryDecoder frames, the frame type's own on the others.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "tests/fuzz/frame_input.hpp"
#include "tests/fuzz/fuzz_check.hpp"
#include "transport/frame.hpp"
#include "transport/messages.hpp"

namespace {

using namespace muon::transport;

// What a FrameDecoder made of one stream.
struct Decoded {
  std::vector<Frame> frames;
  bool failed = false;
  std::string error;  // ProtocolError::message() of the failure
};

Decoded decode_stream(std::span<const std::byte> stream, const std::vector<size_t>& pieces) {
  FrameDecoder decoder;
  Decoded out;
  size_t pos = 0;
  for (const size_t n : pieces) {
    if (out.failed) {
      bool threw = false;
      try {
        decoder.feed(stream.data() + pos, n);
      } catch (const ProtocolError&) {
        threw = true;
      }
      FUZZ_CHECK(threw);  // a failed decoder refuses more bytes
      break;
    }
    decoder.feed(stream.data() + pos, n);  // throws only after a failure (checked above)
    pos += n;
    try {
      while (auto f = decoder.next()) out.frames.push_back(std::move(*f));
    } catch (const ProtocolError& e) {
      out.failed = true;
      out.error = e.message();
      FUZZ_CHECK(!decoder.next().has_value());  // stays failed
    }
  }
  if (!out.failed) {
    size_t consumed = 0;
    for (const auto& f : out.frames) consumed += kFrameHeaderBytes + f.payload.size();
    FUZZ_CHECK(decoder.buffered() == stream.size() - consumed);
  }
  return out;
}

// decode<T> accepts or throws ProtocolError; an accepted message survives encode -> decode.
template <class T>
void check_message(const std::string& payload) {
  T first;
  try {
    first = decode<T>(payload);
  } catch (const ProtocolError&) {
    return;
  }
  const std::string once = encode(first);
  T second;
  try {
    second = decode<T>(once);
  } catch (const ProtocolError& e) {
    std::fprintf(stderr, "re-decoding our own encoding failed: %s\npayload: %s\n", e.what(),
                 once.c_str());
    FUZZ_CHECK(false);
  }
  FUZZ_CHECK(encode(second) == once);
}

void check_options(const std::string& payload) {
  muon::MuonOptions first;
  try {
    first = options_from_json(payload);
  } catch (const ProtocolError&) {
    return;
  }
  const std::string once = options_to_json(first);
  FUZZ_CHECK(options_to_json(options_from_json(once)) == once);
}

// The decoder a peer would use for a frame of this type (none for empty-payload types).
void check_own_decoder(uint16_t type, const std::string& payload) {
  switch (static_cast<MessageType>(type)) {
    case MessageType::error:
      return check_message<ErrorMsg>(payload);
    case MessageType::hello:
      return check_message<Hello>(payload);
    case MessageType::hello_ok:
      return check_message<HelloOk>(payload);
    case MessageType::health_ok:
      return check_message<HealthOk>(payload);
    case MessageType::register_param:
      return check_message<RegisterParam>(payload);
    case MessageType::register_ok:
      return check_message<RegisterOk>(payload);
    case MessageType::push:
      return check_message<Push>(payload);
    case MessageType::push_ack:
    case MessageType::update_ack:
      return check_message<SlotAck>(payload);
    case MessageType::commit:
      return check_message<Commit>(payload);
    case MessageType::update:
      return check_message<Update>(payload);
    case MessageType::snapshot:
      return check_message<SnapshotRequest>(payload);
    case MessageType::snapshot_ok:
      return check_message<SnapshotOk>(payload);
    case MessageType::state_fetch:
      return check_message<StateFetch>(payload);
    case MessageType::step_report:
      return check_message<StepReport>(payload);
    default:
      return;
  }
}

void check_every_decoder(const std::string& payload) {
  check_message<Hello>(payload);
  check_message<HelloOk>(payload);
  check_message<HealthOk>(payload);
  check_message<RegisterParam>(payload);
  check_message<RegisterOk>(payload);
  check_message<Push>(payload);
  check_message<SlotAck>(payload);
  check_message<Commit>(payload);
  check_message<Update>(payload);
  check_message<ErrorMsg>(payload);
  check_message<SnapshotRequest>(payload);
  check_message<SnapshotOk>(payload);
  check_message<StateFetch>(payload);
  check_message<StepReport>(payload);
  check_options(payload);
}

// Every decoder runs on the payloads of the first frames of an input; later frames get their own
// type's decoder only. A refused decode costs two exceptions (slow under ASan), and a long stream
// of frames mostly exercises the framing, which is checked for every frame.
constexpr size_t kFramesForEveryDecoder = 4;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::span<const std::byte> stream(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  const Decoded whole = decode_stream(stream, muon::fuzz::split_sizes(0, stream.size()));
  const Decoded cut = decode_stream(stream, muon::fuzz::split_sizes(data[0], stream.size()));

  FUZZ_CHECK(whole.failed == cut.failed);
  FUZZ_CHECK(whole.error == cut.error);
  FUZZ_CHECK(whole.frames.size() == cut.frames.size());
  size_t pos = 0;
  for (size_t i = 0; i < whole.frames.size(); ++i) {
    const Frame& f = whole.frames[i];
    FUZZ_CHECK(f.type == cut.frames[i].type && f.request_id == cut.frames[i].request_id &&
               f.payload == cut.frames[i].payload);
    FUZZ_CHECK(f.payload.size() <= kMaxPayload);
    const auto bytes = encode_frame(f);
    FUZZ_CHECK(pos + bytes.size() <= stream.size());
    FUZZ_CHECK(std::memcmp(bytes.data(), stream.data() + pos, bytes.size()) == 0);
    pos += bytes.size();
    FUZZ_CHECK(!message_type_name(f.type).empty());
    if (i < kFramesForEveryDecoder) {
      check_every_decoder(f.payload);
    } else {
      check_own_decoder(f.type, f.payload);
    }
  }
  return 0;
}

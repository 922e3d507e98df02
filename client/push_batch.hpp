// Push frames of a shared-memory session held back so that several go out in one write
// (issue 15). On a shm session a chunk's bytes are in the segment before its frame is written,
// and its slot comes back through the segment's credit words, so the frame is the only syscall
// a chunk costs the pusher (5 of the 18 us of a 256 KiB chunk, with the server's wake-up it
// causes). Written together, the frames of up to kPushBatchBytes of chunks cost one write and
// one wake-up.
//
// A held frame goes out with the next frame of any kind (a commit always follows a step's
// pushes), before the connection waits for anything (a free slot, a flush, an update, a reply),
// and once the batch is full. So a chunk waits at most until its pusher's next call into the
// connection, and never while the pusher waits on the server.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace muon::client {

/// Chunk bytes a connection's batch announces before it is written: four 256 KiB shm chunks
/// (transport::kShmChunkBytes), a write and a wake-up of the server per MiB.
inline constexpr uint64_t kPushBatchBytes = 1u << 20;

class PushBatch {
 public:
  /// A batch is full once its frames announce `full_bytes` of chunks or number `full_frames`
  /// (both >= 1). A connection uses kPushBatchBytes and half its tx ring, so that the server
  /// always has a batch to copy out while the pusher fills the next.
  PushBatch(uint64_t full_bytes, uint32_t full_frames)
      : full_bytes_(full_bytes), full_frames_(full_frames) {}

  /// Holds `frame` (an encoded push frame) announcing `chunk_bytes`. Returns true when the batch
  /// is full: write bytes() now, then clear().
  bool add(std::span<const std::byte> frame, uint64_t chunk_bytes) {
    frames_.insert(frames_.end(), frame.begin(), frame.end());
    bytes_ += chunk_bytes;
    ++count_;
    return bytes_ >= full_bytes_ || count_ >= full_frames_;
  }

  bool empty() const { return count_ == 0; }
  /// Frames held.
  uint32_t size() const { return count_; }
  /// The held frames, in the order added, end to end.
  const std::vector<std::byte>& bytes() const { return frames_; }
  /// Empties the batch (once bytes() is written), keeping its buffer for the next one.
  void clear() {
    frames_.clear();
    bytes_ = 0;
    count_ = 0;
  }

 private:
  uint64_t full_bytes_;
  uint32_t full_frames_;
  std::vector<std::byte> frames_;
  uint64_t bytes_ = 0;
  uint32_t count_ = 0;
};

}  // namespace muon::client

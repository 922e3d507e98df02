// Ring credits: which slots of a fixed ring of data slots the sending side may fill. A credit is
// one slot, free or held; the sender takes the lowest free one, writes the chunk into it and
// announces it in a frame, and the slot stays held until the peer's ack for that slot releases
// it. The client keeps one for its tx ring (push / push_ack), the server one per session for its
// rx ring (update / update_ack); both rings are laid out in transport/shm_segment.hpp (or are
// device rings of the same geometry).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace muon::transport {

/// The credits of a ring of `size()` slots, indexed 0 .. size()-1. Starts empty (size 0, nothing
/// free) until assign(). Not thread-safe: the owner's lock (the client's mu_) or strand (the
/// server's session) guards it.
class CreditRing {
 public:
  CreditRing() = default;
  /// A ring of `slots` slots, all free.
  explicit CreditRing(uint32_t slots) { assign(slots); }

  /// Resizes to `slots` slots and frees every one (credits held before are forgotten).
  void assign(uint32_t slots);
  /// Number of slots (0 before assign()).
  uint32_t size() const { return static_cast<uint32_t>(held_.size()); }

  /// Takes the lowest-numbered free slot and returns its index, or nullopt when every slot is
  /// held (or the ring has no slots): wait for an ack.
  std::optional<uint32_t> acquire();
  /// Gives `slot` back. False, changing nothing, when `slot` >= size() or is not held (an ack
  /// for a slot never announced); the caller decides whether that is a protocol error.
  [[nodiscard]] bool release(uint32_t slot);

  /// Whether `slot` is held (false when out of range).
  bool held(uint32_t slot) const { return slot < held_.size() && held_[slot]; }
  /// Whether acquire() would succeed.
  bool any_free() const;
  /// Whether no slot is held (true for a ring of no slots): everything sent was acked.
  bool all_free() const;

 private:
  std::vector<bool> held_;
};

}  // namespace muon::transport

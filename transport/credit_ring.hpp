// Ring credits: which slots of a fixed ring of data slots the sending side may fill. A credit is
// one slot, free or held; the sender takes the lowest free one, writes the chunk into it and
// announces it in a frame, and the slot stays held until the peer releases it. The peer
// releases it in one of two ways:
//   frames   an ack frame naming the slot (push_ack of a device plane, update_ack): release();
//   segment  the tx ring of a shm session: the server advances the slot's counter in the
//            segment (transport/shm_credits.hpp) and the ring reads it back whenever it is asked
//            for a free slot; a push_ack then only wakes a sleeping pusher.
// The client keeps one for its tx ring (push / push_ack), a server's PeerLink one for its tx ring
// into a peer, the server one per session for its rx ring (update / update_ack); the rings are
// laid out in transport/shm_segment.hpp (or are device rings of the same geometry).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "transport/shm_credits.hpp"

namespace muon::transport {

/// The credits of a ring of `size()` slots, indexed 0 .. size()-1. Starts empty (size 0, nothing
/// free) until assign(). Not thread-safe: the owner's lock (the client's mu_) or strand (the
/// server's session, a PeerLink) guards it; the segment's words are the only shared state.
class CreditRing {
 public:
  /// What a query does when its answer is no (segment mode; frames mode ignores it).
  enum class IfNot {
    stay_quiet,  ///< nothing: the caller will ask again (spinning)
    ask_wake,    ///< asks the server for a wake frame at its next release (the caller sleeps)
  };

  CreditRing() = default;
  /// A ring of `slots` slots, all free.
  explicit CreditRing(uint32_t slots) { assign(slots); }

  /// Resizes to `slots` slots and frees every one (credits held before are forgotten); back in
  /// frames mode.
  void assign(uint32_t slots);
  /// Segment mode from now on: slots are released by `words`' counters, which start at zero (a
  /// fresh segment; call right after assign(words.slots()), before any acquire()).
  void use_segment(ShmCreditWords words);
  /// Whether the credits are in a segment (use_segment()).
  bool in_segment() const { return words_.has_value(); }
  /// Number of slots (0 before assign()).
  uint32_t size() const { return static_cast<uint32_t>(held_.size()); }

  /// Takes the lowest-numbered free slot and returns its index, or nullopt when every slot is
  /// held (or the ring has no slots): wait for an ack. The slot counts as announced: a caller
  /// that then does not announce it gives it back with give_back().
  std::optional<uint32_t> acquire();
  /// Frames mode: the peer's ack gives `slot` back. False, changing nothing, when `slot` >=
  /// size() or is not held (an ack for a slot never announced), and always in segment mode (a
  /// slot there is released by its counter, never by a frame); the caller decides whether that
  /// is a protocol error.
  [[nodiscard]] bool release(uint32_t slot);
  /// A credit acquire() gave that was never announced (the copy into the slot failed): free
  /// again at once, in either mode. False, changing nothing, when `slot` is not held.
  bool give_back(uint32_t slot);

  /// Whether `slot` is held (false when out of range; segment mode: as last read back).
  bool held(uint32_t slot) const { return slot < held_.size() && held_[slot]; }
  /// Whether acquire() would succeed (segment mode: after reading the counters back).
  bool any_free(IfNot if_not = IfNot::stay_quiet);
  /// Whether no slot is held (true for a ring of no slots): everything sent was released.
  bool all_free(IfNot if_not = IfNot::stay_quiet);

 private:
  /// Segment mode: frees each held slot whose counter reached the chunks announced in it.
  void read_back();
  template <class Done>
  bool ask(IfNot if_not, Done done);

  std::vector<bool> held_;
  std::optional<ShmCreditWords> words_;  // segment mode
  std::vector<uint64_t> announced_;      // segment mode: chunks announced per slot, ever
};

}  // namespace muon::transport

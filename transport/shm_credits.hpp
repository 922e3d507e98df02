// The tx ring's credits of a shared-memory session, kept in the session's segment itself
// (issue 15): the server releases a slot by advancing the slot's counter there, and the pushing
// thread reads the counters, so a chunk's hand-off costs no push_ack frame, no wake-up of the
// client's reader thread and no syscall on either side. A frame is sent only to wake a pusher
// that went to sleep: it sets the segment's wake word before it sleeps, and the server's next
// release clears the word and sends one push_ack naming kWakeSlot.
//
// Block layout (after the two rings, transport/shm_segment.hpp), all little-endian words:
//   offset 0    u32 wake       1: the pusher sleeps until a push_ack (set by the client,
//                              cleared by the server's release that sends the wake frame)
//          64   u64 released[tx_slots]  chunks the server has finished reading from slot i
// A slot is the client's to fill again when released[i] equals the number of chunks it has
// announced in slot i (CreditRing counts them). The wake word has a cache line to itself: the
// client writes it, the server reads it on every release.
//
// Why no lost wake-up: the pusher stores wake = 1, then reads the counters; the server adds to
// a counter, then exchanges wake with 0. Both are sequentially consistent, so at least one side
// sees the other's store (the store-buffer litmus): either the pusher sees the release and does
// not sleep, or the server sees the wake word and sends the frame.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace muon::transport {

/// push_ack's slot when the frame only wakes a sleeping pusher of a shm session (its credits
/// are in the segment); a device plane's push_ack names the slot it releases.
inline constexpr uint32_t kWakeSlot = 0xFFFFFFFFu;

/// A view of a segment's credit block (not owning; the mapping outlives it). The words start at
/// zero: the server creates the block in fresh, zeroed tmpfs pages.
class ShmCreditWords {
 public:
  /// Bytes of the block for a tx ring of `tx_slots` slots (a multiple of 64).
  static uint64_t bytes(uint32_t tx_slots) {
    return 64 + (uint64_t{tx_slots} * 8 + 63) / 64 * 64;
  }

  /// The block at `block` (64-byte aligned, bytes(tx_slots) long) of a ring of `tx_slots`.
  ShmCreditWords(std::byte* block, uint32_t tx_slots) : block_(block), slots_(tx_slots) {}

  uint32_t slots() const { return slots_; }

  // ---- the server (the ring's reader) ------------------------------------------------------
  /// Slot `slot` (< slots()) may be rewritten: its counter advances by one. Returns true when
  /// the pusher asked to be woken (the word is cleared): send it a push_ack naming kWakeSlot.
  bool release(uint32_t slot) {
    counter(slot).fetch_add(1, std::memory_order_seq_cst);
    std::atomic_ref<uint32_t> wake(wake_word());
    return wake.load(std::memory_order_seq_cst) != 0 &&
           wake.exchange(0, std::memory_order_seq_cst) != 0;
  }

  // ---- the client (the ring's writer) ------------------------------------------------------
  /// Chunks of slot `slot` (< slots()) the server has finished reading, ever.
  uint64_t released(uint32_t slot) const {
    return counter(slot).load(std::memory_order_seq_cst);
  }
  /// Asks the server's next release for a wake frame. Read the counters again after it, before
  /// sleeping (see the header comment).
  void ask_wake() {
    std::atomic_ref<uint32_t>(wake_word()).store(1, std::memory_order_seq_cst);
  }

 private:
  static_assert(std::atomic_ref<uint64_t>::is_always_lock_free &&
                    std::atomic_ref<uint32_t>::is_always_lock_free,
                "words shared between processes must be lock-free atomics");
  uint32_t& wake_word() const { return *reinterpret_cast<uint32_t*>(block_); }
  std::atomic_ref<uint64_t> counter(uint32_t slot) const {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(block_ + 64 + slot * 8));
  }

  std::byte* block_;
  uint32_t slots_;
};

}  // namespace muon::transport

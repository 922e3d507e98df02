// A POSIX shared-memory segment for one client session (Boost.Interprocess): the server creates
// it under an unguessable name with mode 0600, the client maps it and unlinks the name, so no
// other process can open it afterwards and the kernel reclaims it when both sides unmap (also
// when either dies). Every page is allocated at creation (fallocate on the tmpfs file, no mapping
// touched): copies into fresh pages run ~20x slower than into allocated ones, and a full
// /dev/shm fails the creation with a clear error instead of a SIGBUS at the first copy.
//
// Layout: [tx ring: tx_slots x slot_bytes][rx ring: rx_slots x slot_bytes][tx credit block]
//   tx: client -> server (gradient / momentum chunks); rx: server -> client (update chunks);
//   the tx ring's credits (transport/shm_credits.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/shm_credits.hpp"

namespace muon::transport {

/// Geometry of a session segment.
struct SegmentLayout {
  uint32_t tx_slots = 8;
  uint32_t rx_slots = 8;
  uint64_t slot_bytes = 4u << 20;  ///< 4 MiB: large enough for copy bandwidth, small for latency
  /// Bytes of the two rings.
  uint64_t ring_bytes() const { return (uint64_t{tx_slots} + rx_slots) * slot_bytes; }
  /// Bytes of the segment: the rings and the tx ring's credit block.
  uint64_t total_bytes() const { return ring_bytes() + ShmCreditWords::bytes(tx_slots); }
};

/// Largest chunk a sender puts into one shm slot: 256 KiB, whatever the slot size
/// (transport::push_chunk_bytes). A chunk is copied in by one core and out by another; at
/// 256 KiB a chunk stays in the copying core's L2 until the other reads it, where 1 MiB chunks
/// spill to the last-level cache and 4 MiB chunks (32 MiB in flight) to memory and back
/// (bench/README.md, transport rows). A chunk's push frame no longer costs a write of its own
/// (client/push_batch.hpp), so the smaller chunk is cheap; 128 KiB chunks measured slower again.
inline constexpr uint64_t kShmChunkBytes = 256u << 10;

/// A mapped segment. Move-only; unmaps on destruction. Throws muon::Error on any OS failure with
/// the segment name and errno text.
class ShmSegment {
 public:
  /// Server side: creates a new segment named "/muon-<32 random hex>" (mode 0600), sizes it,
  /// allocates every page (fallocate) and maps it. Throws muon::Error naming the segment when
  /// /dev/shm cannot hold it (ENOSPC), or on any other OS failure; no segment is left behind.
  static ShmSegment create(const SegmentLayout& layout);
  /// Client side: maps an existing segment read-write and unlinks its name.
  static ShmSegment open_and_unlink(const std::string& name, const SegmentLayout& layout);
  /// Removes a segment name if it still exists (server cleanup for a client that never mapped).
  static void remove(const std::string& name) noexcept;

  ShmSegment(ShmSegment&&) noexcept;
  ShmSegment& operator=(ShmSegment&&) noexcept;
  ~ShmSegment();

  const std::string& name() const;
  const SegmentLayout& layout() const;
  /// Start of tx slot i (client -> server). Throws InvalidArgument when i is out of range.
  std::byte* tx_slot(uint32_t i) const;
  /// Start of rx slot i (server -> client). Throws InvalidArgument when i is out of range.
  std::byte* rx_slot(uint32_t i) const;
  /// The tx ring's credit block (transport/shm_credits.hpp), after the rings.
  ShmCreditWords tx_credits() const;

 private:
  struct Impl;
  explicit ShmSegment(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace muon::transport

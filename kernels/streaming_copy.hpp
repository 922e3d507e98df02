// A copy of fp32 values whose destination is written once and not read again soon: a large
// contribution buffer filled chunk by chunk from a shared-memory slot while a step streams in
// (daemon/contribution_store.cpp). Ordinary stores first read each destination line into the
// cache (read for ownership) and then evict lines still in use (the ring's slots, the pusher's
// source) to make room for a buffer nobody reads before the step's commit. Non-temporal stores
// write the lines straight to memory: a third less memory traffic for the copy, and the caches
// keep what the two copying cores share. glibc's memcpy makes the same choice on its own only
// for single copies near the size of the last-level cache, never for 256 KiB chunks.
#pragma once

#include <cstdint>

namespace muon {

/// Bytes of a destination buffer from which its copies stream (copy_streaming): past what one
/// core's L2 holds (0.5-2 MiB on current x86 servers), so its lines would leave the cache before
/// the buffer is read again.
inline constexpr uint64_t kStreamingCopyBytes = 4u << 20;

/// dst[0..n) = src[0..n), bit for bit as memcpy, with non-temporal stores where the CPU has them
/// (x86-64: SSE2's movntps, for every 16-byte aligned group of four; the unaligned head and tail
/// are ordinary stores) and memcpy elsewhere. Ends with a store fence, so another thread that
/// synchronizes with this one afterwards (a mutex, an atomic release) sees every value.
/// dst and src (host memory) must not overlap; n >= 0 (0 copies nothing).
void copy_streaming(float* dst, const float* src, int64_t n);

}  // namespace muon

// The data plane of a PeerLink (daemon/pool/peer_link.hpp): how the bytes of the chunks a server
// pushes to a peer server reach it, and how the peer's update chunks come back, over whichever
// transport the hello agreed on. Host memory on this side in every case: a relay's partial sum
// and the owner's update, a replica's momentum and update are host buffers. One implementation
// per transport, each in its own file, compiled only where its library exists:
//   link_plane_shm.cpp        the session's shared-memory segment (same host): plain copies;
//   link_plane_nccl.cpp       NCCL point-to-point from this server's GPU (another host), its
//                             blocking device calls on a thread of the plane's own;
//   link_plane_nccl_none.cpp  builds without NCCL: the maker says so.
// The control plane stays the link's: credits, frames, their order, the update reassembly.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "transport/messages.hpp"
#include "transport/shm_credits.hpp"

namespace muon::daemon {

/// Runs a callback on the link's strand (the io thread); a plane's completions go through it.
using LinkPost = std::function<void(std::function<void()>)>;
/// A transfer's end: "" when done, else why it failed (the link is then lost).
using TransferDone = std::function<void(std::string error)>;

class LinkPlane {
 public:
  virtual ~LinkPlane() = default;

  /// True when a chunk's bytes travel after its push frame is written (nccl: the peer posts its
  /// receive when it reads the frame), false when they are in the slot before it (shm).
  virtual bool sends_after_frame() const = 0;
  /// The tx ring's credit words when they live in the session's segment (shm: the peer releases
  /// slots there, a push_ack only wakes the link; transport/shm_credits.hpp); nullopt where each
  /// push_ack names its slot.
  virtual std::optional<transport::ShmCreditWords> tx_credit_words() const { return std::nullopt; }
  /// shm: copies `bytes` at `src` into tx slot `slot` now (the push frame follows). Throws
  /// InvalidArgument (slot out of range). Not called on a plane that sends after the frame.
  virtual void fill_slot(uint32_t slot, const std::byte* src, size_t bytes) = 0;
  /// nccl: sends `bytes` at `src` (elements of `dtype`), once its push frame is written; `done`
  /// runs through the post once `src` may be reused. Transfers run in call order.
  virtual void send(const std::byte* src, size_t bytes, transport::DType dtype,
                    TransferDone done) = 0;
  /// The update chunk of `bytes` (elements of `dtype`) announced for rx slot `slot` into `dst`,
  /// or dropped when `dst` is null (it was sent, so nccl still receives it); `done` runs through
  /// the post once the bytes are in `dst` (shm: before this returns). Transfers run in call
  /// order, after the sends called before them.
  virtual void receive(uint32_t slot, std::byte* dst, size_t bytes, transport::DType dtype,
                       TransferDone done) = 0;
  /// The peer is gone: transfers queued for it end now (nccl aborts its communicators) and fail.
  /// Idempotent; never throws.
  virtual void abort() noexcept = 0;
};

/// The plane of the data plane `ok` agreed to: shm maps and unlinks ok.shm_name; nccl joins
/// ok.nccl_tx_id then ok.nccl_rx_id as rank 1 on CUDA device `device`, on its own thread (up to
/// `timeout` each; a failed join fails the transfers queued meanwhile, through `post`). Throws
/// muon::Error (the segment cannot be mapped), BackendUnavailable (nccl in a build without NCCL),
/// InvalidArgument (a hello that lacks what its plane needs; cuda_ipc, which peers never use).
std::unique_ptr<LinkPlane> make_link_plane(const transport::HelloOk& ok, int device,
                                           std::chrono::milliseconds timeout, LinkPost post);

// The transports' own makers, each in its plane's file (or its unavailable twin).
std::unique_ptr<LinkPlane> make_shm_link_plane(const transport::HelloOk& ok);
std::unique_ptr<LinkPlane> make_nccl_link_plane(const transport::HelloOk& ok, int device,
                                                std::chrono::milliseconds timeout,
                                                LinkPost post);

}  // namespace muon::daemon

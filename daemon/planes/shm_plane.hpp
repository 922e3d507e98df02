// The shared-memory data plane (daemon/planes/server_plane.hpp): one segment per session
// (transport/shm_segment.hpp) holding its tx and rx rings; chunks are read where they lie.
#pragma once

#include <memory>

#include "daemon/planes/server_plane.hpp"
#include "transport/shm_segment.hpp"

namespace muon::daemon {

/// A fresh segment of `layout` for one session (its pages allocated, nothing mapped by a client
/// yet). Throws what transport::ShmSegment::create throws (e.g. a full /dev/shm, named).
std::unique_ptr<ServerPlane> make_shm_plane(const transport::SegmentLayout& layout);

}  // namespace muon::daemon

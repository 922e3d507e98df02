// The shared-memory data plane (daemon/planes/server_plane.hpp): one segment per session
// (transport/shm_segment.hpp) holding its tx and rx rings; chunks are read where they lie.
#pragma once

#include <memory>

#include "daemon/device_plane.hpp"
#include "daemon/planes/server_plane.hpp"
#include "transport/shm_segment.hpp"

namespace muon::daemon {

/// A fresh segment of `layout` for one session (its pages allocated, nothing mapped by a client
/// yet). On a GPU server (`device`, which must outlive the plane; null otherwise) the chunks are
/// copied onto the device as they are added: a slot is released (slot_released) once its copy
/// is done, and the segment is unmapped only after the last one. Throws what
/// transport::ShmSegment::create throws (e.g. a full /dev/shm, named).
std::unique_ptr<ServerPlane> make_shm_plane(const transport::SegmentLayout& layout,
                                            DevicePlane* device = nullptr);

}  // namespace muon::daemon

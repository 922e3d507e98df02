// The NCCL bootstrap through the control plane: the server creates an ncclUniqueId
// (ncclGetUniqueId), sends its bytes as hex in a control message, and every rank passes them to
// ncclCommInitRank (transport/nccl_comm.hpp). Plain C++: no NCCL types here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace muon::transport {

/// NCCL_UNIQUE_ID_BYTES: the size of an ncclUniqueId.
inline constexpr size_t kNcclIdBytes = 128;

/// The opaque bytes of an ncclUniqueId.
using NcclIdBytes = std::array<uint8_t, kNcclIdBytes>;

/// 256 lowercase hex digits.
std::string nccl_id_to_hex(const NcclIdBytes& id);
/// Throws InvalidArgument for anything but 256 hex digits.
NcclIdBytes nccl_id_from_hex(std::string_view text);

}  // namespace muon::transport

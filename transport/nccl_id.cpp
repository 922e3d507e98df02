#include "transport/nccl_id.hpp"

#include "transport/hex_bytes.hpp"

namespace muon::transport {

std::string nccl_id_to_hex(const NcclIdBytes& id) {
  return to_hex(id);
}

NcclIdBytes nccl_id_from_hex(std::string_view text) {
  return from_hex<kNcclIdBytes>(text, "NCCL unique id");
}

}  // namespace muon::transport

#include "plan/server_memory.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace muon::plan {

const char* client_mode_name(ClientMode mode) {
  return mode == ClientMode::shard ? "shard" : "server_reduce";
}

ClientMode parse_client_mode(const std::string& name) {
  if (name == "server_reduce") return ClientMode::server_reduce;
  if (name == "shard") return ClientMode::shard;
  throw InvalidArgument("unknown client mode '" + name + "' (known: server_reduce, shard)");
}

double ns_workspace_bytes(const MuonMatrix& m, Precision precision) {
  const double rows = static_cast<double>(m.rows / m.row_blocks);
  const double cols = static_cast<double>(m.cols);
  const double count = static_cast<double>(m.batch * m.row_blocks);
  const double small = std::min(rows, cols);
  const double elements = count * rows * cols;
  const double gram = count * small * small;
  const double blas = 32.0 * (1 << 20);
  const double gathered = 4 * elements;  // fp32 blocks in wide orientation (device_muon.cu)
  if (precision == Precision::fp32) return gathered + 4 * elements + 2 * 4 * gram + blas;
  return gathered + 2 * 2 * elements + 2 * 2 * gram + blas;
}

}  // namespace muon::plan

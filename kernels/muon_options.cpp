#include "kernels/muon_options.hpp"

#include <cmath>

#include "core/error.hpp"
#include "kernels/ns_schedule.hpp"

namespace muon {

std::string MatrixShape::str() const {
  std::string s = "[";
  if (batch != 1) s += std::to_string(batch) + ", ";
  return s + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

MatrixShape matrix_shape_from_dims(std::span<const int64_t> dims, std::string_view matrix_name) {
  const std::string who = "matrix '" + std::string(matrix_name) + "'";
  if (dims.size() < 2 || dims.size() > 3) {
    throw InvalidArgument(who + ": Muon needs a 2-D [rows, cols] or 3-D [batch, rows, cols] " +
                          "tensor, got " + std::to_string(dims.size()) + "-D");
  }
  for (auto d : dims) {
    if (d <= 0)
      throw InvalidArgument(who + ": empty tensor (a dimension is " + std::to_string(d) + ")");
  }
  MatrixShape s;
  s.batch = dims.size() == 3 ? dims[0] : 1;
  s.rows = dims[dims.size() - 2];
  s.cols = dims[dims.size() - 1];
  return s;
}

std::vector<int64_t> row_blocks(const OrthogonalizeOptions& options, const MatrixShape& shape,
                                std::string_view matrix_name) {
  if (options.row_splits.empty()) return {shape.rows};
  int64_t total = 0;
  for (auto r : options.row_splits) {
    if (r <= 0) {
      throw InvalidArgument("matrix '" + std::string(matrix_name) +
                            "': row split sizes must be positive, got " + std::to_string(r));
    }
    // Huge splits must not wrap around (signed overflow) to the row count.
    if (__builtin_add_overflow(total, r, &total)) {
      throw InvalidArgument("matrix '" + std::string(matrix_name) +
                            "': row splits add up to more than 2^63 but the matrix has " +
                            std::to_string(shape.rows) + " rows");
    }
  }
  if (total != shape.rows) {
    throw InvalidArgument("matrix '" + std::string(matrix_name) + "': row splits add up to " +
                          std::to_string(total) + " but the matrix has " +
                          std::to_string(shape.rows) + " rows");
  }
  return options.row_splits;
}

void validate(const OrthogonalizeOptions& options, const MatrixShape& shape,
              std::string_view matrix_name) {
  const std::string who = "matrix '" + std::string(matrix_name) + "'";
  if (shape.batch <= 0 || shape.rows <= 0 || shape.cols <= 0) {
    throw InvalidArgument(who + ": empty shape " + shape.str());
  }
  try {
    find_ns_schedule(options.schedule).coefficients(options.steps);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(who + ": " + e.message());
  }
  if (!(options.eps >= 0.0f) || !std::isfinite(options.eps)) {
    throw InvalidArgument(who + ": eps must be finite and >= 0");
  }
  if (!std::isfinite(options.extra_scale)) {
    throw InvalidArgument(who + ": extra_scale must be finite");
  }
  row_blocks(options, shape, matrix_name);
}

void validate(const MuonOptions& options, const MatrixShape& shape, std::string_view matrix_name) {
  validate(options.orthogonalize, shape, matrix_name);
  const float mu = options.momentum.mu;
  if (options.momentum.convention != MomentumConvention::none && !(mu >= 0.0f && mu < 1.0f)) {
    throw InvalidArgument("matrix '" + std::string(matrix_name) +
                          "': momentum mu must lie in [0, 1), got " + std::to_string(mu));
  }
}

EpsMode parse_eps_mode(std::string_view name) {
  if (name == "add") return EpsMode::add;
  if (name == "clamp") return EpsMode::clamp;
  throw InvalidArgument("unknown eps mode '" + std::string(name) + "' (known: add, clamp)");
}

NsAlgorithm parse_ns_algorithm(std::string_view name) {
  if (name == "plain") return NsAlgorithm::plain;
  if (name == "syrk") return NsAlgorithm::syrk;
  if (name == "gram") return NsAlgorithm::gram;
  throw InvalidArgument("unknown Newton-Schulz algorithm '" + std::string(name) +
                        "' (known: plain, syrk, gram)");
}

Precision parse_precision(std::string_view name) {
  if (name == "default") return Precision::backend_default;
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  throw InvalidArgument("unknown precision '" + std::string(name) +
                        "' (known: default, fp32, bf16)");
}

NonFinitePolicy parse_nonfinite_policy(std::string_view name) {
  if (name == "error") return NonFinitePolicy::error;
  if (name == "skip") return NonFinitePolicy::skip;
  throw InvalidArgument("unknown non-finite policy '" + std::string(name) +
                        "' (known: error, skip)");
}

MomentumConvention parse_momentum_convention(std::string_view name) {
  if (name == "sum") return MomentumConvention::sum;
  if (name == "ema") return MomentumConvention::ema;
  if (name == "none" || name == "client") return MomentumConvention::none;
  throw InvalidArgument("unknown momentum convention '" + std::string(name) +
                        "' (known: sum, ema, none)");
}

}  // namespace muon

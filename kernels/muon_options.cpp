#include "kernels/muon_options.hpp"

#include <algorithm>
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

std::vector<NsCoefficients> ns_coefficients(const OrthogonalizeOptions& options) {
  if (options.coefficients.empty()) {
    return find_ns_schedule(options.schedule).coefficients(options.steps);
  }
  const auto& k = options.coefficients;
  if (k.size() != 3 || !std::isfinite(k[0]) || !std::isfinite(k[1]) || !std::isfinite(k[2])) {
    throw InvalidArgument("Newton-Schulz coefficients must be 3 finite numbers (a, b, c), got " +
                          std::to_string(k.size()) + " value(s)");
  }
  const int steps = options.steps == 0 ? kFixedCoefficientSteps : options.steps;
  if (steps < 1 || steps > 100) {
    throw InvalidArgument("Newton-Schulz steps must lie in [1, 100], got " +
                          std::to_string(steps));
  }
  return std::vector<NsCoefficients>(static_cast<size_t>(steps), NsCoefficients{k[0], k[1], k[2]});
}

void validate(const OrthogonalizeOptions& options, const MatrixShape& shape,
              std::string_view matrix_name) {
  const std::string who = "matrix '" + std::string(matrix_name) + "'";
  if (shape.batch <= 0 || shape.rows <= 0 || shape.cols <= 0) {
    throw InvalidArgument(who + ": empty shape " + shape.str());
  }
  try {
    ns_coefficients(options);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(who + ": " + e.message());
  }
  if (options.precision == Precision::torch_bf16 && options.algorithm != NsAlgorithm::plain &&
      options.algorithm != NsAlgorithm::automatic) {
    throw InvalidArgument(who + ": precision torch_bf16 rounds torch's three products per step; "
                                "it needs algorithm plain (or auto, which then is plain)");
  }
  if (options.gram_restart < 0 || options.gram_restart > 100) {
    throw InvalidArgument(who + ": gram_restart must lie in [0, 100] steps, got " +
                          std::to_string(options.gram_restart));
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
  const double mu = options.momentum.mu;
  if (options.momentum.convention != MomentumConvention::none && !(mu >= 0.0 && mu < 1.0)) {
    throw InvalidArgument("matrix '" + std::string(matrix_name) +
                          "': momentum mu must lie in [0, 1), got " + std::to_string(mu));
  }
}

namespace {

// One name table per enum: the parser, the name function and the lists of accepted names all
// read it.
template <class E>
struct Named {
  std::string_view name;
  E value;
};

constexpr Named<EpsMode> kEpsModes[] = {
    {"scale_invariant", EpsMode::scale_invariant}, {"add", EpsMode::add}, {"clamp", EpsMode::clamp}};
constexpr Named<NsAlgorithm> kAlgorithms[] = {{"plain", NsAlgorithm::plain},
                                              {"syrk", NsAlgorithm::syrk},
                                              {"gram", NsAlgorithm::gram},
                                              {"auto", NsAlgorithm::automatic}};
constexpr Named<Precision> kPrecisions[] = {{"default", Precision::backend_default},
                                            {"fp32", Precision::fp32},
                                            {"bf16", Precision::bf16},
                                            {"torch_bf16", Precision::torch_bf16}};
constexpr Named<NonFinitePolicy> kNonFinite[] = {{"error", NonFinitePolicy::error},
                                                 {"skip", NonFinitePolicy::skip}};
constexpr Named<MomentumConvention> kConventions[] = {{"sum", MomentumConvention::sum},
                                                      {"ema", MomentumConvention::ema},
                                                      {"none", MomentumConvention::none}};

template <class E, size_t N>
E parse_named(const Named<E> (&table)[N], std::string_view name, const char* what) {
  for (const auto& n : table) {
    if (n.name == name) return n.value;
  }
  std::string known;
  for (const auto& n : table) known += (known.empty() ? "" : ", ") + std::string(n.name);
  throw InvalidArgument("unknown " + std::string(what) + " '" + std::string(name) + "' (known: " +
                        known + ")");
}

template <class E, size_t N>
std::string_view name_of(const Named<E> (&table)[N], E value) {
  for (const auto& n : table) {
    if (n.value == value) return n.name;
  }
  return "?";
}

template <class E, size_t N>
std::vector<std::string> names_of(const Named<E> (&table)[N]) {
  std::vector<std::string> out;
  for (const auto& n : table) out.emplace_back(n.name);
  return out;
}

}  // namespace

EpsMode parse_eps_mode(std::string_view name) {
  return parse_named(kEpsModes, name, "eps mode");
}
std::vector<size_t> gram_run_lengths(size_t steps, int restart) {
  const size_t run = restart > 0 ? static_cast<size_t>(restart) : std::max<size_t>(steps, 1);
  std::vector<size_t> runs;
  for (size_t first = 0; first < steps; first += run) runs.push_back(std::min(run, steps - first));
  return runs;
}

NsAlgorithm default_ns_algorithm() { return NsAlgorithm::automatic; }

NsAlgorithm parse_ns_algorithm(std::string_view name) {
  return parse_named(kAlgorithms, name, "Newton-Schulz algorithm");
}
Precision parse_precision(std::string_view name) {
  return parse_named(kPrecisions, name, "precision");
}
NonFinitePolicy parse_nonfinite_policy(std::string_view name) {
  return parse_named(kNonFinite, name, "non-finite policy");
}
MomentumConvention parse_momentum_convention(std::string_view name) {
  if (name == "client") return MomentumConvention::none;  // client-held momentum
  return parse_named(kConventions, name, "momentum convention");
}

std::string_view eps_mode_name(EpsMode mode) {
  return name_of(kEpsModes, mode);
}
std::string_view ns_algorithm_name(NsAlgorithm algorithm) {
  return name_of(kAlgorithms, algorithm);
}
std::string_view precision_name(Precision precision) {
  return name_of(kPrecisions, precision);
}
std::string_view nonfinite_policy_name(NonFinitePolicy policy) {
  return name_of(kNonFinite, policy);
}
std::string_view momentum_convention_name(MomentumConvention convention) {
  return name_of(kConventions, convention);
}

std::vector<std::string> eps_mode_names() {
  return names_of(kEpsModes);
}
std::vector<std::string> ns_algorithm_names() {
  return names_of(kAlgorithms);
}
std::vector<std::string> precision_names() {
  return names_of(kPrecisions);
}
std::vector<std::string> nonfinite_policy_names() {
  return names_of(kNonFinite);
}
std::vector<std::string> momentum_convention_names() {
  return names_of(kConventions);
}

}  // namespace muon

// Elementwise Muon math written once for host and device (llm.c style): the CPU backend and the
// CPU tests run exactly these functions, and the CUDA kernels call the same ones.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define MUON_HD __host__ __device__ __forceinline__
#else
#define MUON_HD inline
#endif

namespace muon {

/// Momentum conventions.
///   sum   M <- mu*M + G; Nesterov input G + mu*M.  Moonlight, dion, DMuon.
///   ema   M <- lerp(M, G, 1 - mu); Nesterov input lerp(G, M, mu).  Keller's reference,
///         torch.optim.Muon (`buf.lerp_(grad, 1 - momentum)`, `grad.lerp(buf, momentum)`),
///         Megatron.
///   none  client-held momentum: the input is orthogonalized as it is, no state is kept.
enum class MomentumConvention { sum, ema, none };

/// The float constants of the momentum math, each rounded once from the double mu exactly as
/// torch does with a Python float: torch.optim.Muon's lerp weight `1 - momentum` is computed in
/// double (Python) and rounded once to float by ATen (`weight.to<float>()`), which differs in the
/// last bit from 1.0f - float(mu) (e.g. mu = 0.95). Made by momentum_coefficients().
struct MomentumCoefficients {
  float mu = 0.95f;          ///< float(mu): sum's mu*M + G, ema's Nesterov lerp(G, M, mu)
  float ema_weight = 0.05f;  ///< float(1 - mu) in double: ema's lerp(M, G, 1 - mu)
};

/// The coefficients of a double mu (see MomentumCoefficients).
MUON_HD MomentumCoefficients momentum_coefficients(double mu) {
  return MomentumCoefficients{static_cast<float>(mu), static_cast<float>(1.0 - mu)};
}

/// torch.lerp on float tensors, bit for bit as ATen's CPU kernel computes it on AVX2/AVX-512
/// (aten/src/ATen/native/cpu/LerpKernel.cpp, lerp_vec): |w| < 0.5: fma(w, end - start, start);
/// else fma(w - 1, end - start, end), one rounding each. ATen's scalar tail (Lerp.h) writes the
/// same formulas unfused, but its compiler contracts them into the same FMAs (checked against
/// torch 2.15 on sizes that are not a multiple of the vector width: every element equal), and
/// CUDA's lerp contracts them too. Our build does not contract (-ffp-contract=off, -fmad=false on
/// the device), so the FMAs are explicit. (A torch forced to ATEN_CPU_CAPABILITY=default rounds
/// twice; that build is not what users run.)
MUON_HD float lerp(float start, float end, float weight) {
  const float diff = end - start;
  return (weight < 0.5f && weight > -0.5f) ? fmaf(weight, diff, start)
                                           : fmaf(weight - 1.0f, diff, end);
}

/// New momentum from the old momentum m and the gradient g.
///   sum: mu*m + g (two roundings); ema: lerp(m, g, 1 - mu) with ema_weight.
MUON_HD float momentum_step(MomentumConvention conv, float m, float g,
                            const MomentumCoefficients& k) {
  switch (conv) {
    case MomentumConvention::sum:
      return k.mu * m + g;
    case MomentumConvention::ema:
      return lerp(m, g, k.ema_weight);
    case MomentumConvention::none:
      break;
  }
  return g;
}

/// The matrix handed to Newton-Schulz: the new momentum m, or with Nesterov the look-ahead
/// (sum: g + mu*m; ema: lerp(g, m, mu)).
MUON_HD float orthogonalize_input(MomentumConvention conv, bool nesterov, float m, float g,
                                  const MomentumCoefficients& k) {
  if (conv == MomentumConvention::none) return g;
  if (!nesterov) return m;
  return conv == MomentumConvention::sum ? g + k.mu * m : lerp(g, m, k.mu);
}

/// True when x is neither NaN nor +-Inf (bit test, safe under -ffast-math).
MUON_HD bool is_finite_bits(float x) {
  union {
    float f;
    unsigned int u;
  } v{x};
  return (v.u & 0x7f800000u) != 0x7f800000u;
}

}  // namespace muon

// Elementwise Muon math written once for host and device (llm.c style): the CPU backend and the
// CPU tests run exactly these functions, and the CUDA kernels call the same ones.
#pragma once

#if defined(__CUDACC__)
#define MUON_HD __host__ __device__ __forceinline__
#else
#define MUON_HD inline
#endif

namespace muon {

/// Momentum conventions.
///   sum   M <- mu*M + G; Nesterov input G + mu*M.  Moonlight, dion, DMuon.
///   ema   M <- lerp(M, G, 1 - mu); Nesterov input lerp(G, M, mu).  Keller's reference,
///         torch.optim.Muon, Megatron.
///   none  client-held momentum: the input is orthogonalized as it is, no state is kept.
enum class MomentumConvention { sum, ema, none };

/// torch.lerp's formula, bit for bit: start + w*(end-start) when |w| < 0.5, else
/// end - (end-start)*(1-w) (ATen's lerp in aten/src/ATen/native/Lerp.h).
MUON_HD float lerp(float start, float end, float weight) {
  const float diff = end - start;
  return (weight < 0.5f && weight > -0.5f) ? start + weight * diff : end - diff * (1.0f - weight);
}

/// New momentum from the old momentum m and the gradient g.
MUON_HD float momentum_step(MomentumConvention conv, float m, float g, float mu) {
  switch (conv) {
    case MomentumConvention::sum:
      return mu * m + g;
    case MomentumConvention::ema:
      return lerp(m, g, 1.0f - mu);
    case MomentumConvention::none:
      break;
  }
  return g;
}

/// The matrix handed to Newton-Schulz: the new momentum m, or with Nesterov the look-ahead
/// (sum: g + mu*m; ema: lerp(g, m, mu)).
MUON_HD float orthogonalize_input(MomentumConvention conv, bool nesterov, float m, float g,
                                  float mu) {
  if (conv == MomentumConvention::none) return g;
  if (!nesterov) return m;
  return conv == MomentumConvention::sum ? g + mu * m : lerp(g, m, mu);
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

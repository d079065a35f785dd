// The per-coordinate formulas of the base optimizers and of bf16 storage,
// shared by the CPU loops (src/optimizer_steps.cpp) and the CUDA kernels
// (cuda/kernels.cu). The scalars that depend on the step counter are computed
// once on the host, in double, and rounded once to float.
//
// The CUDA code is compiled with --fmad=false and IEEE division and square
// root, so a device update is bitwise the CPU's for the same inputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "optex/adam.hpp"
#include "optex/detail/host_device.hpp"
#include "optex/sgd.hpp"

namespace optex::detail {

// ---- SGD (PyTorch torch.optim.SGD, dampening 0) ----------------------------
struct SgdCoefficients {
  float lr = 0.0f;
  float weight_decay = 0.0f;
  float momentum = 0.0f;
  bool use_momentum = false;
  bool first = false;  // the momentum buffer starts as the first gradient
  bool nesterov = false;
};

// For the update that takes the state from `step` to step + 1.
inline SgdCoefficients sgd_coefficients(const Sgd& o, std::int64_t step) {
  return {static_cast<float>(o.lr),
          static_cast<float>(o.weight_decay),
          static_cast<float>(o.momentum),
          o.momentum != 0.0,
          step == 0,
          o.nesterov};
}

// b is the momentum buffer (unused without momentum).
OPTEX_HOST_DEVICE inline void sgd_update(float& x, float& b, float g, const SgdCoefficients& c) {
  const float gi = g + c.weight_decay * x;
  if (!c.use_momentum) {
    x -= c.lr * gi;
    return;
  }
  const float bi = c.first ? gi : c.momentum * b + gi;
  b = bi;
  x -= c.lr * (c.nesterov ? gi + c.momentum * bi : bi);
}

// ---- Adam / AdamW (PyTorch torch.optim.Adam and AdamW) ---------------------
struct AdamCoefficients {
  float step_size = 0.0f;       // lr / (1 - beta1^t)
  float inv_sqrt_bias2 = 0.0f;  // 1 / sqrt(1 - beta2^t)
  float beta1 = 0.0f;
  float beta2 = 0.0f;
  float eps = 0.0f;
  float l2 = 0.0f;      // coupled weight decay (Adam)
  float shrink = 1.0f;  // decoupled weight decay (AdamW): x *= 1 - lr * wd
};

// For the update that takes the state from `step` to step + 1.
inline AdamCoefficients adam_coefficients(const Adam& o, std::int64_t step) {
  const auto t = static_cast<double>(step + 1);
  const double bias1 = 1.0 - std::pow(o.beta1, t);
  const double bias2 = 1.0 - std::pow(o.beta2, t);
  AdamCoefficients c;
  c.step_size = static_cast<float>(o.lr / bias1);
  c.inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  c.beta1 = static_cast<float>(o.beta1);
  c.beta2 = static_cast<float>(o.beta2);
  c.eps = static_cast<float>(o.eps);
  c.l2 = o.decoupled_weight_decay ? 0.0f : static_cast<float>(o.weight_decay);
  c.shrink = static_cast<float>(o.decoupled_weight_decay ? 1.0 - o.lr * o.weight_decay : 1.0);
  return c;
}

OPTEX_HOST_DEVICE inline void adam_update(float& x, float& m, float& v, float g,
                                          const AdamCoefficients& c) {
  const float gi = g + c.l2 * x;
  m = c.beta1 * m + (1.0f - c.beta1) * gi;
  v = c.beta2 * v + (1.0f - c.beta2) * gi * gi;
  const float denom = sqrtf(v) * c.inv_sqrt_bias2 + c.eps;
  x = x * c.shrink - c.step_size * m / denom;
}

// ---- bf16 storage ----------------------------------------------------------
// bfloat16 as its 16 bits: the top half of a float32. Conversion rounds to
// nearest, ties to even; NaN stays NaN (the engine never stores one).
using bf16_bits = std::uint16_t;

OPTEX_HOST_DEVICE inline std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

OPTEX_HOST_DEVICE inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

OPTEX_HOST_DEVICE inline bf16_bits to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_bits>((u >> 16) | 0x40u);  // NaN
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16_bits>((u + rounding) >> 16);
}

OPTEX_HOST_DEVICE inline float from_bf16(bf16_bits b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

// Reads a stored history value as float, whichever the storage type.
OPTEX_HOST_DEVICE inline float load_as_float(float v) { return v; }
OPTEX_HOST_DEVICE inline float load_as_float(bf16_bits v) { return from_bf16(v); }

}  // namespace optex::detail

// bf16 storage of the history, as the CPU emulation and the CUDA kernels
// (cuda/kernels.cu) both convert it: one definition for host and device.
#pragma once

#include <cstdint>
#include <cstring>

#include "optex/backend/host_device.hpp"

namespace optex::detail {

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

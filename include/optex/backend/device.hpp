// Where an engine keeps its iterate, optimizer state and history.
//
//   optex::Options o;
//   o.device = optex::Device::cuda(0);          // everything of size d on GPU 0
//   o.history_precision = optex::Precision::bf16_gradients;  // optional: 3/4 of the memory
#pragma once

#include <string>

namespace optex {

struct Device {
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;  // the CUDA device ordinal; 0 for the CPU

  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {Kind::cuda, index}; }
  bool is_cuda() const { return kind == Kind::cuda; }
  // "cpu" or "cuda:<index>".
  std::string name() const { return is_cuda() ? "cuda:" + std::to_string(index) : "cpu"; }
  friend bool operator==(const Device&, const Device&) = default;
};

// Storage type of the history's points and gradients. Arithmetic is fp32 (and
// fp64 for reductions) whatever the storage. Measured effect on the predicted
// gradient: bench/results/bf16-prediction-effect-2026-11-22.md.
enum class Precision {
  fp32,
  // Points and gradients in bf16: half the memory. Rounding a point moves it
  // by up to 2^-8 |x_i| per coordinate, which swamps the distances between
  // history points once the steps are small next to |x| (Rastrigin: the
  // prediction's cosine to the true gradient fell from 0.98 to 0.37).
  bf16,
  // Gradients in bf16, points in fp32: three quarters of the memory, and the
  // prediction unchanged to a cosine of 0.99997 on every shipped problem.
  bf16_gradients,
};

inline const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32:
      return "fp32";
    case Precision::bf16:
      return "bf16";
    case Precision::bf16_gradients:
      return "bf16_gradients";
  }
  return "unknown";
}

// True when this build of optex contains the CUDA backend.
bool built_with_cuda();
// The number of CUDA devices this process can use; 0 without the CUDA backend,
// without a driver, or without a device. Never throws.
int cuda_device_count();

}  // namespace optex

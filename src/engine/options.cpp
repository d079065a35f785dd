// Options::validate and Stop::validate. Each check names the field and the value it got.
#include <cmath>
#include <concepts>
#include <stdexcept>
#include <string>

#include "optex/backend/block_pool.hpp"
#include "optex/engine/options.hpp"
#include "optex/optimizers/hyperparameter.hpp"

namespace optex {
namespace {

using detail::reject;  // real numbers: the message of every hyperparameter check

// Integers print as integers (1000000, not 1e+06).
template <std::integral T>
[[noreturn]] void reject(const char* name, T value, const char* requirement) {
  throw std::invalid_argument(std::string(name) + ": must be " + requirement + ", got " +
                              std::to_string(value));
}

void require_positive(const char* name, double v) {
  detail::require(name, v, Requirement::positive);
}
void require_non_negative(const char* name, double v) {
  detail::require(name, v, Requirement::non_negative);
}

// A safeguard threshold: above `lowest` (at least 1 when lowest is 1), or +infinity for off.
void require_threshold(const char* name, double v, double lowest) {
  const bool ok = lowest >= 1.0 ? v >= lowest : v > lowest;
  if (std::isnan(v) || !ok) {
    reject(name, v, lowest >= 1.0 ? ">= 1 (+infinity: off)" : "> 0 (+infinity: off)");
  }
}

}  // namespace

void Options::validate() const {
  if (parallelism < 1 || parallelism > kMaxParallelism)
    reject("parallelism", parallelism, "in [1, 65536]");
  // The fit is an O(T0^3) solve and the CUDA step keeps T0 weights in shared
  // memory: a history beyond a few thousand pairs is a mistake, not a setting.
  if (history < 1 || history > kMaxHistory) reject("history", history, "in [1, 4096]");
  require_positive("lengthscale", lengthscale);
  require_non_negative("noise", noise);
  if (selection_interval < 1) reject("selection_interval", selection_interval, ">= 1");
  for (double m : lengthscale_grid) require_positive("lengthscale_grid", m);
  if (static_cast<int>(kernel) < 0 || static_cast<int>(kernel) > 3)
    reject("kernel", static_cast<int>(kernel), "one of the Covariance values");
  if (static_cast<int>(proxy) < 0 || static_cast<int>(proxy) > 2)
    reject("proxy", static_cast<int>(proxy), "one of the Proxy values");
  if (static_cast<int>(proxy_distances) < 0 || static_cast<int>(proxy_distances) > 1)
    reject("proxy_distances", static_cast<int>(proxy_distances),
           "one of the ProxyDistances values");
  if (static_cast<int>(input_scaling) < 0 || static_cast<int>(input_scaling) > 1)
    reject("input_scaling", static_cast<int>(input_scaling), "one of the InputScaling values");
  if (static_cast<int>(warmup) < 0 || static_cast<int>(warmup) > 1)
    reject("warmup", static_cast<int>(warmup), "one of the Warmup values");
  if (device.kind != Device::Kind::cpu && device.kind != Device::Kind::cuda)
    reject("device", static_cast<int>(device.kind), "cpu or cuda");
  if (device.index < 0 || (!device.is_cuda() && device.index != 0))
    reject("device.index", device.index, device.is_cuda() ? ">= 0" : "0 for the CPU");
  if (threads < 0 || threads > kMaxThreads)
    reject("threads", threads, "in [0, 1024] (0: every core)");
  if (static_cast<int>(history_precision) < 0 || static_cast<int>(history_precision) > 2)
    reject("history_precision", static_cast<int>(history_precision), "one of the Precision values");
  if (history_precision != Precision::fp32 && !device.is_cuda()) {
    throw std::invalid_argument(std::string("history_precision: ") +
                                precision_name(history_precision) +
                                " storage is available on CUDA devices only, got device cpu");
  }
  if (static_cast<int>(lengthscale_selection) < 0 || static_cast<int>(lengthscale_selection) > 2)
    reject("lengthscale_selection", static_cast<int>(lengthscale_selection),
           "one of the LengthscaleSelection values");
  if (evaluations_per_point < 1 || evaluations_per_point > parallelism ||
      parallelism % evaluations_per_point != 0) {
    throw std::invalid_argument("evaluations_per_point: must divide parallelism (" +
                                std::to_string(parallelism) + "), got " +
                                std::to_string(evaluations_per_point));
  }
  if (static_cast<int>(strategy) < 0 || static_cast<int>(strategy) > 1)
    reject("strategy", static_cast<int>(strategy), "one of the Strategy values");
  if (static_cast<int>(continue_from) < 0 || static_cast<int>(continue_from) > 1)
    reject("continue_from", static_cast<int>(continue_from), "one of the ContinueFrom values");
  // +infinity turns a safeguard off; NaN and non-positive values are mistakes.
  require_threshold("max_posterior_variance", max_posterior_variance, 0.0);
  require_threshold("trust_region", trust_region, 0.0);
  require_threshold("max_lengthscale_change", max_lengthscale_change, 1.0);
  if (mode != Mode::approximate && mode != Mode::verified)
    reject("mode", static_cast<int>(mode), "approximate or verified");
  if (!(std::isfinite(tolerance) && tolerance >= 0.0))
    reject("tolerance", tolerance, "finite and >= 0");
  if (mode == Mode::verified) {
    // The commit replays the base optimizer through every point of the window
    // with that point's one true gradient: nothing may merge, cut or replace them.
    if (evaluations_per_point != 1)
      reject("evaluations_per_point", evaluations_per_point, "1 in the verified mode");
    if (strategy != Strategy::fixed)
      reject("strategy", static_cast<int>(strategy), "Strategy::fixed in the verified mode");
    if (proxy == Proxy::target)
      reject("proxy", static_cast<int>(proxy),
             "Proxy::gp or Proxy::last_gradient in the verified mode");
    if (std::isfinite(max_posterior_variance))
      reject("max_posterior_variance", max_posterior_variance, "+infinity in the verified mode");
    if (std::isfinite(trust_region))
      reject("trust_region", trust_region, "+infinity in the verified mode");
    // The next round redoes the unverified steps with gradients the history keeps.
    if (history < parallelism)
      reject("history", history, "at least the parallelism in the verified mode");
  }
}

void Stop::validate() const {
  if (max_iters < 0) reject("max_iters", static_cast<double>(max_iters), ">= 0");
  if (std::isnan(target_loss)) reject("target_loss", target_loss, "a number");
  require_non_negative("grad_tol", grad_tol);
}

bool Options::separates_points_from_rows() const {
  return evaluations_per_point > 1 || strategy == Strategy::adaptive ||
         std::isfinite(max_posterior_variance) || std::isfinite(trust_region);
}

}  // namespace optex

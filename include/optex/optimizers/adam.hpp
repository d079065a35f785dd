// Adam (Kingma and Ba 2015) with PyTorch's torch.optim.Adam / AdamW semantics:
// coupled L2 weight decay by default, decoupled (AdamW, Loshchilov and Hutter
// 2019) when `decoupled_weight_decay` is set.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include "optex/backend/host_device.hpp"
#include "optex/optimizers/hyperparameter.hpp"
#include "optex/optimizers/optimizer_state.hpp"
#include "optex/optimizers/torch_arithmetic.hpp"

namespace optex {

struct Adam {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;

  static constexpr std::string_view name = "adam";
  static constexpr std::uint8_t checkpoint_tag = 1;

  static constexpr auto hyperparameters() {
    return std::tuple{
        Hyperparameter<Adam, double>{"lr", &Adam::lr, Requirement::non_negative,
                                     "Learning rate (>= 0; at 0 the state still advances)."},
        Hyperparameter<Adam, double>{"beta1", &Adam::beta1, Requirement::unit_interval,
                                     "Decay of the first moment, in [0, 1)."},
        Hyperparameter<Adam, double>{"beta2", &Adam::beta2, Requirement::unit_interval,
                                     "Decay of the second moment, in [0, 1)."},
        Hyperparameter<Adam, double>{"eps", &Adam::eps, Requirement::non_negative,
                                     "Added to the denominator (>= 0; at 0 a coordinate whose "
                                     "moments are 0 gives 0 / 0, a step the engine refuses)."},
        Hyperparameter<Adam, double>{
            "weight_decay", &Adam::weight_decay, Requirement::non_negative,
            "Weight decay (>= 0): coupled L2 for Adam (adds weight_decay * x to the gradient), "
            "decoupled for AdamW (x -= lr * weight_decay * x before each step)."},
        Hyperparameter<Adam, bool>{"decoupled_weight_decay", &Adam::decoupled_weight_decay,
                                   Requirement::flag, "AdamW's decoupled weight decay.",
                                   /*in_python=*/false},
    };
  }

  static constexpr std::array<PythonClass<Adam>, 2> python_classes() {
    return {{{"Adam",
              "Adam with torch.optim.Adam semantics: bias-corrected moments, and weight_decay\n"
              "as coupled L2 (added to the gradient). See AdamW for decoupled weight decay.",
              Adam{}},
             {"AdamW",
              "AdamW (Loshchilov and Hutter 2019) with torch.optim.AdamW semantics and\n"
              "defaults: Adam whose weight decay is decoupled, x -= lr * weight_decay * x\n"
              "before the Adam step (weight_decay 1e-2 by default).",
              Adam{.weight_decay = 1e-2, .decoupled_weight_decay = true}}}};
  }

  // torch.optim.Adam's and AdamW's bounds: lr, eps, weight_decay >= 0, betas in [0, 1).
  void validate() const { detail::check_hyperparameters(*this); }

  // ---- state: the first and second moments ----
  static constexpr int kExpAvg = 0;
  static constexpr int kExpAvgSq = 1;
  static constexpr std::array<std::string_view, 2> slot_names{"exp_avg", "exp_avg_sq"};
  // A sum of squares: a checkpoint holding a negative one is refused.
  static constexpr StateSlots non_negative_slots = StateSlots{}.with(kExpAvgSq);
  StateSlots state_slots() const { return StateSlots{}.with(kExpAvg).with(kExpAvgSq); }

  std::string cannot_become(const Adam& next) const {
    if (next.decoupled_weight_decay == decoupled_weight_decay) return {};
    return std::string("decoupled_weight_decay: ") +
           (next.decoupled_weight_decay ? "AdamW" : "Adam") + " cannot replace " +
           (decoupled_weight_decay ? "AdamW" : "Adam") +
           " (a different algorithm); start a new engine";
  }

  // ---- the update ----
  // The scalars of one step, formed as torch.optim.Adam forms them: in double
  // (1 - beta, the bias corrections, lr / bias1), then rounded once to float.
  struct Coefficients {
    float beta1 = 0.0f;
    float one_minus_beta1 = 0.0f;
    float beta2 = 0.0f;
    float one_minus_beta2 = 0.0f;
    float step_size = 0.0f;   // lr / (1 - beta1^t)
    float bias2_sqrt = 0.0f;  // (1 - beta2^t)^0.5
    float eps = 0.0f;
    float l2 = 0.0f;      // coupled weight decay (Adam)
    float shrink = 1.0f;  // decoupled weight decay (AdamW): x *= 1 - lr * wd
  };

  // For the update that takes the state from `step` to step + 1.
  Coefficients coefficients(std::int64_t step) const {
    const auto t = static_cast<double>(step + 1);
    const double bias1 = 1.0 - std::pow(beta1, t);
    const double bias2 = 1.0 - std::pow(beta2, t);
    Coefficients c;
    c.beta1 = static_cast<float>(beta1);
    c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
    c.beta2 = static_cast<float>(beta2);
    c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
    c.step_size = static_cast<float>(lr / bias1);
    c.bias2_sqrt = static_cast<float>(std::pow(bias2, 0.5));
    c.eps = static_cast<float>(eps);
    c.l2 = decoupled_weight_decay ? 0.0f : static_cast<float>(weight_decay);
    c.shrink = static_cast<float>(decoupled_weight_decay ? 1.0 - lr * weight_decay : 1.0);
    return c;
  }

  // torch.optim.Adam's single-tensor steps: x *= shrink (AdamW), g += l2 x,
  // m.lerp_(g, 1 - beta1), v = v beta2 + (1 - beta2) g g,
  // x -= step_size m / (sqrt(v) / bias2_sqrt + eps).
  OPTEX_HOST_DEVICE static void update(float& x, float g, SlotValues& s, const Coefficients& c) {
    x = x * c.shrink;
    const float gi = g + c.l2 * x;
    float& m = s[kExpAvg];
    float& v = s[kExpAvgSq];
    m = detail::lerp(m, gi, c.one_minus_beta1);
    v = v * c.beta2 + c.one_minus_beta2 * gi * gi;
    const float denom = sqrtf(v) / c.bias2_sqrt + c.eps;
    x = x - c.step_size * m / denom;
  }

  friend bool operator==(const Adam&, const Adam&) = default;
};

// AdamW with PyTorch's defaults (weight decay 1e-2).
inline Adam adamw(double lr = 1e-3, double weight_decay = 1e-2) {
  return Adam{.lr = lr, .weight_decay = weight_decay, .decoupled_weight_decay = true};
}

}  // namespace optex

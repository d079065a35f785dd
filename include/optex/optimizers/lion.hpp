// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"):
// the sign of an interpolation between the momentum and the gradient, with
// decoupled weight decay. One state slot, no epsilon, no bias correction.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include "optex/backend/host_device.hpp"
#include "optex/optimizers/hyperparameter.hpp"
#include "optex/optimizers/optimizer_state.hpp"
#include "optex/optimizers/torch_arithmetic.hpp"

namespace optex {

struct Lion {
  double lr = 1e-4;
  double beta1 = 0.9;         // interpolation that forms the update's sign
  double beta2 = 0.99;        // decay of the momentum
  double weight_decay = 0.0;  // decoupled: x -= lr * weight_decay * x before each step

  static constexpr std::string_view name = "lion";
  static constexpr std::uint8_t checkpoint_tag = 3;

  static constexpr auto hyperparameters() {
    return std::tuple{
        Hyperparameter<Lion, double>{"lr", &Lion::lr, Requirement::non_negative,
                                     "Learning rate (>= 0); every coordinate moves by lr."},
        Hyperparameter<Lion, double>{"beta1", &Lion::beta1, Requirement::unit_interval,
                                     "Interpolation of momentum and gradient in the update's "
                                     "sign, in [0, 1)."},
        Hyperparameter<Lion, double>{"beta2", &Lion::beta2, Requirement::unit_interval,
                                     "Decay of the momentum, in [0, 1)."},
        Hyperparameter<Lion, double>{
            "weight_decay", &Lion::weight_decay, Requirement::non_negative,
            "Decoupled weight decay (>= 0): x -= lr * weight_decay * x before each step."},
    };
  }

  static constexpr std::array<PythonClass<Lion>, 1> python_classes() {
    return {{{"Lion",
              "Lion (Chen et al. 2023): x -= lr * sign(beta1 * m + (1 - beta1) * g), then\n"
              "m = beta2 * m + (1 - beta2) * g, with decoupled weight decay. Every coordinate\n"
              "moves by exactly lr: use a learning rate 3-10x smaller than AdamW's.",
              Lion{}}}};
  }

  // Not in torch.optim: the bounds of its nearest relative there, AdamW (lr and
  // weight_decay >= 0, betas in [0, 1), no bound on lr * weight_decay).
  void validate() const { detail::check_hyperparameters(*this); }

  // ---- state: the momentum ----
  static constexpr int kExpAvg = 0;
  static constexpr std::array<std::string_view, 1> slot_names{"exp_avg"};
  static constexpr StateSlots non_negative_slots{};
  StateSlots state_slots() const { return StateSlots{}.with(kExpAvg); }

  std::string cannot_become(const Lion&) const { return {}; }

  // ---- the update ----
  struct Coefficients {
    float lr = 0.0f;
    float beta1 = 0.0f;
    float one_minus_beta1 = 0.0f;
    float beta2 = 0.0f;
    float one_minus_beta2 = 0.0f;
    float shrink = 1.0f;  // 1 - lr * weight_decay
  };

  Coefficients coefficients(std::int64_t /*step: no bias correction*/) const {
    Coefficients c;
    c.lr = static_cast<float>(lr);
    c.beta1 = static_cast<float>(beta1);
    c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
    c.beta2 = static_cast<float>(beta2);
    c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
    c.shrink = static_cast<float>(1.0 - lr * weight_decay);
    return c;
  }

  // x *= 1 - lr wd; x -= lr sign(m beta1 + (1 - beta1) g); m = m beta2 + (1 - beta2) g.
  OPTEX_HOST_DEVICE static void update(float& x, float g, SlotValues& s, const Coefficients& c) {
    float& m = s[kExpAvg];
    x = x * c.shrink;
    const float direction = m * c.beta1 + c.one_minus_beta1 * g;
    x = x - c.lr * detail::sign(direction);
    m = m * c.beta2 + c.one_minus_beta2 * g;
  }

  friend bool operator==(const Lion&, const Lion&) = default;
};

}  // namespace optex

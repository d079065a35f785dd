// Stochastic gradient descent with momentum, Nesterov momentum and (coupled)
// weight decay, with PyTorch's torch.optim.SGD semantics (dampening 0).
//
// Everything the library needs to know about SGD is in this file: the
// hyperparameters and their rules, the state it keeps, the per-coordinate
// update (shared by the CPU loop and the CUDA kernel), its checkpoint tag and
// its Python class (docs/DESIGN.md section 9).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include "optex/backend/host_device.hpp"
#include "optex/optimizers/hyperparameter.hpp"
#include "optex/optimizers/optimizer_state.hpp"

namespace optex {

struct Sgd {
  double lr = 1e-2;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;  // adds weight_decay * x to the gradient

  static constexpr std::string_view name = "sgd";
  static constexpr std::uint8_t checkpoint_tag = 0;

  static constexpr auto hyperparameters() {
    return std::tuple{
        Hyperparameter<Sgd, double>{"lr", &Sgd::lr, Requirement::non_negative,
                                    "Learning rate (>= 0; at 0 the state still advances)."},
        Hyperparameter<Sgd, double>{"momentum", &Sgd::momentum, Requirement::non_negative,
                                    "Momentum factor (>= 0, as torch.optim.SGD; < 1 to converge)."},
        Hyperparameter<Sgd, bool>{"nesterov", &Sgd::nesterov, Requirement::flag,
                                  "Nesterov momentum (needs momentum > 0)."},
        Hyperparameter<Sgd, double>{
            "weight_decay", &Sgd::weight_decay, Requirement::non_negative,
            "Coupled L2 weight decay (>= 0): adds weight_decay * x to the gradient."},
    };
  }

  static constexpr std::array<PythonClass<Sgd>, 1> python_classes() {
    return {{{"Sgd",
              "Stochastic gradient descent with torch.optim.SGD semantics (dampening 0).\n\n"
              "With momentum, the buffer starts as the first gradient (PyTorch), and\n"
              "nesterov=True uses Nesterov momentum. weight_decay adds weight_decay * x to the\n"
              "gradient (coupled L2).",
              Sgd{}}}};
  }

  // Throws std::invalid_argument naming the first bad hyperparameter. torch.optim.SGD's
  // bounds: lr, momentum, weight_decay >= 0, and nesterov needs momentum > 0.
  void validate() const {
    detail::check_hyperparameters(*this);
    if (nesterov && momentum == 0.0)
      detail::reject("momentum", momentum, "> 0 when nesterov is set");
  }

  // ---- state: slot 0 is the momentum buffer, kept only with momentum ----
  static constexpr int kMomentumBuffer = 0;
  static constexpr std::array<std::string_view, 1> slot_names{"momentum_buffer"};
  // Slots that hold sums of squares, never negative (none here).
  static constexpr StateSlots non_negative_slots{};
  StateSlots state_slots() const {
    return momentum != 0.0 ? StateSlots{}.with(kMomentumBuffer) : StateSlots{};
  }

  // Why `next` cannot replace these values in a running engine ("" if it can).
  std::string cannot_become(const Sgd& next) const {
    return detail::momentum_buffer_change(momentum, next.momentum);
  }

  // ---- the update ----
  struct Coefficients {
    float lr = 0.0f;
    float weight_decay = 0.0f;
    float momentum = 0.0f;
    bool use_momentum = false;
    bool first = false;  // the momentum buffer starts as the first gradient
    bool nesterov = false;
  };

  // For the update that takes the state from `step` to step + 1.
  Coefficients coefficients(std::int64_t step) const {
    return {static_cast<float>(lr),
            static_cast<float>(weight_decay),
            static_cast<float>(momentum),
            momentum != 0.0,
            step == 0,
            nesterov};
  }

  // PyTorch's operations in PyTorch's order: buf = momentum * buf + g (the
  // first gradient as is), x -= lr * (g + momentum * buf or buf).
  OPTEX_HOST_DEVICE static void update(float& x, float g, SlotValues& s, const Coefficients& c) {
    const float gi = g + c.weight_decay * x;
    if (!c.use_momentum) {
      x -= c.lr * gi;
      return;
    }
    float& b = s[kMomentumBuffer];
    const float bi = c.first ? gi : c.momentum * b + gi;
    b = bi;
    x -= c.lr * (c.nesterov ? gi + c.momentum * bi : bi);
  }

  friend bool operator==(const Sgd&, const Sgd&) = default;
};

}  // namespace optex

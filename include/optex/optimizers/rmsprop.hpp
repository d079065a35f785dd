// RMSprop (Hinton's lecture 6e; Graves 2013 for the centered form) with
// PyTorch's torch.optim.RMSprop semantics: coupled weight decay, optional
// momentum on the scaled gradient, optional centering by the gradient average.
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

struct RmsProp {
  double lr = 1e-2;
  double alpha = 0.99;  // decay of the squared-gradient average
  double eps = 1e-8;
  double weight_decay = 0.0;  // adds weight_decay * x to the gradient
  double momentum = 0.0;
  bool centered = false;  // divide by the estimated variance instead of the raw second moment

  static constexpr std::string_view name = "rmsprop";
  static constexpr std::uint8_t checkpoint_tag = 2;

  static constexpr auto hyperparameters() {
    return std::tuple{
        Hyperparameter<RmsProp, double>{"lr", &RmsProp::lr, Requirement::non_negative,
                                        "Learning rate (>= 0; at 0 the state still advances)."},
        Hyperparameter<RmsProp, double>{
            "alpha", &RmsProp::alpha, Requirement::non_negative,
            "Decay of the squared-gradient average (>= 0, as torch.optim.RMSprop; "
            "above 1 the average turns negative and every step it touches is refused)."},
        Hyperparameter<RmsProp, double>{"eps", &RmsProp::eps, Requirement::non_negative,
                                        "Added to the denominator (>= 0; at 0 a zero average "
                                        "gives 0 / 0, a step the engine refuses)."},
        Hyperparameter<RmsProp, double>{
            "weight_decay", &RmsProp::weight_decay, Requirement::non_negative,
            "Coupled L2 weight decay (>= 0): adds weight_decay * x to the gradient."},
        Hyperparameter<RmsProp, double>{
            "momentum", &RmsProp::momentum, Requirement::non_negative,
            "Momentum factor on the scaled gradient (>= 0, as torch.optim.RMSprop)."},
        Hyperparameter<RmsProp, bool>{"centered", &RmsProp::centered, Requirement::flag,
                                      "Divide by sqrt(E[g^2] - E[g]^2) instead of sqrt(E[g^2])."},
    };
  }

  static constexpr std::array<PythonClass<RmsProp>, 1> python_classes() {
    return {{{"RmsProp",
              "RMSprop with torch.optim.RMSprop semantics: a running average of squared\n"
              "gradients (decay alpha) scales each step; momentum > 0 keeps a buffer of the\n"
              "scaled gradients, centered=True subtracts the squared running mean of the\n"
              "gradients first. weight_decay is coupled L2 (added to the gradient).",
              RmsProp{}}}};
  }

  // torch.optim.RMSprop's bounds: lr, alpha, eps, weight_decay, momentum >= 0.
  void validate() const { detail::check_hyperparameters(*this); }

  // ---- state: the squared average; the buffer and the gradient average where used ----
  static constexpr int kSquareAvg = 0;
  static constexpr int kMomentumBuffer = 1;
  static constexpr int kGradAvg = 2;
  static constexpr std::array<std::string_view, 3> slot_names{"square_avg", "momentum_buffer",
                                                              "grad_avg"};
  // A sum of squares: a checkpoint holding a negative one is refused.
  static constexpr StateSlots non_negative_slots = StateSlots{}.with(kSquareAvg);
  StateSlots state_slots() const {
    StateSlots s = StateSlots{}.with(kSquareAvg);
    if (momentum != 0.0) s = s.with(kMomentumBuffer);
    if (centered) s = s.with(kGradAvg);
    return s;
  }

  std::string cannot_become(const RmsProp& next) const {
    std::string why = detail::momentum_buffer_change(momentum, next.momentum);
    if (why.empty() && next.centered != centered) {
      why = std::string("centered: ") + (next.centered ? "true" : "false") + " cannot replace " +
            (centered ? "true" : "false") +
            " (the gradient average exists only when centered); start a new engine";
    }
    return why;
  }

  // ---- the update ----
  struct Coefficients {
    float lr = 0.0f;
    float alpha = 0.0f;
    float one_minus_alpha = 0.0f;  // 1 - alpha in double, rounded once (PyTorch)
    float eps = 0.0f;
    float weight_decay = 0.0f;
    float momentum = 0.0f;
    bool use_momentum = false;
    bool centered = false;
  };

  Coefficients coefficients(std::int64_t /*step: RMSprop has no bias correction*/) const {
    Coefficients c;
    c.lr = static_cast<float>(lr);
    c.alpha = static_cast<float>(alpha);
    c.one_minus_alpha = static_cast<float>(1.0 - alpha);
    c.eps = static_cast<float>(eps);
    c.weight_decay = static_cast<float>(weight_decay);
    c.momentum = static_cast<float>(momentum);
    c.use_momentum = momentum > 0.0;
    c.centered = centered;
    return c;
  }

  // torch.optim.RMSprop's single-tensor steps: g += wd x;
  // sq = sq alpha + (1 - alpha) g g; centered: ga.lerp_(g, 1 - alpha),
  // avg = sqrt(sq - ga ga) + eps, else sqrt(sq) + eps; with momentum
  // buf = buf momentum + g / avg, x -= lr buf; else x -= lr g / avg.
  OPTEX_HOST_DEVICE static void update(float& x, float g, SlotValues& s, const Coefficients& c) {
    const float gi = g + c.weight_decay * x;
    float& sq = s[kSquareAvg];
    sq = sq * c.alpha + c.one_minus_alpha * gi * gi;
    float avg;
    if (c.centered) {
      float& ga = s[kGradAvg];
      ga = detail::lerp(ga, gi, c.one_minus_alpha);
      avg = sqrtf(sq - ga * ga);
    } else {
      avg = sqrtf(sq);
    }
    avg = avg + c.eps;
    if (c.use_momentum) {
      float& buf = s[kMomentumBuffer];
      buf = buf * c.momentum + gi / avg;
      x = x - c.lr * buf;
    } else {
      x = x - c.lr * gi / avg;
    }
  }

  friend bool operator==(const RmsProp&, const RmsProp&) = default;
};

}  // namespace optex

// optex.IterationInfo: what OptEx.tell() reports about the iteration it
// committed, as the Python class holds it.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "optex/engine/engine.hpp"

namespace optex::python {

namespace py = pybind11;

// What tell() reports: IterationInfo without its iterate view (the engine's
// `x` is the iterate, as a copy).
struct Info {
  std::int64_t iteration;
  std::int64_t evaluations;
  double loss;
  double best_loss;
  double grad_norm;
  double cosine;
  double lengthscale;
  int committed_point;
  int dropped;
  std::vector<int> point_evaluations;
  std::vector<double> posterior_variance;
  std::vector<double> prediction_error;
  double gradient_noise;
  std::string chain_stop;
  int committed_steps;
  double disagreement;

  explicit Info(const IterationInfo& i)
      : iteration(i.iteration),
        evaluations(i.evaluations),
        loss(i.loss),
        best_loss(i.best_loss),
        grad_norm(i.grad_norm),
        cosine(i.cosine),
        lengthscale(i.lengthscale),
        committed_point(i.committed_point),
        dropped(i.dropped),
        point_evaluations(i.point_evaluations),
        posterior_variance(i.posterior_variance),
        prediction_error(i.prediction_error),
        gradient_noise(i.gradient_noise),
        chain_stop(i.chain_stop),
        committed_steps(i.committed_steps),
        disagreement(i.disagreement) {}
};

// Registers optex.IterationInfo (read-only attributes and repr).
void register_iteration_info(py::module_& m);

}  // namespace optex::python

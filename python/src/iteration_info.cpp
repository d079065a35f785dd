// optex.IterationInfo's registration: its read-only attributes, their
// documentation, and its repr.
#include "iteration_info.hpp"

#include <pybind11/stl.h>

#include "bindings.hpp"

namespace optex::python {

void register_iteration_info(py::module_& m) {
  py::class_<Info> cls(m, "IterationInfo", py::is_final(),
                       R"doc(What OptEx.tell() reports about the iteration it committed (read-only).
)doc");
  exported_from(cls, "optex");
  cls.def_readonly("iteration", &Info::iteration,
                   "Iterations committed so far (1 after the first tell).");
  cls.def_readonly("evaluations", &Info::evaluations, "True gradient evaluations so far.");
  cls.def_readonly("loss", &Info::loss,
                   "Loss at the point the commit stepped from (the last finite one).");
  cls.def_readonly("best_loss", &Info::best_loss, "Lowest finite loss of the batch.");
  cls.def_readonly("grad_norm", &Info::grad_norm,
                   "Euclidean norm of the gradient the commit stepped with.");
  cls.def_readonly("cosine", &Info::cosine,
                   "Mean cosine between predicted and true gradient over the proxy points that "
                   "had a real prediction; nan when none had (N = 1, warm-up).");
  cls.def_readonly("lengthscale", &Info::lengthscale,
                   "The lengthscale this iteration's proxy steps used.");
  cls.def_readonly(
      "committed_point", &Info::committed_point,
      "Index, among the round's distinct points, of the point the commit stepped "
      "from (the last one unless points were dropped or continue_from is "
      "'best_loss'); its first batch row is sum(point_evaluations[:committed_point]).");
  cls.def_readonly("dropped", &Info::dropped,
                   "Evaluations with a non-finite gradient or loss, kept out of the history.");
  cls.def_readonly("point_evaluations", &Info::point_evaluations,
                   "Per distinct point of the round, in batch order: how many of the N "
                   "evaluations (batch rows) it had; they add up to N. A new list per access.");
  cls.def_readonly("posterior_variance", &Info::posterior_variance,
                   "Per distinct point: the GP posterior variance there, in units of the prior "
                   "variance, where a GP prediction was made (the proxy step from the point, or "
                   "the prediction a safeguard refused); nan elsewhere.");
  cls.def_readonly("prediction_error", &Info::prediction_error,
                   "Per distinct point: ||g - mu|| / ||g|| between its measured gradient (the "
                   "mean of its admissible evaluations) and the prediction its proxy step used; "
                   "nan where nothing was predicted or the point was dropped.");
  cls.def_readonly("gradient_noise", &Info::gradient_noise,
                   "Gradient noise against signal per evaluation (rho): the mean over points "
                   "with m >= 2 admissible evaluations of tr(C) / (||mean||^2 - tr(C) / m), C "
                   "the sample covariance of one evaluation; 1e30 where the denominator is not "
                   "positive (noise only); nan when no point had two.");
  cls.def_readonly("chain_stop", &Info::chain_stop,
                   "Why the proxy chain ended before its planned length: '' (it did not), "
                   "'posterior_variance' or 'trust_region'.");
  cls.def_readonly("committed_steps", &Info::committed_steps,
                   "Verified mode: the base optimizer's steps this round committed, 1 to N; 1 "
                   "in the approximate mode.");
  cls.def_readonly("disagreement", &Info::disagreement,
                   "Verified mode: the largest ||guess - replayed|| / ||replayed|| among the "
                   "guesses this round accepted (0 at tolerance 0); nan in the approximate mode.");
  cls.def("__repr__", [](const Info& i) {
    return py::str(
               "IterationInfo(iteration={!r}, evaluations={!r}, loss={!r}, best_loss={!r}, "
               "grad_norm={!r}, cosine={!r}, lengthscale={!r}, committed_point={!r}, "
               "dropped={!r}, point_evaluations={!r}, posterior_variance={!r}, "
               "prediction_error={!r}, gradient_noise={!r}, chain_stop={!r}, "
               "committed_steps={!r}, disagreement={!r})")
        .format(i.iteration, i.evaluations, i.loss, i.best_loss, i.grad_norm, i.cosine,
                i.lengthscale, i.committed_point, i.dropped, i.point_evaluations,
                i.posterior_variance, i.prediction_error, i.gradient_noise, i.chain_stop,
                i.committed_steps, i.disagreement);
  });
}

}  // namespace optex::python

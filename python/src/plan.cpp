// optex.plan: will OptEx pay off? The core's planner (plan.hpp), with the
// gradient time given or measured from a Python objective, and optex.Plan,
// optex.PlanCandidate for what it returns.
#include "optex/planning/plan.hpp"
#include "optex/planning/spread.hpp"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "names.hpp"
#include "optex/engine/options.hpp"
#include "optex/util/random.hpp"

namespace optex::python {
namespace {

constexpr std::uint64_t kObjectivePointSeed = 0x6f626a;  // "obj"

// What the objective's first call returned, checked as optex.minimize checks
// a result (optex._values: the loss a real number; a gradient of float32 or
// float64, a list or tuple of real numbers read as float64, an integer or
// float16 array refused, never cast, of shape (dim,)) and stricter: both
// finite (the point is in [-1, 1]: an objective that returns NaN there times
// a failure, not a gradient).
void check_objective_result(const py::object& result, std::size_t dim) {
  const std::string shape_text =
      "(loss, gradient) with a gradient of " + std::to_string(dim) + " entries";
  if (!py::isinstance<py::sequence>(result) || py::isinstance<py::str>(result) ||
      py::len(result) != 2) {
    throw std::invalid_argument("objective: must return " + shape_text + ", got a " +
                                py::str(py::type::of(result).attr("__name__")).cast<std::string>());
  }
  const py::object loss_object = result[py::int_(0)];
  const py::object grad_object = result[py::int_(1)];
  // optex's one rule for values (python/optex/_values.py), as optex.minimize
  // applies it; its ValueError names the value.
  const py::module_ values = py::module_::import("optex._values");
  const double loss =
      values.attr("real_loss")(loss_object, "objective: the loss it returned").cast<double>();
  if (!std::isfinite(loss)) {
    throw std::invalid_argument("objective: the loss it returned at a point in [-1, 1] is " +
                                py::repr(py::float_(loss)).cast<std::string>() +
                                "; the planner times a finite evaluation");
  }
  const py::array grad =
      values.attr("real_gradient")(grad_object, dim, "objective: the gradient it returned")
          .cast<py::array>();
  const py::module_ np = py::module_::import("numpy");
  const py::array bad = np.attr("flatnonzero")(np.attr("logical_not")(np.attr("isfinite")(grad)));
  if (bad.size() > 0) {
    const py::object first = bad.attr("__getitem__")(0);
    throw std::invalid_argument(
        "objective: the gradient it returned at a point in [-1, 1] holds " +
        py::repr(py::float_(grad.attr("__getitem__")(first))).cast<std::string>() + " at element " +
        py::str(first).cast<std::string>() + " (" + py::str(bad.attr("size")).cast<std::string>() +
        " non-finite entries); the planner times a finite evaluation");
  }
}

// The median of `calls` calls of objective(x) at a random point (uniform in
// [-1, 1], fixed seed), after one untimed call whose result must pass
// check_objective_result. x is read-only, as optex.minimize's points are: every
// call times the same point, and an objective may keep it. The first result is
// checked before the next call (a reused gradient buffer is read in time); the
// timed calls' results are dropped unread.
double time_objective(const py::function& objective, std::size_t dim, int calls) {
  py::array_t<float> x(static_cast<py::ssize_t>(dim));
  SplitMix64 rng(kObjectivePointSeed);
  float* data = x.mutable_data();
  for (std::size_t i = 0; i < dim; ++i) data[i] = static_cast<float>(rng.uniform(-1.0, 1.0));
  x.attr("setflags")(py::arg("write") = false);

  check_objective_result(objective(x), dim);

  std::vector<double> times;
  for (int i = 0; i < calls; ++i) {
    const auto start = std::chrono::steady_clock::now();
    objective(x);
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  // A clock that did not advance still leaves a time the planner accepts.
  return std::max(spread_of(std::move(times)).median, 1e-9);
}

// What a timer returned, as seconds: a real number (a bool or anything else
// is the timer's fault, named; the planner then checks its value).
double timer_seconds(const py::object& returned, const char* timer) {
  if (py::isinstance<py::bool_>(returned) || !PyNumber_Check(returned.ptr()) ||
      py::isinstance<py::array>(returned)) {
    throw py::type_error(std::string(timer) + ": must return a number of seconds, got a " +
                         py::str(py::type::of(returned).attr("__name__")).cast<std::string>());
  }
  return py::float_(returned).cast<double>();
}

Plan make_plan(py::ssize_t dim, int parallelism, int history,
               std::optional<double> gradient_seconds, std::optional<py::function> objective,
               const std::string& device, int threads, double efficiency,
               std::optional<double> gradient_noise, int repetitions,
               std::optional<py::function> round_timer, std::optional<py::function> step_timer) {
  if (dim < 1) throw std::invalid_argument("dim: must be >= 1, got " + std::to_string(dim));
  // Named as the argument here (the request calls it max_parallelism).
  if (parallelism < 1 || parallelism > kMaxParallelism) {
    throw std::invalid_argument("parallelism: must be in [1, 65536], got " +
                                std::to_string(parallelism));
  }
  if (gradient_seconds.has_value() == objective.has_value()) {
    throw std::invalid_argument(
        "gradient_seconds, objective: give exactly one (the seconds of one gradient "
        "evaluation, or a callable to time)");
  }
  PlanRequest r;
  r.dim = static_cast<std::size_t>(dim);
  r.max_parallelism = parallelism;
  r.history = history;
  r.device = parse_device("device", device);
  r.threads = threads;
  r.efficiency = efficiency;
  if (gradient_noise) r.gradient_noise = *gradient_noise;
  r.repetitions = repetitions;
  // Everything but the gradient time is checked before the objective runs.
  r.gradient_seconds = gradient_seconds.value_or(1.0);
  r.validate();
  // A measurement of this machine (a timer not given) that cannot fit in its
  // memory is refused before the objective runs or anything is allocated.
  if (!round_timer || !step_timer) check_plan_memory(r);
  if (objective) r.gradient_seconds = time_objective(*objective, r.dim, r.repetitions);

  RoundTimer rounds;
  if (round_timer) {
    rounds = [&round_timer](const RoundShape& s) {
      py::gil_scoped_acquire gil;
      return timer_seconds((*round_timer)(s.dim, s.parallelism, s.history), "round_timer");
    };
  }
  StepTimer steps;
  if (step_timer) {
    steps = [&step_timer](std::size_t d) {
      py::gil_scoped_acquire gil;
      return timer_seconds((*step_timer)(d), "step_timer");
    };
  }
  py::gil_scoped_release release;
  return plan(r, rounds, steps);
}

// A Spread as a dict: median, low_quartile, high_quartile, min, max, count.
py::dict spread_dict(const Spread& s) {
  py::dict d;
  d["median"] = s.median;
  d["low_quartile"] = s.low_quartile;
  d["high_quartile"] = s.high_quartile;
  d["min"] = s.min;
  d["max"] = s.max;
  d["count"] = s.count;
  return d;
}

void register_candidate(py::module_& m) {
  py::class_<PlanCandidate> cls(m, "PlanCandidate", py::is_final(),
                                R"doc(One configuration optex.plan measured (read-only).
)doc");
  exported_from(cls, "optex");
  cls.def_readonly("parallelism", &PlanCandidate::parallelism, "N: evaluations per round.");
  cls.def_readonly("points", &PlanCandidate::points, "P = N / D: distinct points per round.");
  cls.def_readonly("evaluations_per_point", &PlanCandidate::evaluations_per_point,
                   "D: evaluations per point.");
  cls.def_readonly("history", &PlanCandidate::history, "T0: the history's size.");
  cls.def_readonly("overhead_seconds", &PlanCandidate::overhead_seconds,
                   "o, the median of its samples: a round's ask() + tell() in seconds; the plain "
                   "step when P = 1.");
  cls.def_property_readonly(
      "overhead_spread", [](const PlanCandidate& c) { return spread_dict(c.overhead); },
      "o's samples summarised: a dict of median, low_quartile, high_quartile, min, max "
      "(seconds) and count (the repetitions). A new dict per access.");
  cls.def_readonly("round_seconds", &PlanCandidate::round_seconds, "gradient_seconds + o.");
  cls.def_readonly("steps_per_round", &PlanCandidate::steps_per_round,
                   "s = 1 + efficiency (P - 1): the sequential steps a round is worth.");
  cls.def_readonly("seconds_per_step", &PlanCandidate::seconds_per_step, "round_seconds / s.");
  cls.def_readonly("seconds_per_step_low", &PlanCandidate::seconds_per_step_low,
                   "(gradient_seconds + o) / s at o's low quartile.");
  cls.def_readonly("seconds_per_step_high", &PlanCandidate::seconds_per_step_high,
                   "(gradient_seconds + o) / s at o's high quartile.");
  cls.def_readonly("break_even_gradient_seconds", &PlanCandidate::break_even_gradient_seconds,
                   "max(0, (o - s p) / (s - 1)), p the plain step: the gradient time above "
                   "which this configuration beats the plain optimizer; nan when P = 1.");
  cls.def_readonly("break_even_low", &PlanCandidate::break_even_low,
                   "The break-even at o's low quartile and p's high one; nan when P = 1.");
  cls.def_readonly("break_even_high", &PlanCandidate::break_even_high,
                   "The break-even at o's high quartile and p's low one; nan when P = 1. OptEx is "
                   "recommended only for a gradient time above it.");
  cls.def("__repr__", [](const PlanCandidate& c) {
    return py::str(
               "PlanCandidate(parallelism={!r}, points={!r}, evaluations_per_point={!r}, "
               "history={!r}, overhead_seconds={!r}, round_seconds={!r}, steps_per_round={!r}, "
               "seconds_per_step={!r}, break_even_gradient_seconds={!r})")
        .format(c.parallelism, c.points, c.evaluations_per_point, c.history, c.overhead_seconds,
                c.round_seconds, c.steps_per_round, c.seconds_per_step,
                c.break_even_gradient_seconds);
  });
}

void register_plan_class(py::module_& m) {
  py::class_<Plan> cls(m, "Plan", py::is_final(),
                       R"doc(What optex.plan recommends, and everything it measured (read-only).
str(plan) is the report: the candidates as a table, the recommendation and its
reason.
)doc");
  exported_from(cls, "optex");
  cls.def_readonly("candidates", &Plan::candidates,
                   "Every configuration measured, as PlanCandidate: P = 1 first, then by T0 "
                   "(the given one first) and N. A new list per access.");
  cls.def_readonly("plain_step_seconds", &Plan::plain_step_seconds,
                   "p: one plain optimizer step (Adam over dim floats) in seconds, the median of "
                   "its samples.");
  cls.def_property_readonly(
      "plain_step_spread", [](const Plan& p) { return spread_dict(p.plain_step); },
      "p's samples summarised: a dict of median, low_quartile, high_quartile, min, max "
      "(seconds) and count (the repetitions). A new dict per access.");
  cls.def_readonly("plain_seconds_per_step", &Plan::plain_seconds_per_step,
                   "The sequential baseline: gradient_seconds + p.");
  cls.def_property_readonly(
      "choice", [](const Plan& p) { return std::string(choice_name(p.choice)); },
      "'sequential' (the plain optimizer), 'averaging' (all N evaluations at one point, N x "
      "minibatch) or 'optex'.");
  cls.def_readonly("parallelism", &Plan::parallelism,
                   "The recommended N: 1 for 'sequential', D for 'averaging'.");
  cls.def_readonly("evaluations_per_point", &Plan::evaluations_per_point,
                   "The recommended D (Options.evaluations_per_point).");
  cls.def_readonly("history", &Plan::history, "The recommended T0 (Options.history).");
  cls.def_readonly("break_even_gradient_seconds", &Plan::break_even_gradient_seconds,
                   "For 'optex', the recommended configuration's break-even; otherwise the "
                   "gradient time above which the plan would recommend OptEx (inf: never).");
  cls.def_readonly("break_even_low", &Plan::break_even_low,
                   "For 'optex', the low end of the recommended configuration's break-even "
                   "interval; otherwise break_even_gradient_seconds.");
  cls.def_readonly("break_even_high", &Plan::break_even_high,
                   "For 'optex', the high end of that interval (the gradient time lies above it); "
                   "otherwise break_even_gradient_seconds.");
  cls.def_readonly("expected_round_seconds", &Plan::expected_round_seconds,
                   "gradient_seconds plus the recommended round's overhead.");
  cls.def_readonly("uncertain", &Plan::uncertain,
                   "True when the gradient time lies within the measured spread of the decision: "
                   "the plan took the simpler choice (or the fewer workers) and says so.");
  cls.def_readonly("reason", &Plan::reason, "The numbers that decided it, in words.");
  cls.def_readonly("assumption", &Plan::assumption,
                   "The steps a round is assumed to advance (efficiency), and what the "
                   "committed benchmarks measured of it.");
  cls.def_readonly("alternatives", &Plan::alternatives,
                   "The same-budget alternatives (N x lr, N x minibatch, parallel line search) "
                   "the planner does not measure and cannot rank OptEx against.");
  cls.def("__str__", [](const Plan& p) { return format_plan(p); });
  cls.def("__repr__", [](const Plan& p) {
    return py::str(
               "Plan(choice={!r}, parallelism={!r}, evaluations_per_point={!r}, history={!r}, "
               "break_even_gradient_seconds={!r}, expected_round_seconds={!r}, uncertain={!r})")
        .format(choice_name(p.choice), p.parallelism, p.evaluations_per_point, p.history,
                p.break_even_gradient_seconds, p.expected_round_seconds, p.uncertain);
  });
}

}  // namespace

void register_plan(py::module_& m) {
  register_candidate(m);
  register_plan_class(m);
  m.def("plan", &make_plan, py::arg("dim"), py::arg("parallelism"), py::arg("history"),
        py::kw_only(), py::arg("gradient_seconds") = py::none(), py::arg("objective") = py::none(),
        py::arg("device") = "cpu", py::arg("threads") = 0, py::arg("efficiency") = 0.5,
        py::arg("gradient_noise") = py::none(), py::arg("repetitions") = 5,
        py::arg("round_timer") = py::none(), py::arg("step_timer") = py::none(),
        R"doc(Will OptEx pay off here? Measures a round's overhead (ask() + tell()) on this
machine for a few N and T0 and recommends the plain optimizer, averaging (all
N evaluations at one point) or OptEx with an N, D and T0 (DESIGN.md section 4,
"The planner"). Every time is measured `repetitions` times (in [3, 100]),
round-robin over the candidates, and reported as its median and interquartile
range; where the gradient time lies within that spread the plan keeps the
simpler choice and sets Plan.uncertain. It measures only the overhead: it
assumes the steps a round advances (efficiency; Plan.assumption) and cannot
rank OptEx against N x lr, N x minibatch or a parallel line search
(Plan.alternatives). str() of the result is the report.

    print(optex.plan(1_000_000, 8, 32, gradient_seconds=0.05))

parallelism is the most evaluations per round you can run at once; history
the T0 you would use. Give exactly one of gradient_seconds (one gradient
evaluation, measured by you) and objective (a callable taking a read-only
float32 array of dim entries, the same point at every call, which it may
keep, and returning (loss, gradient), timed here: the median of
`repetitions` calls at a random point after one untimed call; only the first
result is read, before the next call). efficiency e in (0, 1]:
a round of P points advances like 1 + e (P - 1) sequential steps, an
assumption to measure on your problem. gradient_noise: rho, the noise variance
over the squared gradient norm of one evaluation (None: unknown).
round_timer(dim, parallelism, history) and step_timer(dim), seconds of a
round's overhead and of a plain step, replace the measurements (for tests);
each is called `repetitions` times per candidate.
Raises ValueError naming the argument for a bad value (gradient_noise must be
finite and >= 0, or None), before anything is measured or the objective is
called; and ValueError "dim: ... is too large for this machine: a round at
N = ..., T0 = ... needs about X GB, it has Y GB" where a measurement of this
machine (a timer not given) would need more than 80% of its physical memory
(optex-plan's check, the same code), also before the objective is called or
anything is allocated. The objective's first (untimed) result must be a
(loss, gradient) pair as optex.minimize takes it: a real, finite loss and a
finite gradient of shape (dim,), float32 or float64 (a list or tuple is read
as float64; an integer or float16 array is refused, never cast); otherwise
ValueError naming the objective's result.
)doc");
}

}  // namespace optex::python

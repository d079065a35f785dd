// optex.OptEx: the ask/tell engine, and optex.IterationInfo.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "coordinate_ranges.hpp"
#include "dlpack.hpp"
#include "names.hpp"
#include "observe.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/magnitude_bound.hpp"
#include "optimizers.hpp"
#include "options.hpp"
#include "shard.hpp"
#include "state_arrays.hpp"

namespace optex::python {
namespace {

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

// The Python object's C++ side. The engine is never replaced for the object's
// lifetime: the arrays ask() returns point into its batch. A slice of a
// sharded engine also owns the object that completes its sums (declared
// first: it outlives the engine that points to it).
class PyOptEx {
 public:
  explicit PyOptEx(Engine engine, std::unique_ptr<PythonShardSums> sums = nullptr)
      : sums_(std::move(sums)), engine_(std::move(engine)) {}

  Engine& engine() { return engine_; }
  bool is_slice() const { return !engine_.shard().is_whole(); }

  // An Engine is not thread-safe, and ask(), tell(), save() and the gradient
  // oracle run with the GIL released: a second thread calling into the same
  // object meanwhile gets a RuntimeError instead of a data race. `busy_` is
  // only read and written with the GIL held.
  void check_idle(const char* what) const {
    if (busy_) {
      throw std::runtime_error(std::string(what) +
                               ": this OptEx is busy in another call (ask, tell, save or the "
                               "gradient oracle, or its shard's sums); an OptEx must not be "
                               "used from two threads at once");
    }
  }

  // One call at a time. A call that fails leaves the engine unchanged, on a
  // slice too: a history push keeps what it overwrites until its sums are
  // complete (GradientHistory::push_all).
  class Exclusive {
   public:
    Exclusive(PyOptEx& owner, const char* what) : owner_(owner) {
      owner_.check_idle(what);
      owner_.busy_ = true;
    }
    ~Exclusive() { owner_.busy_ = false; }
    Exclusive(const Exclusive&) = delete;
    Exclusive& operator=(const Exclusive&) = delete;

   private:
    PyOptEx& owner_;
  };

  // Reads with the object idle.
  const Engine& idle_engine(const char* what) const {
    check_idle(what);
    return engine_;
  }

 private:
  std::unique_ptr<PythonShardSums> sums_;  // a slice's; nullptr for a whole engine
  Engine engine_;
  bool busy_ = false;
};

constexpr const char* kTellHint = "; pass drop_nonfinite=True to let the engine drop such points";

std::vector<float> start_point(py::handle x0) {
  py::array a = float_array(x0, "x0");
  if (a.ndim() != 1) {
    throw std::invalid_argument("x0: expected a 1-D array of shape (d,), got shape " +
                                shape_string(a));
  }
  if (a.size() == 0) throw std::invalid_argument("x0: dimension must be >= 1, got 0");
  a = py::module_::import("numpy").attr("ascontiguousarray")(a);
  std::vector<float> x(static_cast<std::size_t>(a.size()));
  if (is_float32(a)) {
    const auto values = values_of<float>(a);
    x.assign(values.begin(), values.end());
    require_finite(x, "x0", 0, "");
  } else {
    round_to_float32(values_of<double>(a), x, "x0", 0, true, "");
  }
  return x;
}

std::string fspath(py::handle path) {
  return py::module_::import("os").attr("fsdecode")(path).cast<std::string>();
}

std::runtime_error no_pending_batch(const char* what, const Engine& e) {
  return std::runtime_error(std::string(what) + ": no pending batch (iteration " +
                            std::to_string(e.iteration()) + "): call ask() first");
}

// The gradient oracle of proxy='target': fn(x) -> (loss, grad), called from
// inside ask() with the GIL taken back. x is a float32 copy of the point.
GradientOracle python_oracle(py::object fn, std::size_t dim) {
  return [fn = std::move(fn), dim](std::span<const float> x, std::span<float> g) -> double {
    py::gil_scoped_acquire gil;
    py::array_t<float> point(static_cast<py::ssize_t>(x.size()));
    std::copy(x.begin(), x.end(), point.mutable_data());
    const py::object result = fn(point);
    if (!py::isinstance<py::tuple>(result) || py::len(result) != 2) {
      throw py::type_error("gradient_oracle: must return a tuple (loss, grad), got " +
                           py::repr(result).cast<std::string>());
    }
    const double loss = result[py::int_(0)].cast<double>();
    py::array grad = float_array(result[py::int_(1)], "gradient_oracle's grad");
    require_shape(grad, "gradient_oracle's grad", {dim});
    grad = py::module_::import("numpy").attr("ascontiguousarray")(grad);
    if (is_float32(grad)) {
      const auto values = values_of<float>(grad);
      std::copy(values.begin(), values.end(), g.begin());
    } else {
      // Non-finite values are the engine's to refuse (a RuntimeError naming the oracle).
      round_to_float32(values_of<double>(grad), g, "gradient_oracle's grad", 0, false, "");
    }
    return loss;
  };
}

// The (N,) losses as float64 (float32 ones widened).
std::vector<double> losses_from(const py::array& losses) {
  std::vector<double> values(static_cast<std::size_t>(losses.size()));
  if (is_float32(losses)) {
    widen_to_float64(values_of<float>(losses), values);
  } else {
    const auto given = values_of<double>(losses);
    std::copy(given.begin(), given.end(), values.begin());
  }
  return values;
}

// Commits the pending batch, whose gradient rows are written, with `losses`.
// Unless drop_nonfinite, the engine's own check refuses rows that are not
// finite or exceed the bound (on a slice the check is completed across the
// slices, so every slice refuses alike), naming the points; `rows` says
// where the rows came from. Runs without the GIL.
Info commit_rows(Engine& engine, Batch& batch, std::span<const double> losses, bool drop_nonfinite,
                 std::span<const CoordinateRange> unchanged, const std::string& rows) {
  const std::vector<double> before(batch.losses().begin(), batch.losses().end());
  std::copy(losses.begin(), losses.end(), batch.losses().begin());
  if (!drop_nonfinite) {
    const std::vector<int> bad = engine.nonfinite_points(batch);
    if (!bad.empty()) {
      std::copy(before.begin(), before.end(), batch.losses().begin());
      std::string points;
      for (const int i : bad) points += (points.empty() ? "" : ", ") + std::to_string(i);
      throw std::invalid_argument("grads: the gradient rows of points " + points + rows +
                                  " are not finite or exceed the magnitude bound " +
                                  std::to_string(magnitude_bound(engine.shard().dim)) + kTellHint);
    }
  }
  return Info(engine.tell(batch, unchanged));
}

// tell() on a slice of a sharded engine. Nothing but the losses (the same on
// every slice) is refused here: a slice that refused a gradient alone would
// leave the others waiting in the commit's sums. The rows go into the batch,
// and commit_rows refuses them on every slice alike.
Info tell_slice(Engine& engine, const py::array& grads, const py::array& losses,
                bool drop_nonfinite, std::span<const CoordinateRange> unchanged) {
  const std::vector<double> values = losses_from(losses);
  if (!drop_nonfinite) require_finite(std::span<const double>(values), "losses", 0, kTellHint);
  Batch& batch = engine.ask();  // the pending batch: no work
  py::gil_scoped_release release;
  const std::span<float> rows = batch.grads();
  if (is_float32(grads)) {
    const auto given = values_of<float>(grads);
    std::copy(given.begin(), given.end(), rows.begin());
  } else {
    round_to_float32(values_of<double>(grads), rows, "grads", engine.dim(), false, kTellHint);
  }
  return commit_rows(engine, batch, values, drop_nonfinite, unchanged, "");
}

Info tell(PyOptEx& self, py::handle grads_arg, py::handle losses_arg, bool drop_nonfinite,
          py::handle unchanged_arg) {
  PyOptEx::Exclusive busy(self, "tell");
  Engine& engine = self.engine();
  if (!engine.pending()) {
    throw std::runtime_error("tell: no pending batch (iteration " +
                             std::to_string(engine.iteration()) +
                             "): call ask() first; tell() commits each batch once");
  }
  const auto n = static_cast<std::size_t>(engine.options().parallelism);
  const std::size_t d = engine.dim();
  const py::array grads = float_array(grads_arg, "grads");
  require_shape(grads, "grads", {n, d});
  require_c_contiguous(grads, "grads");
  const py::array losses = float_array(losses_arg, "losses");
  require_shape(losses, "losses", {n});
  require_c_contiguous(losses, "losses");
  const std::vector<CoordinateRange> unchanged =
      coordinate_ranges_from_python(unchanged_arg, d, "unchanged");
  if (self.is_slice()) return tell_slice(engine, grads, losses, drop_nonfinite, unchanged);

  const bool check = !drop_nonfinite;
  const float bound = magnitude_bound(d);
  py::gil_scoped_release release;
  std::span<const float> g;
  std::vector<float> rounded;
  if (is_float32(grads)) {
    g = values_of<float>(grads);
    if (check) require_within(g, "grads", d, bound, kTellHint);
  } else {
    // Checked, then rounded into a buffer of its own: the batch's rows change
    // only when tell() commits.
    const auto values = values_of<double>(grads);
    if (check) require_within(values, "grads", d, bound, kTellHint);
    rounded.resize(values.size());
    round_to_float32(values, rounded, "grads", d, false, kTellHint);
    g = rounded;
  }
  std::vector<double> widened;
  std::span<const double> l;
  if (is_float32(losses)) {
    widened.resize(n);
    widen_to_float64(values_of<float>(losses), widened);
    l = widened;
  } else {
    l = values_of<double>(losses);
  }
  if (check) require_finite(l, "losses", 0, kTellHint);
  return Info(engine.tell(g, l, unchanged));
}

py::array ask(const py::object& self_obj) {
  auto& self = self_obj.cast<PyOptEx&>();
  const float* data = nullptr;
  std::size_t n = 0;
  std::size_t d = 0;
  {
    PyOptEx::Exclusive busy(self, "ask");
    py::gil_scoped_release release;
    const Batch& batch = self.engine().ask();
    data = batch.points().data();  // on a device engine: the batch's host copy, made now
    n = static_cast<std::size_t>(batch.size());
    d = batch.dim();
  }
  // A view of the batch's rows whose base is this OptEx: no copy, and the
  // engine outlives the array. Read-only, because the engine's proxy
  // trajectory (and, on a device, the device rows) would no longer match a
  // point changed through it.
  py::array_t<float> view({n, d}, {d * sizeof(float), sizeof(float)}, data, self_obj);
  view.attr("setflags")(py::arg("write") = false);
  return view;
}

// ---- zero-copy rows (DLPack) ----------------------------------------------------

DeviceArray device_points(const py::object& self_obj) {
  auto& self = self_obj.cast<PyOptEx&>();
  DeviceArray a;
  {
    PyOptEx::Exclusive busy(self, "device_points");
    py::gil_scoped_release release;
    const Batch& batch = self.engine().ask();
    a.data = const_cast<float*>(batch.device_points());  // exported read-only by contract
    a.rows = static_cast<std::size_t>(batch.size());
    a.cols = batch.dim();
    a.device = batch.device();
  }
  a.owner = self_obj;
  return a;
}

DeviceArray device_grads(const py::object& self_obj) {
  auto& self = self_obj.cast<PyOptEx&>();
  PyOptEx::Exclusive busy(self, "device_grads");
  Engine& engine = self.engine();
  if (!engine.pending()) throw no_pending_batch("device_grads", engine);
  Batch& batch = engine.ask();  // the pending batch: no work
  DeviceArray a;
  a.data = batch.device_grads();
  a.rows = static_cast<std::size_t>(batch.size());
  a.cols = batch.dim();
  a.device = batch.device();
  a.writable = true;
  a.owner = self_obj;
  return a;
}

DeviceArray device_iterate(const py::object& self_obj) {
  auto& self = self_obj.cast<PyOptEx&>();
  DeviceArray a;
  {
    PyOptEx::Exclusive busy(self, "device_x");
    py::gil_scoped_release release;
    a.data = const_cast<float*>(self.engine().device_iterate());  // read-only by contract
  }
  a.cols = self.engine().dim();
  a.ndim = 1;
  a.device = self.engine().device();
  a.owner = self_obj;
  return a;
}

// tell() for gradients written straight into device_grads().
Info tell_device(PyOptEx& self, py::handle losses_arg, bool drop_nonfinite,
                 py::handle unchanged_arg) {
  PyOptEx::Exclusive busy(self, "tell_device");
  Engine& engine = self.engine();
  if (!engine.pending()) throw no_pending_batch("tell_device", engine);
  const auto n = static_cast<std::size_t>(engine.options().parallelism);
  const py::array losses = float_array(losses_arg, "losses");
  require_shape(losses, "losses", {n});
  require_c_contiguous(losses, "losses");
  const std::vector<CoordinateRange> unchanged =
      coordinate_ranges_from_python(unchanged_arg, engine.dim(), "unchanged");
  const std::vector<double> values = losses_from(losses);
  if (!drop_nonfinite) require_finite(std::span<const double>(values), "losses", 0, kTellHint);
  Batch& batch = engine.ask();  // the pending batch: no work
  py::gil_scoped_release release;
  return commit_rows(engine, batch, values, drop_nonfinite, unchanged,
                     " (written through device_grads())");
}

void register_info(py::module_& m) {
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

void register_optex(py::module_& m) {
  py::class_<PyOptEx> cls(
      m, "OptEx", py::is_final(),
      R"doc(The OptEx engine as ask/tell: you evaluate the N points of each iteration
wherever you like, the engine does the mathematics (DESIGN.md section 2).

    opt = optex.OptEx(x0, optimizer=optex.Adam(lr=1e-2), parallelism=4)
    for _ in range(iterations):
        points = opt.ask()                        # (N, d) float32, read-only view
        losses, grads = problem.value_and_grad(points)
        info = opt.tell(grads, losses)            # commit: iterate, history, state
    x = opt.x

x0 is a 1-D float32 or float64 array-like (converted to float32; the engine
works in float32). optimizer is a base optimizer (optex.Sgd, optex.Adam,
optex.AdamW, optex.RmsProp, optex.Lion; default: optex.Adam(), lr 1e-3 as
torch.optim.Adam) for every coordinate, or a list of (size, optimizer) pairs:
hyperparameters per contiguous range of x, in order, sizes adding up to d,
all of one kind (Adam and AdamW are one kind), like torch.optim's parameter
groups:

    opt = optex.OptEx(x0, optimizer=[(n_weights, optex.AdamW(lr=1e-3)),
                                     (n_biases, optex.AdamW(lr=1e-3, weight_decay=0.0))])

A range may also be a (size, optimizer, step_offset) triple: its optimizer
then counts its steps from the state's step step_offset on (torch.optim's
per-parameter step: Adam's bias correction and SGD's first momentum step of a
parameter group added later). A new engine's state is at step 0, so its
offsets must be 0; set_optimizer and from_state_arrays take larger ones.

options is an
optex.Options (default: Options()); keyword arguments override its fields,
e.g. OptEx(x0, parallelism=8, history=64, device="cuda").

Errors: bad input raises ValueError naming the argument and the value (x0,
options, optimizer hyperparameters, grads, losses, unknown names); misuse of
the protocol (tell without ask, save between ask and tell) raises
RuntimeError. The engine is unchanged after any error.

Not thread-safe: call one method at a time (a concurrent call from another
thread raises RuntimeError). ask(), tell(), save() and load() release the GIL
while the engine works.

One slice of a sharded engine (DESIGN.md section 3): with shard=(d, offset,
sums), x0 is the slice [offset, offset + len(x0)) of a d-vector's start and
the optimizer is sized for the slice (optex.slice_ranges cuts per-range
hyperparameters to it; optex.shard_of(d, W, r) gives rank r's usual slice).
The engine holds only its slice of the iterate, optimizer state and history:
ask() gives the slices of the N points, tell() and tell_device() take the
slices of the gradients and the N whole losses (the same on every slice).
Every sum over all coordinates is a partial that sums completes:
sums.sum(values) gets a float64 array and must replace each value, in place,
by its sum over every slice added in slice order (the same bits on every
slice); sums.all(flags) gets a uint8 array and must set each flag to 1 where
it is nonzero on every slice, else 0. Both return None. They are
collectives: ask(), tell() and tell_device() call them in the same order with
the same sizes on every slice, and every slice must make the same calls.
A gradient one slice refuses is refused on every slice, as its finiteness is
completed the same way. An exception raised by sums propagates out of the
call, which leaves the engine unchanged. A sum that is not finite, or a flag
other than 0 and 1, raises ValueError there; a return value other than None
TypeError; completions no honest sums give (a negative squared distance or
norm, a point's distance to itself other than 0, values of one call that
contradict each other, a flag of 1 where this slice's is 0) RuntimeError
naming them ("the ShardSums is faulty"), the engine unchanged. The slice
must lie on the grid of 4096-coordinate blocks (offset a multiple of 4096,
its size too unless it ends at d), as shard_of cuts it: ValueError otherwise.
proxy='target' (its oracle needs whole points) and
devices other than the CPU are refused; save() is refused (use state_arrays()
and from_state_arrays(state, shard=...)).
)doc");
  exported_from(cls, "optex");
  // The signatures are written out in the docstrings: pybind11 would show the
  // array-like and optional arguments as `object`.
  py::options written_signatures;
  written_signatures.disable_function_signatures();
  cls.def(py::init([](py::handle x0, py::handle optimizer, py::handle options, py::handle shard_arg,
                      const py::kwargs& option_kwargs) {
            std::vector<float> start = start_point(x0);
            const OptimizerRanges opt = optimizer.is_none()
                                            ? OptimizerRanges(Adam{})
                                            : ranges_from_python(optimizer, "optimizer");
            Options o;
            if (!options.is_none()) {
              if (!py::isinstance<Options>(options)) {
                throw py::type_error(
                    "options: expected optex.Options or None, got " +
                    py::str(py::type::of(options).attr("__name__")).cast<std::string>());
              }
              o = options.cast<Options>();
            }
            for (const auto& [key, value] : option_kwargs) {
              const auto name = key.cast<std::string>();
              if (!set_option_field(o, name, value)) {
                throw py::type_error("OptEx() got an unexpected keyword argument '" + name +
                                     "' (neither x0, optimizer, options, shard nor a field of "
                                     "optex.Options)");
              }
            }
            // Last among the checks: a TypeError for the sums before anything is built.
            std::optional<ShardArgument> shard = shard_from_python(shard_arg, "shard");
            std::unique_ptr<PyOptEx> made;
            {
              py::gil_scoped_release release;
              if (shard) {
                Engine slice(start, opt, o, shard->shard(start.size()));
                made = std::make_unique<PyOptEx>(std::move(slice), std::move(shard->sums));
              } else {
                made = std::make_unique<PyOptEx>(Engine(start, opt, o));
              }
            }
            return made;
          }),
          py::arg("x0"), py::arg("optimizer") = py::none(), py::arg("options") = py::none(),
          py::kw_only(), py::arg("shard") = py::none(),
          "__init__(self, x0: ArrayLike, optimizer: Optimizer | Sequence[tuple[int, Optimizer]] | "
          "None = None, options: "
          "Options | None = None, *, shard: tuple[int, int, ShardSums] | None = None, "
          "**option_kwargs) -> None\n\nSee the class documentation; "
          "option_kwargs are fields of optex.Options.");

  cls.def("ask", &ask, R"doc(ask(self) -> numpy.ndarray

The N points of this iteration: an (N, d) float32 array, one row per
evaluation. With several evaluations per point (Options.evaluations_per_point,
the adaptive strategy, a safeguard that cut the proxy chain), the rows of a
point are consecutive and identical, each with its own seed; tell() averages
them, and IterationInfo.point_evaluations says how many rows each point had.

The array is a read-only VIEW of the engine's batch, not a copy: calling ask()
again before tell() returns the same points, and after tell() the next ask()
rewrites the same memory in place (the engine stays alive while the array
does). Writing to it is refused, because the engine's proxy trajectory would no
longer match the points. Copy it (np.array(points)) to keep the points of an
iteration.
)doc");
  cls.def(
      "tell", &tell, py::arg("grads"), py::arg("losses"), py::kw_only(),
      py::arg("drop_nonfinite") = false, py::arg("unchanged") = py::none(),
      R"doc(tell(self, grads: ArrayLike, losses: ArrayLike, *, drop_nonfinite: bool = False, unchanged: ArrayLike | None = None) -> IterationInfo

Commits the batch of the last ask(): grads (N, d) and losses (N,) at its points.

Both are float32 or float64 array-likes (lists are converted; numpy arrays
must be C-contiguous and of one of those dtypes); gradients are rounded to
float32. A non-finite gradient or loss raises ValueError naming its row and
column, unless drop_nonfinite=True: then the engine keeps such pairs out of the
history and commits from the last finite point (RuntimeError if none is
finite). Returns an optex.IterationInfo. The engine is unchanged after any
error, and the batch stays pending.

unchanged: coordinates the commit leaves as they are, as torch.optim skips a
parameter without a gradient: a sequence of (offset, size) pairs or a (k, 2)
integer array, each range non-empty and within [0, d), sorted by offset and
disjoint (ValueError naming the range otherwise). There x and every optimizer
state slot keep their values bit for bit; the step count (optimizer_step) is
shared by all coordinates and advances as usual. Everything else is as
without it: the history receives the points and the gradients as given
(normally zeros there), and the point the commit steps from is chosen as
before.
)doc");
  cls.def(
      "observe",
      [](PyOptEx& self, py::handle points, py::handle grads) {
        PyOptEx::Exclusive busy(self, "observe");
        observe_pairs(self.engine(), points, grads);
      },
      py::arg("points"), py::arg("grads"), kObserveDoc);
  cls.def("device_points", &device_points,
          R"doc(device_points(self) -> DeviceArray

The N points of this iteration where the engine keeps them (GPU memory on a
CUDA engine, host memory otherwise), as an optex.DeviceArray for
torch.from_dlpack / cupy.from_dlpack: no copy, and nothing crosses to the host.
Asks like ask() (the same pending batch until tell). Read-only by contract:
the engine's proxy trajectory would no longer match a point changed through it.
)doc");
  cls.def("device_grads", &device_grads,
          R"doc(device_grads(self) -> DeviceArray

The pending batch's (N, d) gradient rows where the engine keeps them, writable:
write each point's gradient into its row (e.g. torch.from_dlpack(rows)[i].copy_(g)),
then commit with tell_device(losses). On a GPU, finish the writes (synchronise
their stream) before tell_device. RuntimeError without a pending ask().
)doc");
  cls.def("device_x", &device_iterate,
          R"doc(device_x(self) -> DeviceArray

The current iterate where the engine keeps it, a (d,) optex.DeviceArray (no
copy; complete on return). Read-only by contract; the memory holds this
iterate until the next tell() or tell_device().
)doc");
  cls.def(
      "tell_device", &tell_device, py::arg("losses"), py::kw_only(),
      py::arg("drop_nonfinite") = false, py::arg("unchanged") = py::none(),
      R"doc(tell_device(self, losses: ArrayLike, *, drop_nonfinite: bool = False, unchanged: ArrayLike | None = None) -> IterationInfo

Commits the pending batch with the gradients already written into
device_grads() and the (N,) losses (float32 or float64). A non-finite loss or
gradient row raises ValueError naming the points (the rows are checked where
they live), unless drop_nonfinite=True, as for tell(). unchanged: the
coordinates the commit leaves as they are, as for tell(). The engine is
unchanged after any error, and the batch stays pending.
)doc");
  cls.def(
      "set_gradient_oracle",
      [](PyOptEx& self, py::object fn) {
        PyOptEx::Exclusive busy(self, "set_gradient_oracle");
        if (fn.is_none()) {
          self.engine().set_gradient_oracle({});
          return;
        }
        if (!PyCallable_Check(fn.ptr())) {
          throw py::type_error("fn: expected a callable or None, got " +
                               py::str(py::type::of(fn).attr("__name__")).cast<std::string>());
        }
        self.engine().set_gradient_oracle(python_oracle(std::move(fn), self.engine().dim()));
      },
      py::arg("fn"),
      R"doc(set_gradient_oracle(self, fn: Callable[[numpy.ndarray], tuple[float, ArrayLike]] | None) -> None

The true gradient for proxy='target', whose proxy steps are true sequential
steps (the upper bound OptEx is compared against): fn(x) -> (loss, grad) with x
a float32 (d,) array, grad a float32 or float64 (d,) array-like. fn is called
from inside ask(). None removes it. Not needed for proxy='gp'.
)doc");

  cls.def(
      "set_optimizer",
      [](PyOptEx& self, py::handle optimizer) {
        const OptimizerRanges opt = ranges_from_python(optimizer, "optimizer");
        PyOptEx::Exclusive busy(self, "set_optimizer");
        self.engine().set_optimizer(opt);
      },
      py::arg("optimizer"),
      R"doc(set_optimizer(self, optimizer: Optimizer | Sequence[tuple[int, Optimizer] | tuple[int, Optimizer, int]]) -> None

New hyperparameters from the next ask() on, keeping the optimizer state
(moments, step count): a learning-rate schedule. An engine with ranges takes
one (size, optimizer) pair per range, with the same sizes, or a (size,
optimizer, step_offset) triple: the offsets may change, up to the state's
step count (a range that starts over now takes the state's step). Each optimizer must
be of the same kind as before and keep its state layout and algorithm (SGD
or RmsProp momentum cannot switch between zero and non-zero, RmsProp cannot
start or stop centering, Adam cannot become AdamW): ValueError naming the
setting. RuntimeError between ask() and tell(). The engine is unchanged after
any error. Checkpoints store the values in force.
)doc");
  cls.def(
      "set_threads",
      [](PyOptEx& self, int threads) {
        PyOptEx::Exclusive busy(self, "set_threads");
        self.engine().set_threads(threads);
      },
      py::arg("threads"), R"doc(set_threads(self, threads: int) -> None

The threads of the CPU's passes over d-vectors (Options.threads; 0: every
core), at any time, also between ask() and tell(): results do not depend on
it. ValueError outside [0, 1024], changing nothing.
)doc");
  cls.def(
      "save",
      [](PyOptEx& self, py::handle path) {
        const std::string p = fspath(path);
        PyOptEx::Exclusive busy(self, "save");
        if (self.is_slice()) {
          // Engine::load would resume the file as a whole engine of the slice's size.
          throw std::runtime_error(
              "save: this engine is a slice of a sharded engine (shard=), which load() cannot "
              "resume; keep its state_arrays() and resume it with from_state_arrays(state, "
              "shard=...)");
        }
        py::gil_scoped_release release;
        self.engine().save(p);
      },
      py::arg("path"), R"doc(save(self, path: str | os.PathLike) -> None

Writes a checkpoint (the C++ Engine::save format): options, optimizer, iterate,
optimizer state, history, lengthscale, random state and counters. A run loaded
from it continues bit for bit. path is a str, bytes or os.PathLike. The file
is replaced atomically: a reader sees the old checkpoint or the new one. A
symbolic link is followed (its target is replaced, the link kept); anything
else that is not a regular file (a directory, fifo, device) is refused.
Raises ValueError for an empty path or one with a NUL byte, RuntimeError
between ask() and tell() and for a failed write (naming the path and the
OS's reason; no temporary file is left behind), and for a slice
(shard=), which load() could not resume as one: use state_arrays().
)doc");
  cls.def_static(
      "load",
      [](py::handle path, const std::optional<std::string>& device,
         const std::optional<std::string>& history_precision) {
        const std::string p = fspath(path);
        std::optional<Device> dev;
        if (device) dev = parse_device("device", *device);
        std::optional<Precision> precision;
        if (history_precision) {
          precision = parse_name<Precision>("history_precision", *history_precision);
        }
        std::unique_ptr<PyOptEx> made;
        {
          py::gil_scoped_release release;
          made = std::make_unique<PyOptEx>(Engine::load(p, dev, precision));
        }
        return made;
      },
      py::arg("path"), py::arg("device") = py::none(), py::arg("history_precision") = py::none(),
      R"doc(load(path: str | os.PathLike, device: str | None = None, history_precision: str | None = None) -> OptEx

Resumes a checkpoint written by save() (or by the C++ Engine::save). device
('cpu', 'cuda', 'cuda:<index>') moves the run to another device and
history_precision ('fp32', 'bf16', 'bf16_gradients') changes the history's
storage; without them the run resumes as saved. Raises ValueError for a bad
argument (an empty path or one with a NUL byte, a device that is not there,
bf16 on the CPU), checked before the file is read, and RuntimeError naming the
path, the field and the reason for a missing, truncated, corrupted, foreign or
invalid file, or one that is not a regular file. A gradient oracle is not part
of a checkpoint: set it again.
)doc");

  cls.def(
      "state_arrays",
      [](PyOptEx& self, bool history) {
        EngineSnapshot snapshot;
        {
          PyOptEx::Exclusive busy(self, "state_arrays");
          py::gil_scoped_release release;
          snapshot = self.engine().snapshot(history);
        }
        return state_arrays(std::move(snapshot), history);
      },
      py::arg("history") = true, R"doc(state_arrays(self, history: bool = True) -> dict

The engine's whole state as a dict of Python scalars, lists, dicts and numpy
arrays (new copies, never views of the engine's memory), from which
OptEx.from_state_arrays builds an engine that continues bit for bit: what
save() writes to a file, in a form torch.save / torch.load(weights_only=True)
and other containers can hold. With history=False the "history" key is
left out: an engine built from it has an empty history and warms up again,
everything else as it was. RuntimeError between ask() and tell().

The keys (python/optex/_optex.pyi, _StateArrays, documents each):
"format" (1, the layout), "options" (every Options field: Options(**d)),
"optimizer" (a list of per-range dicts: "size", "kind" (the class name),
"step_offset" and each hyperparameter), "x" (float32 (d,)), "step",
"slots" (slot name -> float32 (d,), the names of the optimizer's
state_slot_names), "lengthscale", "rng", "iteration", "evaluations",
"history" ("size", "next", float32 (size, d) "points" and "gradients",
float64 (T0, T0) "squared_distances", (T0,) "squared_norms" and (T0, T0)
"gradient_inner_products"), "round" ("evaluations_per_point",
"gradient_noise", "rounds_since_measured", "last_step_norm").
)doc");
  cls.def_static(
      "from_state_arrays",
      [](py::handle state, const std::optional<std::string>& device,
         const std::optional<std::string>& history_precision, py::handle shard_arg) {
        std::optional<Device> dev;
        if (device) dev = parse_device("device", *device);
        std::optional<Precision> precision;
        if (history_precision) {
          precision = parse_name<Precision>("history_precision", *history_precision);
        }
        EngineSnapshot snapshot = snapshot_from_arrays(state);
        const Optimizer kind = snapshot.optimizer.front();
        std::optional<ShardArgument> shard = shard_from_python(shard_arg, "shard");
        if (shard && (device || history_precision)) {
          throw std::invalid_argument(
              "shard: a slice resumes on the CPU with the history precision it was saved with; "
              "pass neither device nor history_precision with shard");
        }
        std::unique_ptr<PyOptEx> made;
        {
          py::gil_scoped_release release;
          try {
            if (shard) {
              const std::size_t size = snapshot.iterate.size();
              Engine slice = Engine::from_snapshot(std::move(snapshot), shard->shard(size));
              made = std::make_unique<PyOptEx>(std::move(slice), std::move(shard->sums));
            } else {
              made = std::make_unique<PyOptEx>(
                  Engine::from_snapshot(std::move(snapshot), dev, precision));
            }
          } catch (const InvalidSnapshot& e) {
            // The key first, unless the message starts with it ("options: ...").
            const std::string key = state_key(e, kind);
            const std::string what = e.what();
            const bool named = what.starts_with(key + ":") || what.starts_with(key + ".");
            throw std::invalid_argument(named ? what : key + ": " + what);
          }
        }
        return made;
      },
      py::arg("state"), py::kw_only(), py::arg("device") = py::none(),
      py::arg("history_precision") = py::none(), py::arg("shard") = py::none(),
      R"doc(from_state_arrays(state: Mapping[str, Any], *, device: str | None = None, history_precision: str | None = None, shard: tuple[int, int, ShardSums] | None = None) -> OptEx

An engine that continues the state OptEx.state_arrays() gave (bit for bit:
the same points, seeds and commits from here on), on `device` with
`history_precision` when given, as load() takes them. Without "history" the
engine starts with an empty history. The optimizer's ranges, sizes and step
offsets may differ from the engine the state came from, as long as the state
is consistent: a state for other coordinates can be built by hand.

Strict: every key documented by state_arrays() must be there ("history" may
be left out) and no other, each scalar of its type (an int or a float, not a
bool), each array a numpy array of exactly its dtype and shape (any strides:
it is copied). Raises ValueError naming the key (and the element) for
anything else, and for a value the engine refuses: non-finite values, points
or gradients above the magnitude bound, negative counters, a ring position
out of range, slots the optimizer does not keep, ranges whose sizes do not
add up to the dimension of x, a step offset beyond "step". Nothing is built
then.

shard=(dim, offset, sums) resumes the state of a slice (state_arrays() of an
engine built with shard=) as that slice, on the CPU (neither device nor
history_precision then): "x" holds its coordinates, which must fit in dim.
)doc");

  cls.def_property_readonly(
      "x", [](const PyOptEx& self) { return copy_of(self.idle_engine("x").iterate()); },
      "The current iterate: a float32 (d,) copy.");
  cls.def_property_readonly(
      "dim", [](const PyOptEx& self) { return self.idle_engine("dim").dim(); },
      "d, the dimension of x (a slice's own coordinates for a slice).");
  cls.def_property_readonly(
      "shard",
      [](const PyOptEx& self) {
        const CoordinateShard& s = self.idle_engine("shard").shard();
        return py::make_tuple(s.dim, s.offset, s.size);
      },
      "(dim, offset, size): the coordinates [offset, offset + size) of the whole vector of "
      "dimension dim that this engine holds; (d, 0, d) for a whole engine.");
  cls.def_property_readonly(
      "parallelism",
      [](const PyOptEx& self) { return self.idle_engine("parallelism").options().parallelism; },
      "N, the number of points of each iteration.");
  cls.def_property_readonly(
      "iteration", [](const PyOptEx& self) { return self.idle_engine("iteration").iteration(); },
      "Iterations committed so far.");
  cls.def_property_readonly(
      "evaluations",
      [](const PyOptEx& self) { return self.idle_engine("evaluations").evaluations(); },
      "True gradient evaluations so far.");
  cls.def_property_readonly(
      "optimizer_step",
      [](const PyOptEx& self) { return self.idle_engine("optimizer_step").optimizer_step(); },
      "The base optimizer's step count (its updates so far; Adam's bias correction reads it), "
      "one number for all coordinates. A round advances it by committed_point + 1 when its "
      "proxy steps were applied, by 1 when its points held at the iterate (the warm-up).");
  cls.def_property_readonly(
      "lengthscale",
      [](const PyOptEx& self) { return self.idle_engine("lengthscale").lengthscale(); },
      "The kernel lengthscale the engine uses now.");
  cls.def_property_readonly(
      "pending", [](const PyOptEx& self) { return self.idle_engine("pending").pending(); },
      "True between ask() and tell().");
  cls.def_property_readonly(
      "options", [](const PyOptEx& self) { return self.idle_engine("options").options(); },
      "A copy of the engine's optex.Options (changing it does not change the engine).");
  cls.def_property_readonly(
      "optimizer",
      [](const PyOptEx& self) {
        return ranges_to_python(self.idle_engine("optimizer").optimizer_ranges());
      },
      "A copy of the base optimizer, or of the list of (size, optimizer) pairs of an engine "
      "with hyperparameters per range ((size, optimizer, step_offset) triples when any range "
      "has a step offset): what OptEx(optimizer=...) and set_optimizer() take.");
  cls.def_property_readonly(
      "seeds",
      [](PyOptEx& self) {
        const Engine& e = self.idle_engine("seeds");
        if (!e.pending()) throw no_pending_batch("seeds", e);
        const Batch& batch = self.engine().ask();  // the pending batch: no work
        std::vector<std::uint64_t> seeds(static_cast<std::size_t>(batch.size()));
        for (int i = 0; i < batch.size(); ++i) seeds[static_cast<std::size_t>(i)] = batch.seed(i);
        return copy_of<std::uint64_t>(seeds);
      },
      R"doc(The seeds of the pending batch's points, a uint64 (N,) array: give point i's
own randomness (minibatch, episodes) seed i, and a run is reproducible.
RuntimeError without a pending ask().
)doc");
  cls.def(
      "predicted_gradient",
      [](PyOptEx& self, int i) {
        const Engine& e = self.idle_engine("predicted_gradient");
        if (!e.pending()) throw no_pending_batch("predicted_gradient", e);
        return copy_of(self.engine().ask().predicted_gradient(i));
      },
      py::arg("i"), R"doc(predicted_gradient(self, i: int) -> numpy.ndarray

The gradient the proxy step from row i's point used (0 <= i < N-1), a float32
(d,) copy: the rows of one point share it; zeros where nothing was predicted
(warm-up, the last point's rows). IndexError outside that range, RuntimeError
without a pending ask().
)doc");
  cls.def("__repr__", [](const PyOptEx& self) {
    const Engine& e = self.idle_engine("repr");
    const CoordinateShard& s = e.shard();
    const py::object shard = s.is_whole()
                                 ? py::object(py::str(""))
                                 : py::str(", shard=({}, {}, ...)").format(s.dim, s.offset);
    return py::str(
               "OptEx(dim={}, parallelism={}, iteration={}, pending={}, device={!r}, "
               "optimizer={!r}{})")
        .format(e.dim(), e.options().parallelism, e.iteration(), e.pending(), e.device().name(),
                ranges_to_python(e.optimizer_ranges()), shard);
  });
}

}  // namespace

void register_engine(py::module_& m) {
  register_info(m);
  register_optex(m);
}

}  // namespace optex::python

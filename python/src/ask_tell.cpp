// OptEx.ask, OptEx.tell and OptEx.observe: the host side of the ask/tell
// protocol, the points as a read-only view and the gradients from numpy.
#include <pybind11/numpy.h>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "commit_rows.hpp"
#include "coordinate_ranges.hpp"
#include "observe.hpp"
#include "optex/engine/magnitude_bound.hpp"
#include "py_optex.hpp"

namespace optex::python {
namespace {

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

// Names the first value of a refused tell() as the caller gave it: a gradient
// element (row, column; in row-major order), else a loss. The engine decided
// which rows to refuse; this only finds the value to name.
[[noreturn]] void throw_refused_value(const py::array& grads, std::span<const double> losses,
                                      std::size_t d, float bound, const RefusedRowsError& refused) {
  if (is_float32(grads)) {
    require_within(values_of<float>(grads), "grads", d, bound, kTellHint);
  } else {
    require_within(values_of<double>(grads), "grads", d, bound, kTellHint);
  }
  require_finite(losses, "losses", 0, kTellHint);
  throw std::invalid_argument(std::string("grads: ") + refused.what());  // not reached
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

  const float bound = magnitude_bound(d);
  py::gil_scoped_release release;
  std::span<const float> g;
  std::vector<float> rounded;
  if (is_float32(grads)) {
    g = values_of<float>(grads);
  } else {
    // Rounded into a buffer of its own: the batch's rows change only when
    // tell() commits.
    rounded.resize(grads.size());
    round_to_float32(values_of<double>(grads), rounded, "grads", d, false, kTellHint);
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
  try {
    // The engine's commit checks the rows, once, and refuses before changing anything.
    return Info(engine.tell(g, l, unchanged, nonfinite_rows(drop_nonfinite)));
  } catch (const RefusedRowsError& refused) {
    throw_refused_value(grads, l, d, bound, refused);
  }
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

}  // namespace

void define_ask_tell(OptExClass& cls) {
  cls.def("ask", &ask, R"doc(ask(self) -> numpy.ndarray

The N points of this iteration: an (N, d) float32 array, one row per
evaluation. With several evaluations per point (Options.evaluations_per_point,
the adaptive strategy, a safeguard that cut the proxy chain), the rows of a
point are consecutive and identical, each with its own seed; tell() averages
them, and IterationInfo.point_evaluations says how many rows each point had.

The array is a read-only VIEW of the engine's batch, not a copy: calling ask()
again before tell() returns the same points, and after tell() the next ask()
rewrites the same memory in place (the engine stays alive while the array
does). Its values are this iteration's points until the ask() that follows
tell(): hand a row to code that may keep it (a cache, a log, another thread)
as a copy, np.array(points[i]), as optex.minimize does. Writing to it is
refused, because the engine's proxy trajectory would no longer match the
points. Copy it (np.array(points)) to keep the points of an iteration.
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
}

}  // namespace optex::python

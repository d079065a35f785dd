// OptEx.observe (observe.hpp).
#include "observe.hpp"

#include <pybind11/numpy.h>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "optex/engine/magnitude_bound.hpp"

namespace optex::python {
namespace {

// The number of pairs in `a`, of shape (m, d) or (d,); ValueError naming `name` otherwise.
std::size_t pairs_of(const py::array& a, const char* name, std::size_t d) {
  if (a.ndim() == 1 && static_cast<std::size_t>(a.shape(0)) == d) return 1;
  if (a.ndim() == 2 && static_cast<std::size_t>(a.shape(1)) == d) {
    return static_cast<std::size_t>(a.shape(0));
  }
  throw std::invalid_argument(std::string(name) + ": expected shape (m, " + std::to_string(d) +
                              ") or (" + std::to_string(d) + ",), got " + shape_string(a));
}

// The values of `a` as float32, checked against the bound: the array's own
// memory, or `rounded` for a float64 array. Runs without the GIL.
std::span<const float> checked_floats(const py::array& a, const char* name, std::size_t d,
                                      float bound, std::vector<float>& rounded) {
  if (is_float32(a)) {
    const std::span<const float> values = values_of<float>(a);
    require_within(values, name, d, bound, "");
    return values;
  }
  const std::span<const double> values = values_of<double>(a);
  require_within(values, name, d, bound, "");
  rounded.resize(values.size());
  round_to_float32(values, rounded, name, d, false, "");
  return rounded;
}

}  // namespace

void observe_pairs(Engine& engine, py::handle points_arg, py::handle grads_arg) {
  // Between ask() and tell(), or on a slice, the engine refuses even no pairs,
  // with its own message; otherwise no pairs change nothing.
  engine.observe(std::span<const float>(), std::span<const float>());
  const std::size_t d = engine.dim();
  const py::array points = float_array(points_arg, "points");
  const std::size_t m = pairs_of(points, "points", d);
  require_c_contiguous(points, "points");
  const py::array grads = float_array(grads_arg, "grads");
  if (pairs_of(grads, "grads", d) != m) {
    throw std::invalid_argument("grads: shape " + shape_string(grads) + " does not match points' " +
                                shape_string(points) + " (" + std::to_string(m) +
                                " pairs of dimension " + std::to_string(d) + ")");
  }
  require_c_contiguous(grads, "grads");
  const float bound = magnitude_bound(d);
  py::gil_scoped_release release;
  std::vector<float> rounded_points, rounded_grads;
  const std::span<const float> x = checked_floats(points, "points", d, bound, rounded_points);
  const std::span<const float> g = checked_floats(grads, "grads", d, bound, rounded_grads);
  engine.observe(x, g);
}

const char* const kObserveDoc =
    R"doc(observe(self, points: ArrayLike, grads: ArrayLike) -> None

Adds true (point, gradient) pairs that no round committed to the history, in
order, as a commit pushes its pairs (beyond the history's capacity only the
last ones stay): for gradients that arrive after their round was committed,
a straggler's, so that they still improve the next predictions. points and
grads are (m, d) array-likes (or one (d,) pair), float32 or float64 (lists
are converted; numpy arrays must be C-contiguous; float64 is rounded to
float32). Nothing else changes: x, the optimizer state and step, iteration,
evaluations (the round counted those evaluations already), the seeds. The
next ask() refits with the pairs, and they count as history for the warm-up.

ValueError for a wrong dtype or shape (naming the argument), or a value that
is not finite or above the magnitude bound (naming the argument, row, column
and value); RuntimeError between ask() and tell() and on a slice of a
sharded engine. The engine is unchanged after any error. Releases the GIL
while the engine works.
)doc";

}  // namespace optex::python

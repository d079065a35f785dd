// OptEx.set_gradient_oracle, set_optimizer and set_threads: what a run may
// change between iterations, the gradient oracle of proxy='target' included.
#include <pybind11/numpy.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include "arrays.hpp"
#include "optimizers.hpp"
#include "py_optex.hpp"

namespace optex::python {
namespace {

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
    // optex's one rule for values (python/optex/_values.py): a real number.
    const double loss =
        py::module_::import("optex._values")
            .attr("real_loss")(result[py::int_(0)], "gradient_oracle: the loss it returned")
            .cast<double>();
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

}  // namespace

void define_settings(OptExClass& cls) {
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
any error. Checkpoints store the values in force. A learning rate of 0 (where
warmups start and cosine schedules end) is an ordinary value, as in
torch.optim: the rounds evaluate their points, all at the iterate, which stays
bit for bit, while the optimizer state advances.
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
}

}  // namespace optex::python

// optex.OptEx: the class, its documentation and its construction; the
// methods come from one file per concept (py_optex.hpp). Also registers
// optex.IterationInfo.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "iteration_info.hpp"
#include "optimizers.hpp"
#include "options.hpp"
#include "py_optex.hpp"
#include "shard.hpp"

namespace optex::python {
namespace {

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

pickle, copy.deepcopy and copy.copy copy the engine between rounds: the copy
continues the run bit for bit (iterate, optimizer state, history, lengthscale,
random state, counters), independently of the original, so engines can be
checkpointed, branched and shipped to Dask or Ray workers (any pickle
protocol, out-of-band buffers included). The payload is state_arrays() with a
checksum: a truncated one raises pickle's error, an altered one ValueError.
Between ask() and tell(), and for a slice (shard=), they raise TypeError. A
gradient oracle is not copied (as save() does not keep it): set it again.

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

  define_ask_tell(cls);
  define_device_rows(cls);
  define_settings(cls);
  define_checkpoints(cls);
  define_properties(cls);
}

}  // namespace

void register_engine(py::module_& m) {
  register_iteration_info(m);
  register_optex(m);
}

}  // namespace optex::python

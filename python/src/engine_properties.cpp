// OptEx's read-only properties (x, dim, shard, iteration, options, ...), the
// pending batch's seeds and predicted gradients, and repr().
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "arrays.hpp"
#include "optimizers.hpp"
#include "options.hpp"
#include "py_optex.hpp"

namespace optex::python {

void define_properties(OptExClass& cls) {
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

}  // namespace optex::python

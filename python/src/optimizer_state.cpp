// optex.OptimizerState, optex.init_state and optex.apply_step: a base
// optimizer's explicit state and its plain (non-OptEx) step, optax style, for
// baselines that must take exactly the engine's steps.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "optimizers.hpp"

namespace optex::python {
namespace {

// A writable, C-contiguous float32 (d,) array, updated in place.
std::span<float> writable_row(py::handle obj, const char* name) {
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(std::string(name) + ": expected a float32 numpy array, got " +
                         py::str(py::type::of(obj).attr("__name__")).cast<std::string>());
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!is_float32(a) || a.ndim() != 1 || !a.writeable() || !(a.flags() & py::array::c_style)) {
    throw std::invalid_argument(std::string(name) +
                                ": must be a writable, C-contiguous float32 array of shape (d,), "
                                "updated in place; got dtype " +
                                py::str(a.dtype()).cast<std::string>() + " shape " +
                                shape_string(a));
  }
  return {static_cast<float*>(a.mutable_data()), static_cast<std::size_t>(a.size())};
}

}  // namespace

void register_optimizer_state(py::module_& m) {
  py::class_<OptimizerState> cls(m, "OptimizerState", py::is_final(),
                                 R"doc(The explicit state of a base optimizer: its per-coordinate
buffers (slots; what each holds is the optimizer's, e.g. Adam's exp_avg and
exp_avg_sq) and its step count. Made by optex.init_state, advanced by
optex.apply_step; copy.copy and copy.deepcopy give independent copies.
)doc");
  exported_from(cls, "optex");
  cls.def_property_readonly(
      "step", [](const OptimizerState& s) { return s.step; }, "Updates applied so far.");
  cls.def_property_readonly(
      "slots",
      [](const OptimizerState& s) {
        py::list out;
        for (const std::vector<float>& slot : s.slots) {
          if (slot.empty()) {
            out.append(py::none());
          } else {
            out.append(copy_of(std::span<const float>(slot)));
          }
        }
        return py::tuple(out);
      },
      "A tuple of float32 copies of the slots, None for a slot the optimizer does not keep; "
      "slot j is what the optimizer class's state_slot_names[j] names (torch.optim's state key).");
  cls.def("__copy__", [](const OptimizerState& s) { return s; });
  cls.def(
      "__deepcopy__", [](const OptimizerState& s, py::handle) { return s; }, py::arg("memo"));
  cls.def(
      "__eq__", [](const OptimizerState& a, const OptimizerState& b) { return a == b; },
      py::is_operator());
  cls.def("__repr__", [](const OptimizerState& s) {
    return "OptimizerState(step=" + std::to_string(s.step) + ", slots " +
           std::to_string(s.used().count()) + ")";
  });

  m.def(
      "init_state",
      [](py::handle optimizer, std::size_t dim) {
        if (dim == 0) throw std::invalid_argument("dim: must be >= 1, got 0");
        const OptimizerRanges ranges =
            ranges_from_python(optimizer, "optimizer").for_dimension(dim);
        return init_state(ranges, dim);
      },
      py::arg("optimizer"), py::arg("dim"),
      R"doc(A fresh state of `optimizer` (or of a list of (size, optimizer) ranges) for
dimension `dim`: zero buffers, step 0.
)doc");
  m.def(
      "apply_step",
      [](py::handle optimizer, py::handle x_arg, OptimizerState& state, py::handle grad_arg) {
        const std::span<float> x = writable_row(x_arg, "x");
        const OptimizerRanges ranges =
            ranges_from_python(optimizer, "optimizer").for_dimension(x.size());
        py::array grad = float_array(grad_arg, "grad");
        require_shape(grad, "grad", {x.size()});
        const py::module_ numpy = py::module_::import("numpy");
        // The step writes x while it reads grad: a grad that is x, or overlaps it
        // (x = buf[1:], grad = buf[:-1]), is read from a copy, or it would be read
        // partly updated.
        if (numpy.attr("may_share_memory")(grad, x_arg).cast<bool>()) grad = grad.attr("copy")();
        grad = numpy.attr("ascontiguousarray")(grad);
        std::vector<float> rounded;
        std::span<const float> g;
        if (is_float32(grad)) {
          g = values_of<float>(grad);
          require_finite(g, "grad", 0, "");
        } else {
          // As tell() rounds: a value outside the float32 range is named, not made inf.
          rounded.resize(x.size());
          round_to_float32(values_of<double>(grad), rounded, "grad", 0, true, "");
          g = rounded;
        }
        apply_step(ranges, x, state, g);  // checks the state's layout before writing
      },
      py::arg("optimizer"), py::arg("x"), py::arg("state"), py::arg("grad"),
      R"doc(One plain step of `optimizer` (or of (size, optimizer) ranges): x (a writable
float32 (d,) array) and state are updated in place with the gradient grad, exactly
as the engine steps them (with N = 1 an optex.OptEx follows these steps bit for bit).
ValueError for a state of another layout or dimension, a non-finite gradient or a
bad x, before anything is written.
)doc");
}

}  // namespace optex::python

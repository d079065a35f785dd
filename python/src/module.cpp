// The extension module optex._optex; the `optex` package re-exports it.
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "bindings.hpp"
#include "dlpack.hpp"
#include "optex/backend/device.hpp"
#include "optex/engine/magnitude_bound.hpp"
#include "optex/version.hpp"

PYBIND11_MODULE(_optex, m) {
  namespace py = pybind11;
  using namespace optex::python;
  m.doc() = "The compiled core of the optex package; import optex instead.";
  m.attr("__version__") = OPTEX_VERSION_STRING;
  m.def("built_with_cuda", &optex::built_with_cuda,
        "True when this build of optex contains the CUDA backend (device='cuda').");
  m.def("cuda_device_count", &optex::cuda_device_count,
        "The number of CUDA devices this process can use; 0 without the CUDA backend, a driver "
        "or a device.");
  m.def(
      "magnitude_bound",
      [](py::ssize_t d) {
        if (d < 1) throw std::invalid_argument("d: must be >= 1, got " + std::to_string(d));
        return optex::magnitude_bound(static_cast<std::size_t>(d));
      },
      py::arg("d"),
      "The largest magnitude a point or gradient entry may have in dimension d: "
      "sqrt(FLT_MAX / (8 d)) as a float32. tell() refuses larger values (or drops their "
      "pairs with drop_nonfinite=True), as it does NaN and infinity.");
  // Classes before the functions whose signatures name them.
  register_optimizers(m);
  register_optimizer_state(m);
  register_options(m);
  register_device_array(m);
  register_engine(m);
  register_point_split(m);
  register_shard(m);
  register_plan(m);
  py::module_ problems = m.def_submodule("problems", "The shipped test problems.");
  register_problems(problems);

  // What `from optex._optex import *` gives the optex package: every public
  // name but the problems submodule, which optex.problems wraps.
  py::list names;
  for (py::handle name : py::module_::import("builtins").attr("dir")(m)) {
    const auto text = name.cast<std::string>();
    if (!text.starts_with("_") && text != "problems") names.append(name);
  }
  m.attr("__all__") = names;
}

// OptEx.device_points, device_grads, device_x and tell_device: the batch's
// rows and the iterate where the engine keeps them, zero-copy (DLPack).
#include <pybind11/numpy.h>

#include <cstddef>
#include <vector>

#include "arrays.hpp"
#include "commit_rows.hpp"
#include "coordinate_ranges.hpp"
#include "dlpack.hpp"
#include "py_optex.hpp"

namespace optex::python {
namespace {

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

}  // namespace

void define_device_rows(OptExClass& cls) {
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
}

}  // namespace optex::python

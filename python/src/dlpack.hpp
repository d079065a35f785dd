// optex.DeviceArray: rows of an engine, where they live (host or GPU memory),
// handed to other libraries through the DLPack protocol without a copy:
// torch.from_dlpack(a), numpy.from_dlpack(a) (host rows), cupy.from_dlpack(a).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>

#include "optex/backend/device.hpp"

namespace optex::python {

namespace py = pybind11;

// A float32 view of memory that `owner` keeps alive: rows x cols row-major
// (ndim 2) or a vector of cols (ndim 1). `writable` tells consumers whether writing through the
// view is part of the contract (DLPack itself has no read-only flag before version 1.0).
struct DeviceArray {
  py::object owner;
  float* data = nullptr;
  std::size_t rows = 0;
  std::size_t cols = 0;
  int ndim = 2;
  Device device;
  bool writable = false;
};

void register_device_array(py::module_& m);

}  // namespace optex::python

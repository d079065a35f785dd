// The base optimizers as Python value types: optex.Sgd, optex.Adam (coupled
// L2 weight decay, torch.optim.Adam) and optex.AdamW (decoupled weight decay,
// torch.optim.AdamW). In C++ AdamW is an Adam with decoupled_weight_decay set;
// Python gets a class of its own so that the choice shows in the type.
#pragma once

#include <pybind11/pybind11.h>

#include "optex/optimizer.hpp"

namespace optex::python {

namespace py = pybind11;

// An Adam whose decoupled_weight_decay is always set.
struct AdamW : Adam {
  AdamW() : Adam(adamw()) {}
};

// The optimizer a Python object names (an Sgd, Adam or AdamW); TypeError
// naming `param` otherwise.
Optimizer optimizer_from_python(py::handle obj, const char* param);

// A new Python object holding a copy of `optimizer`.
py::object optimizer_to_python(const Optimizer& optimizer);

}  // namespace optex::python

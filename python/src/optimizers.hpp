// The base optimizers as Python value types, one class per entry of each
// optimizer's python_classes() (optex.Sgd, optex.Adam, optex.AdamW,
// optex.RmsProp, optex.Lion), registered from the optimizers' own
// descriptions: adding an optimizer to the core adds its class here.
#pragma once

#include <pybind11/pybind11.h>

#include "optex/optimizers/optimizer_ranges.hpp"

namespace optex::python {

namespace py = pybind11;

// The optimizer a Python object names (an instance of one of the classes);
// TypeError naming `param` otherwise.
Optimizer optimizer_from_python(py::handle obj, const char* param);

// A new Python object holding a copy of `optimizer`, of its class.
py::object optimizer_to_python(const Optimizer& optimizer);

// What OptEx(optimizer=...) and set_optimizer take: an optimizer, or a list
// of (size, optimizer) pairs or (size, optimizer, step_offset) triples
// (hyperparameters per contiguous range; the offset defaults to 0). TypeError
// or ValueError naming `param` and the entry (None is a TypeError: only
// OptEx's constructor gives it a meaning, Adam's defaults).
OptimizerRanges ranges_from_python(py::handle obj, const char* param);

// What ranges_from_python takes back: the optimizer when there is one range
// at step offset 0; else a list of (size, optimizer) pairs, or of (size,
// optimizer, step_offset) triples when any range has a step offset.
py::object ranges_to_python(const OptimizerRanges& ranges);

}  // namespace optex::python

// OptEx.observe: true (point, gradient) pairs that no round committed enter
// the history (Engine::observe). The binding's body and docstring, registered
// by engine.cpp beside tell().
#pragma once

#include <pybind11/pybind11.h>

#include "optex/engine/engine.hpp"

namespace optex::python {

namespace py = pybind11;

// Converts and checks `points` and `grads` (array-likes of shape (m, d) or
// (d,), float32 or float64; float64 rounded to float32 into a buffer of its
// own), then observes them with the GIL released. The caller holds the
// object's one-call-at-a-time guard. ValueError naming the argument (dtype,
// shape, contiguity; a value that is not finite or above the magnitude
// bound: its row, column and value), RuntimeError between ask() and tell()
// or on a slice of a sharded engine; the engine is unchanged after any error.
void observe_pairs(Engine& engine, py::handle points, py::handle grads);

extern const char* const kObserveDoc;

}  // namespace optex::python

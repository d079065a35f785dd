// The last step tell() on a slice and tell_device() share: the losses
// converted, and the pending batch, whose gradient rows are written, committed.
#pragma once

#include <pybind11/numpy.h>

#include <span>
#include <string>
#include <vector>

#include "iteration_info.hpp"
#include "optex/engine/engine.hpp"

namespace optex::python {

namespace py = pybind11;

// Appended to a refusal of a gradient or loss that drop_nonfinite would let through.
extern const char* const kTellHint;

// The (N,) losses as float64 (float32 ones widened).
std::vector<double> losses_from(const py::array& losses);

// Engine::tell's handling of inadmissible rows for a Python drop_nonfinite flag.
NonfiniteRows nonfinite_rows(bool drop_nonfinite);

// Commits the pending batch, whose gradient rows are written, with `losses`.
// Unless drop_nonfinite, the commit's own check (Engine::tell in
// NonfiniteRows::refuse mode, one pass over the rows; on a slice completed
// across the slices, so every slice refuses alike) refuses rows that are not
// finite or exceed the bound: ValueError naming the points; `rows` says
// where the rows came from. The batch's losses are restored after any error.
// Runs without the GIL.
Info commit_rows(Engine& engine, Batch& batch, std::span<const double> losses, bool drop_nonfinite,
                 std::span<const CoordinateRange> unchanged, const std::string& rows);

}  // namespace optex::python

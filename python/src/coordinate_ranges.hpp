// Turning what a Python caller passes as coordinate ranges (OptEx.tell's
// `unchanged`) into the core's CoordinateRange list, with errors that name
// the argument.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <vector>

#include "optex/engine/coordinate_range.hpp"

namespace optex::python {

namespace py = pybind11;

// None or an empty sequence: no ranges. Otherwise a sequence of (offset,
// size) pairs of integers or a (k, 2) integer array (numpy, or anything
// numpy.asarray takes). ValueError naming `name` for anything else: another
// shape, a float, bool or object dtype (so NaN never gets as far as a
// range), a negative value, or ranges that check_coordinate_ranges refuses
// for dimension `dim` (empty, past the end, unsorted, overlapping).
std::vector<CoordinateRange> coordinate_ranges_from_python(py::handle obj, std::size_t dim,
                                                           const char* name);

}  // namespace optex::python

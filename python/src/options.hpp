// optex.Options: every setting of an OptEx run besides the base optimizer, with
// the C++ defaults, enumerations spelled as strings (names.hpp).
#pragma once

#include <pybind11/pybind11.h>

#include "optex/options.hpp"

namespace optex::python {

namespace py = pybind11;

// Sets the field `name` of `options` from a Python value, converting and
// checking its type (TypeError) and enumeration names (ValueError), but not
// the whole Options: callers that set several fields validate once at the
// end, so that fields that depend on each other can be given in any order.
// Returns false when Options has no field of that name.
bool set_option_field(Options& options, const std::string& name, py::handle value);

}  // namespace optex::python

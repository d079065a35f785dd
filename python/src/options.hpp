// optex.Options: every setting of an OptEx run besides the base optimizer, with
// the C++ defaults, enumerations spelled as strings (names.hpp).
#pragma once

#include <pybind11/pybind11.h>

#include "optex/engine/options.hpp"

namespace optex::python {

namespace py = pybind11;

// Sets the field `name` of `options` from a Python value, converting and
// checking its type (TypeError) and enumeration names (ValueError), but not
// the whole Options: callers that set several fields validate once at the
// end, so that fields that depend on each other can be given in any order.
// Returns false when Options has no field of that name.
bool set_option_field(Options& options, const std::string& name, py::handle value);

// Every field of `options` by name, as Options(**dict) takes it back:
// enumerations and the device as their names, the lengthscale grid as a list.
py::dict options_to_dict(const Options& options);

// The Options of such a dict, strictly: every field present, no other key,
// each of its type. Raises ValueError naming `name['field']` for the first
// missing, unknown or bad field (a wrong type included), or naming the
// field's value when the whole does not validate.
Options options_from_dict(py::handle dict, const std::string& name);

}  // namespace optex::python

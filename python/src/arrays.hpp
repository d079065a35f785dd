// Turning what a Python caller passes as an array into floats the core reads,
// with errors that name the argument.
//
// The rule, the same for every array argument (x0, grads, losses, problem
// points): an array-like must become a float32 or float64 numpy array. Lists
// and tuples (nested or not) must hold real numbers and are read as float64
// (they carry no dtype; optex._values.real_list, the rule minimize and plan
// apply too: a bool, str, bytes, complex or None element is refused, naming
// it); anything else goes through numpy.asarray() and must already be float32
// or float64:
// integer, bool, float16 or complex arrays are refused rather than cast,
// because a gradient of such a dtype is almost always a bug upstream.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>

namespace optex::python {

namespace py = pybind11;

// The numpy array for `obj`, float32 or float64 in native byte order; a
// ValueError naming `name` otherwise. No copy for a numpy array of those dtypes.
py::array float_array(py::handle obj, const char* name);

bool is_float32(const py::array& a);

// "(4, 10)".
std::string shape_string(const py::array& a);

// ValueError naming `name` unless a.shape == expected.
void require_shape(const py::array& a, const char* name,
                   std::initializer_list<std::size_t> expected);

// ValueError naming `name` unless `a` is C-contiguous: the caller's buffer is
// read in place, so a strided view would have to be copied behind its back.
void require_c_contiguous(const py::array& a, const char* name);

// The checks below touch no Python object, so they run without the GIL. Each
// throws std::invalid_argument (ValueError) at the first value that is not
// finite, naming `name` and where the value is: "row r, column c" when
// `columns` > 0, "element i" otherwise. `hint` ends the message.
void require_finite(std::span<const float> values, const char* name, std::size_t columns,
                    const char* hint);
void require_finite(std::span<const double> values, const char* name, std::size_t columns,
                    const char* hint);

// The same for values that must also be at most `bound` in magnitude after
// rounding to float32 (optex::magnitude_bound for points and gradients).
void require_within(std::span<const float> values, const char* name, std::size_t columns,
                    float bound, const char* hint);
void require_within(std::span<const double> values, const char* name, std::size_t columns,
                    float bound, const char* hint);

// Rounds src to float32 into dst (same size). With `check_finite`, a value that
// is not finite after rounding (NaN, infinity, or a finite double outside the
// float32 range) throws like require_finite, before anything is written.
void round_to_float32(std::span<const double> src, std::span<float> dst, const char* name,
                      std::size_t columns, bool check_finite, const char* hint);

// Widens src to double into dst (same size).
void widen_to_float64(std::span<const float> src, std::span<double> dst);

// The data of a C-contiguous float32 / float64 array.
template <class T>
std::span<const T> values_of(const py::array& a) {
  return {static_cast<const T*>(a.data()), static_cast<std::size_t>(a.size())};
}

// A new numpy array holding a copy of `values`.
template <class T>
py::array_t<T> copy_of(std::span<const T> values) {
  py::array_t<T> out(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

}  // namespace optex::python

#include "arrays.hpp"

#include "optex/engine/magnitude_bound.hpp"

#include <algorithm>
#include <array>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace optex::python {
namespace {

std::string location(std::size_t index, std::size_t columns) {
  if (columns == 0) return "element " + std::to_string(index);
  return "row " + std::to_string(index / columns) + ", column " + std::to_string(index % columns);
}

// The shortest text that reads back as the value, as Python's repr writes it.
template <class T>
std::string repr(T value) {
  std::array<char, 32> text{};
  const auto written = std::to_chars(text.data(), text.data() + text.size(), value);
  return std::string(text.data(), written.ptr);
}

[[noreturn]] void reject_value(const char* name, std::size_t index, std::size_t columns,
                               double value, const char* hint) {
  std::string msg = std::string(name) + ": " + location(index, columns) + " is " + repr(value);
  if (std::isfinite(value)) msg += ", outside the float32 range";
  throw std::invalid_argument(msg + " (must be finite" + hint + ")");
}

template <class T>
void require_finite_impl(std::span<const T> values, const char* name, std::size_t columns,
                         const char* hint) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) reject_value(name, i, columns, values[i], hint);
  }
}

// Each value as float32 must be within `bound`.
template <class T>
void require_within_impl(std::span<const T> values, const char* name, std::size_t columns,
                         float bound, const char* hint) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto rounded = static_cast<float>(values[i]);
    if (within_bound(rounded, bound)) continue;
    if (!std::isfinite(rounded)) reject_value(name, i, columns, values[i], hint);
    throw std::invalid_argument(std::string(name) + ": " + location(i, columns) + " is " +
                                repr(values[i]) + ", above the magnitude bound " + repr(bound) +
                                " for dimension " +
                                std::to_string(columns > 0 ? columns : values.size()) +
                                " (must be finite and at most the bound" + hint + ")");
  }
}

// As Python writes a tuple of ints: "(4, 10)", "(3,)", "()".
std::string tuple_string(const std::vector<std::size_t>& values) {
  std::string out = "(";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(values[i]);
  }
  if (values.size() == 1) out += ",";
  out += ")";
  return out;
}

}  // namespace

py::array float_array(py::handle obj, const char* name) {
  py::object converted;
  if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
    // optex's one rule for values (python/optex/_values.py): real numbers only,
    // read as float64; its ValueError names the element that is not one.
    converted = py::module_::import("optex._values")
                    .attr("real_list")(obj, py::str(std::string(name) + ":"));
    return py::reinterpret_borrow<py::array>(converted);
  }
  try {
    converted = py::module_::import("numpy").attr("asarray")(obj);
  } catch (py::error_already_set& e) {
    const std::string msg = std::string(name) + ": cannot be converted to a float array";
    py::raise_from(e, PyExc_ValueError, msg.c_str());
    throw py::error_already_set();
  }
  auto a = py::reinterpret_borrow<py::array>(converted);
  if (!py::isinstance<py::array_t<float>>(a) && !py::isinstance<py::array_t<double>>(a)) {
    throw std::invalid_argument(std::string(name) + ": dtype " +
                                py::str(a.dtype()).cast<std::string>() +
                                " is not supported: pass float32 or float64 (for example " + name +
                                ".astype(numpy.float32))");
  }
  return a;
}

bool is_float32(const py::array& a) { return py::isinstance<py::array_t<float>>(a); }

std::string shape_string(const py::array& a) {
  std::vector<std::size_t> shape;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) shape.push_back(static_cast<std::size_t>(a.shape(i)));
  return tuple_string(shape);
}

void require_shape(const py::array& a, const char* name,
                   std::initializer_list<std::size_t> expected) {
  bool same = static_cast<std::size_t>(a.ndim()) == expected.size();
  py::ssize_t axis = 0;
  for (const std::size_t extent : expected) {
    if (!same) break;
    same = static_cast<std::size_t>(a.shape(axis++)) == extent;
  }
  if (same) return;
  std::vector<std::size_t> want(expected);
  throw std::invalid_argument(std::string(name) + ": expected shape " + tuple_string(want) +
                              ", got " + shape_string(a));
}

void require_c_contiguous(const py::array& a, const char* name) {
  if (a.flags() & py::array::c_style) return;
  std::vector<std::size_t> strides;
  for (py::ssize_t i = 0; i < a.ndim(); ++i)
    strides.push_back(static_cast<std::size_t>(a.strides(i)));
  throw std::invalid_argument(std::string(name) + ": the array is not C-contiguous (strides " +
                              tuple_string(strides) + "); pass numpy.ascontiguousarray(" + name +
                              ")");
}

void require_finite(std::span<const float> values, const char* name, std::size_t columns,
                    const char* hint) {
  require_finite_impl(values, name, columns, hint);
}

void require_finite(std::span<const double> values, const char* name, std::size_t columns,
                    const char* hint) {
  require_finite_impl(values, name, columns, hint);
}

void require_within(std::span<const float> values, const char* name, std::size_t columns,
                    float bound, const char* hint) {
  require_within_impl(values, name, columns, bound, hint);
}

void require_within(std::span<const double> values, const char* name, std::size_t columns,
                    float bound, const char* hint) {
  require_within_impl(values, name, columns, bound, hint);
}

void round_to_float32(std::span<const double> src, std::span<float> dst, const char* name,
                      std::size_t columns, bool check_finite, const char* hint) {
  if (check_finite) require_within_impl(src, name, columns, FLT_MAX, hint);  // before writing
  std::transform(src.begin(), src.end(), dst.begin(),
                 [](double v) { return static_cast<float>(v); });
}

void widen_to_float64(std::span<const float> src, std::span<double> dst) {
  for (std::size_t i = 0; i < src.size(); ++i) dst[i] = src[i];
}

}  // namespace optex::python

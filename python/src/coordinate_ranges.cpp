#include "coordinate_ranges.hpp"

#include <pybind11/numpy.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "arrays.hpp"

namespace optex::python {
namespace {

constexpr const char* kExpected =
    "expected a sequence of (offset, size) pairs or a (k, 2) "
    "integer array";

// The (k, 2) values as signed integers, refusing negative ones before they
// could wrap around to huge offsets or sizes.
std::vector<CoordinateRange> from_signed(const py::array& a, const char* name) {
  const auto values = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>(a);
  std::vector<CoordinateRange> ranges(static_cast<std::size_t>(values.shape(0)));
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    const std::int64_t offset = values.at(static_cast<py::ssize_t>(r), 0);
    const std::int64_t size = values.at(static_cast<py::ssize_t>(r), 1);
    if (offset < 0 || size < 0) {
      throw std::invalid_argument(std::string(name) + ": range " + std::to_string(r) + " (offset " +
                                  std::to_string(offset) + ", size " + std::to_string(size) +
                                  ") has a negative " + (offset < 0 ? "offset" : "size"));
    }
    ranges[r] = {static_cast<std::size_t>(offset), static_cast<std::size_t>(size)};
  }
  return ranges;
}

std::vector<CoordinateRange> from_unsigned(const py::array& a) {
  const auto values = py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>(a);
  std::vector<CoordinateRange> ranges(static_cast<std::size_t>(values.shape(0)));
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    ranges[r] = {static_cast<std::size_t>(values.at(static_cast<py::ssize_t>(r), 0)),
                 static_cast<std::size_t>(values.at(static_cast<py::ssize_t>(r), 1))};
  }
  return ranges;
}

}  // namespace

std::vector<CoordinateRange> coordinate_ranges_from_python(py::handle obj, std::size_t dim,
                                                           const char* name) {
  if (obj.is_none()) return {};
  py::object converted;
  try {
    converted = py::module_::import("numpy").attr("asarray")(obj);
  } catch (py::error_already_set& e) {
    const std::string msg = std::string(name) + ": " + kExpected + "; numpy cannot convert it";
    py::raise_from(e, PyExc_ValueError, msg.c_str());
    throw py::error_already_set();
  }
  const auto a = py::reinterpret_borrow<py::array>(converted);
  // [] carries no dtype (numpy makes it float64): no ranges, like None.
  if (a.size() == 0 && (a.ndim() == 1 || (a.ndim() == 2 && a.shape(1) == 2))) return {};
  if (a.ndim() != 2 || a.shape(1) != 2) {
    throw std::invalid_argument(std::string(name) + ": " + kExpected + ", got shape " +
                                shape_string(a));
  }
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u') {
    throw std::invalid_argument(std::string(name) + ": " + kExpected + ", got dtype " +
                                py::str(a.dtype()).cast<std::string>() +
                                " (offsets and sizes are whole numbers of coordinates)");
  }
  std::vector<CoordinateRange> ranges = kind == 'i' ? from_signed(a, name) : from_unsigned(a);
  check_coordinate_ranges(ranges, dim, name);
  return ranges;
}

}  // namespace optex::python

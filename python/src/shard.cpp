// optex.OptEx(shard=...): the ShardSums trampoline over a Python object, and
// the functions that say which slice is whose (optex.shard_of,
// optex.slice_ranges).
#include "shard.hpp"

#include <pybind11/numpy.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "bindings.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "optimizers.hpp"

namespace optex::python {
namespace {

std::string type_name(py::handle obj) {
  return py::str(py::type::of(obj).attr("__name__")).cast<std::string>();
}

void require_method(py::handle sums, const char* method) {
  if (!py::hasattr(sums, method) || !PyCallable_Check(sums.attr(method).ptr())) {
    throw py::type_error(std::string("shard: sums must have the methods sum(values) and "
                                     "all(flags), which complete numpy arrays in place across "
                                     "the slices; the given ") +
                         type_name(sums) + " has no callable '" + method + "'");
  }
}

// What a sums method gave back: None, and the array it was handed still a
// 1-D array of its dtype and size (the values are read back from it).
template <class T>
void check_completed(const py::object& returned, const py::array_t<T>& values, std::size_t n,
                     const char* method) {
  if (!returned.is_none()) {
    throw py::type_error(std::string("shard: sums.") + method +
                         " must complete its array in place and return None, got a " +
                         type_name(returned));
  }
  const py::array& a = values;
  if (!a.dtype().is(py::dtype::of<T>()) || a.ndim() != 1 ||
      static_cast<std::size_t>(a.size()) != n) {
    throw py::type_error(std::string("shard: sums.") + method +
                         " changed the dtype or shape of the array it completes (it must "
                         "write into it in place)");
  }
}

// A non-negative Python int (not a bool) for shard element `what`.
std::size_t index_from(py::handle value, const char* name, const char* what, std::int64_t least) {
  if (!py::isinstance<py::int_>(value) || py::isinstance<py::bool_>(value)) {
    throw std::invalid_argument(std::string(name) + ": " + what + " must be an int, got a " +
                                type_name(value));
  }
  std::int64_t v = 0;
  try {
    v = value.cast<std::int64_t>();
  } catch (const py::cast_error&) {
    throw std::invalid_argument(std::string(name) + ": " + what + " is out of range");
  }
  if (v < least) {
    throw std::invalid_argument(std::string(name) + ": " + what + " must be >= " +
                                std::to_string(least) + ", got " + std::to_string(v));
  }
  return static_cast<std::size_t>(v);
}

}  // namespace

PythonShardSums::PythonShardSums(py::object sums) : sums_(std::move(sums)) {
  require_method(sums_, "sum");
  require_method(sums_, "all");
}

PythonShardSums::~PythonShardSums() {
  // The engine may be destroyed without the GIL (a constructor that throws
  // while it is released): the reference is dropped with it held.
  py::gil_scoped_acquire gil;
  py::object dropped = std::move(sums_);
}

void PythonShardSums::sum(std::span<double> partials) {
  py::gil_scoped_acquire gil;
  const std::size_t n = partials.size();
  py::array_t<double> values(static_cast<py::ssize_t>(n));
  std::copy(partials.begin(), partials.end(), values.mutable_data());
  const py::object returned = sums_.attr("sum")(values);
  check_completed(returned, values, n, "sum");
  const double* completed = values.data();
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(completed[i])) {
      throw py::value_error("shard: sums.sum completed value " + std::to_string(i) + " of " +
                            std::to_string(n) + " to " + std::to_string(completed[i]) +
                            "; sums of finite partials are finite, so the callback is faulty "
                            "(the engine takes no such value)");
    }
  }
  std::copy(completed, completed + n, partials.begin());
}

void PythonShardSums::all(std::span<char> flags) {
  py::gil_scoped_acquire gil;
  const std::size_t n = flags.size();
  py::array_t<std::uint8_t> values(static_cast<py::ssize_t>(n));
  std::uint8_t* out = values.mutable_data();
  for (std::size_t i = 0; i < n; ++i) out[i] = flags[i] != 0 ? 1 : 0;
  const py::object returned = sums_.attr("all")(values);
  check_completed(returned, values, n, "all");
  const std::uint8_t* completed = values.data();
  // The AND of every slice's 0/1 flags is 0 or 1: anything else is a callback
  // that does not compute it (a sum, a garbage byte), refused rather than read
  // as 1. The engine checks the rest (a 1 where this slice's flag is 0).
  for (std::size_t i = 0; i < n; ++i) {
    if (completed[i] > 1) {
      throw py::value_error("shard: sums.all completed flag " + std::to_string(i) + " of " +
                            std::to_string(n) + " to " + std::to_string(completed[i]) +
                            "; the AND of every slice's flags is 0 or 1, so the callback is "
                            "faulty (the engine takes no such value)");
    }
  }
  for (std::size_t i = 0; i < n; ++i) flags[i] = static_cast<char>(completed[i]);
}

std::optional<ShardArgument> shard_from_python(py::handle shard, const char* name) {
  if (shard.is_none()) return std::nullopt;
  if (!py::isinstance<py::tuple>(shard) || py::len(shard) != 3) {
    throw std::invalid_argument(std::string(name) +
                                ": expected a tuple (dim, offset, sums) or None, got " +
                                py::repr(shard).cast<std::string>());
  }
  const auto t = py::reinterpret_borrow<py::tuple>(shard);
  ShardArgument a;
  a.dim = index_from(t[0], name, "dim", 1);
  a.offset = index_from(t[1], name, "offset", 0);
  a.sums = std::make_unique<PythonShardSums>(py::reinterpret_borrow<py::object>(t[2]));
  return a;
}

void register_shard(py::module_& m) {
  m.def(
      "shard_of",
      [](py::ssize_t d, int world, int rank) {
        if (d < 1) throw std::invalid_argument("d: must be >= 1, got " + std::to_string(d));
        const CoordinateShard s = shard_of(static_cast<std::size_t>(d), world, rank);
        return py::make_tuple(s.offset, s.size);
      },
      py::arg("d"), py::arg("world"), py::arg("rank"),
      R"doc(shard_of(d: int, world: int, rank: int) -> tuple[int, int]

The slice (offset, size) of a d-vector that rank `rank` of `world` holds
when the state is sharded (the C++ ShardedEngine's split): contiguous runs
of whole blocks of 4096 coordinates, the first d_blocks % world ranks one
block more, so the slices cover range(d) once, in rank order. ValueError
when d has fewer blocks than there are ranks (some rank would hold
nothing), for d < 1, world < 1 or a rank outside [0, world).
)doc");
  m.def(
      "slice_ranges",
      [](py::handle optimizer, py::ssize_t dim, py::ssize_t offset, py::ssize_t size) {
        const OptimizerRanges ranges = ranges_from_python(optimizer, "optimizer");
        if (dim < 1) throw std::invalid_argument("dim: must be >= 1, got " + std::to_string(dim));
        if (offset < 0 || size < 1) {
          throw std::invalid_argument("offset, size: must be >= 0 and >= 1, got " +
                                      std::to_string(offset) + ", " + std::to_string(size));
        }
        return ranges_to_python(slice_ranges(ranges.for_dimension(static_cast<std::size_t>(dim)),
                                             static_cast<std::size_t>(offset),
                                             static_cast<std::size_t>(size)));
      },
      py::arg("optimizer"), py::arg("dim"), py::arg("offset"), py::arg("size"),
      R"doc(slice_ranges(optimizer, dim: int, offset: int, size: int) -> Optimizer | list

The hyperparameters of coordinates [offset, offset + size) of an engine of
dimension `dim` whose optimizer= is `optimizer` (one optimizer, or
(size, optimizer[, step_offset]) ranges adding up to dim): each range cut to
the slice, with its hyperparameters and step offset, in the form
OptEx(optimizer=...) takes (one optimizer stays that). What a slice engine
(OptEx(..., shard=...)) is built with. ValueError for ranges that do not add
up to dim, or a slice that is empty or reaches past dim.
)doc");
}

}  // namespace optex::python

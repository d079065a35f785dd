// optex.OptEx as one slice of a sharded engine (coordinate_shard.hpp): the
// Python object that completes its sums across the slices, and what
// OptEx(shard=...) takes.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <span>

#include "optex/sharded/coordinate_shard.hpp"

namespace optex::python {

namespace py = pybind11;

// ShardSums over a Python object with the methods sum(values) and
// all(flags), each completing a numpy array in place (a collective: every
// slice calls them in the same order with the same sizes). Each call takes
// the GIL, hands Python a new array (never a view of the engine's memory)
// and checks what comes back: a return value other than None or an array
// whose dtype or size changed raise TypeError, a sum that is not finite
// raises ValueError (the sums of finite partials are finite, so such a value
// can only be a faulty callback, and it must not reach the history). An
// exception raised by the callback propagates unchanged. Holds a reference
// to the object for as long as the engine lives.
class PythonShardSums final : public ShardSums {
 public:
  // TypeError unless `sums` has callable sum and all attributes.
  explicit PythonShardSums(py::object sums);
  ~PythonShardSums() override;
  PythonShardSums(const PythonShardSums&) = delete;
  PythonShardSums& operator=(const PythonShardSums&) = delete;

  void sum(std::span<double> partials) override;
  void all(std::span<char> flags) override;

 private:
  py::object sums_;
};

// OptEx(shard=(dim, offset, sums)): the slice's place in the whole vector.
struct ShardArgument {
  std::size_t dim = 0;
  std::size_t offset = 0;
  std::unique_ptr<PythonShardSums> sums;

  // The CoordinateShard of a slice of `size` coordinates (the engine checks
  // that it fits in dim).
  CoordinateShard shard(std::size_t size) const { return {dim, offset, size, sums.get()}; }
};

// None: no shard (a whole engine). Otherwise a tuple (dim, offset, sums) with
// dim >= 1 and offset >= 0 integers (not bools): ValueError naming `name`
// for anything else, TypeError for a sums without the methods.
std::optional<ShardArgument> shard_from_python(py::handle shard, const char* name);

}  // namespace optex::python

// optex.point_range: the core's split of a round's points over groups of
// workers (point_split.hpp), for Python code that shares the points itself
// (optex.torch under torch.distributed) and must agree with DistributedEngine.
#include "optex/distributed/point_split.hpp"

#include "bindings.hpp"

namespace optex::python {
namespace {

// A Python range, so that the signature says "-> range" rather than "-> object".
class Range : public py::object {
 public:
  PYBIND11_OBJECT_DEFAULT(Range, py::object, PyRange_Check)
  Range(int start, int stop)
      : py::object(py::module_::import("builtins").attr("range")(start, stop)) {}
};

}  // namespace
}  // namespace optex::python

namespace pybind11::detail {
template <>
struct handle_type_name<optex::python::Range> {
  static constexpr auto name = const_name("range");
};
}  // namespace pybind11::detail

namespace optex::python {

void register_point_split(py::module_& m) {
  m.def(
      "point_range",
      [](int points, int groups, int group) {
        const PointRange r = point_range(points, groups, group);
        return Range(r.first, r.first + r.count);
      },
      py::arg("points"), py::arg("groups"), py::arg("group"),
      R"doc(The points that group `group` of `groups` evaluates when a round's `points`
points are shared, as a range.

Contiguous blocks: group g gets points // groups points, the first
points % groups groups one more, so the blocks cover range(points) once and
the larger come first. This is the C++ DistributedEngine's split; optex.torch
uses it under torch.distributed. More groups than points leaves the last
groups an empty range. Raises ValueError for points < 1 or groups < 1 and
IndexError for a group outside [0, groups), naming the argument and its value.
)doc");
}

}  // namespace optex::python

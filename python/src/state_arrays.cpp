#include "state_arrays.hpp"

#include <pybind11/numpy.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "optimizers.hpp"
#include "options.hpp"

namespace optex::python {
namespace {

std::string type_name(py::handle value) {
  return py::str(py::type::of(value).attr("__name__")).cast<std::string>();
}

// The key of `name` inside the value at `parent` ("" for the state itself).
std::string child(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : parent + "['" + name + "']";
}

// ---- reading, strictly -------------------------------------------------------------

// `obj` as a dict, when it is a Mapping (any other type: ValueError naming `key`).
py::dict as_dict(py::handle obj, const std::string& key) {
  if (!py::isinstance(obj, py::module_::import("collections.abc").attr("Mapping"))) {
    throw std::invalid_argument((key.empty() ? "state" : key) + ": expected a dict, got " +
                                type_name(obj));
  }
  return py::dict(py::reinterpret_borrow<py::object>(obj));
}

// `obj` as a dict, when it is a Mapping whose keys are exactly `required`
// and some of `optional`.
py::dict checked_mapping(py::handle obj, const std::string& key,
                         const std::vector<std::string>& required,
                         const std::vector<std::string>& optional = {}) {
  const std::string where = key.empty() ? "state" : key;
  const py::dict d = as_dict(obj, key);
  for (const auto& [name, value] : d) {
    const bool known =
        py::isinstance<py::str>(name) &&
        (std::find(required.begin(), required.end(), name.cast<std::string>()) != required.end() ||
         std::find(optional.begin(), optional.end(), name.cast<std::string>()) != optional.end());
    if (!known) {
      throw std::invalid_argument(where + ": unknown key " + py::repr(name).cast<std::string>());
    }
  }
  for (const std::string& name : required) {
    if (!d.contains(name)) throw std::invalid_argument(child(key, name) + ": missing");
  }
  return d;
}

// An int (numpy integers too; bool refused) in [minimum, maximum].
template <class T>
T integer_value(py::handle value, const std::string& key, T minimum = std::numeric_limits<T>::min(),
                T maximum = std::numeric_limits<T>::max()) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr())) {
    throw std::invalid_argument(key + ": expected an int, got " + type_name(value));
  }
  const auto index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  if (index < py::int_(minimum) || index > py::int_(maximum)) {
    throw std::invalid_argument(key + ": " + py::str(index).cast<std::string>() + " is outside [" +
                                std::to_string(minimum) + ", " + std::to_string(maximum) + "]");
  }
  return index.cast<T>();
}

// A real number (a float or an int; bool refused).
double float_value(py::handle value, const std::string& key) {
  if (PyBool_Check(value.ptr()) ||
      !py::isinstance(value, py::module_::import("numbers").attr("Real"))) {
    throw std::invalid_argument(key + ": expected a float, got " + type_name(value));
  }
  return value.cast<double>();
}

std::string shape_text(const std::vector<py::ssize_t>& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    out += (i > 0 ? ", " : "") + (shape[i] < 0 ? std::string("n") : std::to_string(shape[i]));
  }
  return out + (shape.size() == 1 ? ",)" : ")");
}

// The values of a numpy array of exactly dtype T and `shape` (-1: any
// extent), copied in C order whatever its strides.
template <class T>
std::vector<T> array_values(py::handle obj, const std::string& key,
                            const std::vector<py::ssize_t>& shape) {
  const py::dtype dtype = py::dtype::of<T>();
  const auto refuse = [&](const std::string& got) {
    throw std::invalid_argument(key + ": expected a numpy array of dtype " +
                                py::str(dtype).cast<std::string>() + " and shape " +
                                shape_text(shape) + ", got " + got);
  };
  if (!py::isinstance<py::array>(obj)) refuse(type_name(obj));
  const auto a = py::reinterpret_borrow<py::array>(obj);
  std::vector<py::ssize_t> have(a.shape(), a.shape() + a.ndim());
  bool fits = a.dtype().equal(dtype) && have.size() == shape.size();
  for (std::size_t i = 0; fits && i < shape.size(); ++i) {
    fits = shape[i] < 0 || shape[i] == have[i];
  }
  if (!fits)
    refuse("dtype " + py::str(a.dtype()).cast<std::string>() + " and shape " + shape_text(have));
  const auto contiguous =
      py::reinterpret_borrow<py::array>(py::module_::import("numpy").attr("ascontiguousarray")(a));
  std::vector<T> values(static_cast<std::size_t>(contiguous.size()));
  if (!values.empty()) std::memcpy(values.data(), contiguous.data(), values.size() * sizeof(T));
  return values;
}

// A range's dict: its size, its optimizer's class and hyperparameters, its step offset.
OptimizerRange range_from_dict(py::handle obj, const std::string& key) {
  const std::string kind_key = child(key, "kind");
  const py::dict raw = as_dict(obj, key);
  if (!raw.contains("kind")) throw std::invalid_argument(kind_key + ": missing");
  const py::object kind = raw["kind"];
  py::object cls;
  std::string known;
  for (py::handle c : py::module_::import("optex._optex").attr("optimizer_classes")()) {
    const auto name = c.attr("__name__").cast<std::string>();
    known += (known.empty() ? "" : ", ") + name;
    if (py::isinstance<py::str>(kind) && kind.cast<std::string>() == name) {
      cls = py::reinterpret_borrow<py::object>(c);
    }
  }
  if (!cls) {
    throw std::invalid_argument(kind_key + ": expected the name of an optimizer class (" + known +
                                "), got " + py::repr(kind).cast<std::string>());
  }
  std::vector<std::string> keys = {"size", "kind", "step_offset"};
  for (py::handle h : cls.attr("hyperparameters")) keys.push_back(h.cast<std::string>());
  const py::dict d = checked_mapping(obj, key, keys);
  py::dict hyperparameters;
  for (std::size_t i = 3; i < keys.size(); ++i)
    hyperparameters[keys[i].c_str()] = d[keys[i].c_str()];
  py::object optimizer;
  try {
    optimizer = cls(**hyperparameters);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError) && !e.matches(PyExc_ValueError)) throw;
    throw std::invalid_argument(key + ": " + py::str(e.value()).cast<std::string>());
  }
  const auto size = integer_value<std::uint64_t>(d["size"], child(key, "size"), 1);
  const auto step_offset =
      integer_value<std::int64_t>(d["step_offset"], child(key, "step_offset"), 0);
  return {static_cast<std::size_t>(size), optimizer_from_python(optimizer, key.c_str()),
          step_offset};
}

OptimizerRanges ranges_from_list(py::handle obj, const std::string& key) {
  if (!py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj)) {
    throw std::invalid_argument(key + ": expected a list of range dicts, got " + type_name(obj));
  }
  std::vector<OptimizerRange> ranges;
  std::size_t r = 0;
  for (py::handle item : obj) {
    ranges.push_back(range_from_dict(item, key + "[" + std::to_string(r++) + "]"));
  }
  try {
    return OptimizerRanges(std::move(ranges));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(key + ": " + e.what());
  }
}

// The slot index of `name` among the kind's slot names.
int slot_index(const Optimizer& kind, const std::string& name, const std::string& key) {
  std::string names;
  for (int j = 0; j < kMaxStateSlots; ++j) {
    const std::string known = slot_name(kind, j);
    if (known.starts_with("slot ")) continue;  // an index the kind never uses
    if (known == name) return j;
    names += (names.empty() ? "'" : ", '") + known + "'";
  }
  throw std::invalid_argument(key + ": not a state slot of " + std::string(optimizer_name(kind)) +
                              " (its slots: " + names + ")");
}

// The slots by name; which of them the optimizer keeps, and their lengths,
// are validate()'s to check.
void read_slots(py::handle obj, EngineSnapshot& s) {
  for (const auto& [name, value] : as_dict(obj, "slots")) {
    if (!py::isinstance<py::str>(name)) {
      throw std::invalid_argument("slots: unknown key " + py::repr(name).cast<std::string>());
    }
    const std::string key = child("slots", name.cast<std::string>());
    const int j = slot_index(s.optimizer.front(), name.cast<std::string>(), key);
    s.state.slots[static_cast<std::size_t>(j)] = array_values<float>(value, key, {-1});
  }
}

void read_history(py::handle obj, std::size_t d, EngineSnapshot& s) {
  const py::dict h = checked_mapping(obj, "history",
                                     {"size", "next", "points", "gradients", "squared_distances",
                                      "squared_norms", "gradient_inner_products"});
  const auto cap = static_cast<py::ssize_t>(s.options.history);
  const auto columns = static_cast<py::ssize_t>(d);
  s.history_size = integer_value<std::uint64_t>(h["size"], "history['size']");
  s.history_next = integer_value<std::uint64_t>(h["next"], "history['next']");
  s.points = array_values<float>(h["points"], "history['points']", {-1, columns});
  s.gradients = array_values<float>(h["gradients"], "history['gradients']", {-1, columns});
  s.squared_distances =
      array_values<double>(h["squared_distances"], "history['squared_distances']", {cap, cap});
  s.squared_norms = array_values<double>(h["squared_norms"], "history['squared_norms']", {cap});
  s.gradient_gram = array_values<double>(h["gradient_inner_products"],
                                         "history['gradient_inner_products']", {cap, cap});
}

void read_round(py::handle obj, EngineSnapshot& s) {
  const py::dict r = checked_mapping(
      obj, "round",
      {"evaluations_per_point", "gradient_noise", "rounds_since_measured", "last_step_norm"},
      {"window_carried", "window_first_slot"});
  s.split_evaluations =
      integer_value<std::int32_t>(r["evaluations_per_point"], "round['evaluations_per_point']");
  s.split_noise = float_value(r["gradient_noise"], "round['gradient_noise']");
  s.split_rounds_since_measured =
      integer_value<std::int64_t>(r["rounds_since_measured"], "round['rounds_since_measured']");
  s.last_step_norm = float_value(r["last_step_norm"], "round['last_step_norm']");
  // The verified mode's window (absent before it existed: a fresh window).
  if (r.contains("window_carried")) {
    s.window_carried = integer_value<std::int32_t>(r["window_carried"], "round['window_carried']");
  }
  if (r.contains("window_first_slot")) {
    s.window_first_slot =
        integer_value<std::uint64_t>(r["window_first_slot"], "round['window_first_slot']");
  }
}

// ---- writing -------------------------------------------------------------------------

// A numpy array that owns `values` (no copy: they are the snapshot's own copy).
template <class T>
py::array owning_array(std::vector<T>&& values, std::vector<py::ssize_t> shape) {
  if (values.empty()) return py::array_t<T>(shape);
  auto* owned = new std::vector<T>(std::move(values));
  const py::capsule release(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(shape, owned->data(), release);
}

py::dict range_dict(const OptimizerRange& range) {
  const py::object optimizer = optimizer_to_python(range.optimizer);
  py::dict out;
  out["size"] = range.size;
  out["kind"] = py::type::of(optimizer).attr("__name__");
  out["step_offset"] = range.step_offset;
  for (py::handle name : optimizer.attr("hyperparameters")) {
    out[name] = optimizer.attr(name.cast<std::string>().c_str());
  }
  return out;
}

}  // namespace

py::dict state_arrays(EngineSnapshot s, bool with_history) {
  const auto d = static_cast<py::ssize_t>(s.iterate.size());
  const auto cap = static_cast<py::ssize_t>(s.options.history);
  py::dict out;
  out["format"] = kStateArraysFormat;
  out["options"] = options_to_dict(s.options);
  py::list ranges;
  for (const OptimizerRange& range : s.optimizer.ranges()) ranges.append(range_dict(range));
  out["optimizer"] = ranges;
  out["x"] = owning_array(std::move(s.iterate), {d});
  out["step"] = s.state.step;
  py::dict slots;
  for (int j = 0; j < kMaxStateSlots; ++j) {
    std::vector<float>& slot = s.state.slots[static_cast<std::size_t>(j)];
    if (!slot.empty()) {
      slots[slot_name(s.optimizer.front(), j).c_str()] = owning_array(std::move(slot), {d});
    }
  }
  out["slots"] = slots;
  out["lengthscale"] = s.lengthscale;
  out["rng"] = s.rng;
  out["iteration"] = s.iteration;
  out["evaluations"] = s.evaluations;
  if (with_history) {
    const auto size = static_cast<py::ssize_t>(s.history_size);
    py::dict h;
    h["size"] = s.history_size;
    h["next"] = s.history_next;
    h["points"] = owning_array(std::move(s.points), {size, d});
    h["gradients"] = owning_array(std::move(s.gradients), {size, d});
    h["squared_distances"] = owning_array(std::move(s.squared_distances), {cap, cap});
    h["squared_norms"] = owning_array(std::move(s.squared_norms), {cap});
    h["gradient_inner_products"] = owning_array(std::move(s.gradient_gram), {cap, cap});
    out["history"] = h;
  }
  py::dict round;
  round["evaluations_per_point"] = s.split_evaluations;
  round["gradient_noise"] = s.split_noise;
  round["rounds_since_measured"] = s.split_rounds_since_measured;
  round["last_step_norm"] = s.last_step_norm;
  round["window_carried"] = s.window_carried;
  round["window_first_slot"] = s.window_first_slot;
  out["round"] = round;
  return out;
}

EngineSnapshot snapshot_from_arrays(py::handle state) {
  const py::dict top = checked_mapping(state, "",
                                       {"format", "options", "optimizer", "x", "step", "slots",
                                        "lengthscale", "rng", "iteration", "evaluations", "round"},
                                       {"history"});
  const auto format = integer_value<std::int64_t>(top["format"], "format");
  if (format != kStateArraysFormat) {
    throw std::invalid_argument("format: " + std::to_string(format) +
                                " is not a layout this build reads (it reads " +
                                std::to_string(kStateArraysFormat) + ")");
  }
  EngineSnapshot s;
  s.options = options_from_dict(top["options"], "options");
  s.optimizer = ranges_from_list(top["optimizer"], "optimizer");
  s.iterate = array_values<float>(top["x"], "x", {-1});
  const std::size_t d = s.iterate.size();
  s.state.step = integer_value<std::int64_t>(top["step"], "step");
  read_slots(top["slots"], s);
  s.lengthscale = float_value(top["lengthscale"], "lengthscale");
  s.rng = integer_value<std::uint64_t>(top["rng"], "rng");
  s.iteration = integer_value<std::int64_t>(top["iteration"], "iteration");
  s.evaluations = integer_value<std::int64_t>(top["evaluations"], "evaluations");
  if (top.contains("history")) {
    read_history(top["history"], d, s);
  } else {
    s.forget_history();
  }
  read_round(top["round"], s);
  return s;
}

std::string state_key(const InvalidSnapshot& refusal, const Optimizer& kind) {
  switch (refusal.field()) {
    case SnapshotField::options:
      return "options";
    case SnapshotField::optimizer:
      return "optimizer";
    case SnapshotField::step_offset:
      return "optimizer[" + std::to_string(refusal.index()) + "]['step_offset']";
    case SnapshotField::iterate:
      return "x";
    case SnapshotField::step:
      return "step";
    case SnapshotField::slot:
      return child("slots", slot_name(kind, refusal.index()));
    case SnapshotField::lengthscale:
      return "lengthscale";
    case SnapshotField::iteration:
      return "iteration";
    case SnapshotField::evaluations:
      return "evaluations";
    case SnapshotField::history_size:
      return "history['size']";
    case SnapshotField::history_next:
      return "history['next']";
    case SnapshotField::points:
      return "history['points']";
    case SnapshotField::gradients:
      return "history['gradients']";
    case SnapshotField::squared_distances:
      return "history['squared_distances']";
    case SnapshotField::squared_norms:
      return "history['squared_norms']";
    case SnapshotField::gradient_gram:
      return "history['gradient_inner_products']";
    case SnapshotField::adaptive_split:
      return "round";
    case SnapshotField::last_step_norm:
      return "round['last_step_norm']";
    case SnapshotField::window:
      return "round['window_carried']";
  }
  return "state";
}

}  // namespace optex::python

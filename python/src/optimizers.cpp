#include "optimizers.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "bindings.hpp"

namespace optex::python {
namespace {

// The Python class I of optimizer kind O, as a C++ type of its own (pybind11
// registers each C++ type once; AdamW is an Adam whose decoupled flag is fixed).
template <class O, std::size_t I>
struct PythonOptimizer : O {
  PythonOptimizer() : O(O::python_classes()[I].defaults) {}
  explicit PythonOptimizer(const O& o) : O(o) {}
};

template <class Field>
constexpr bool is_flag = std::is_same_v<typename Field::value_type, bool>;

// A Python value for a hyperparameter: a real number (bool refused) or a bool.
template <class Field>
typename Field::value_type field_value(const Field& field, py::handle value) {
  const std::string name(field.name);
  if constexpr (is_flag<Field>) {
    // A Python bool or a numpy bool; anything else (1, "yes", None) is refused.
    const py::object numpy_bool = py::module_::import("numpy").attr("bool_");
    if (!py::isinstance<py::bool_>(value) && !py::isinstance(value, numpy_bool)) {
      throw py::type_error(
          name + ": expected a bool, got " +
          py::str(py::type::of(value).attr("__name__")).template cast<std::string>());
    }
    return py::bool_(py::reinterpret_borrow<py::object>(value)).template cast<bool>();
  } else {
    if (py::isinstance<py::bool_>(value) ||
        !py::isinstance(value, py::module_::import("numbers").attr("Real"))) {
      throw py::type_error(
          name + ": expected a real number, got " +
          py::str(py::type::of(value).attr("__name__")).template cast<std::string>());
    }
    return value.cast<double>();
  }
}

// Calls f(field) for every hyperparameter a Python class shows.
template <class O, class F>
void for_each_python_field(F&& f) {
  detail::for_each_hyperparameter<O>([&](const auto& field) {
    if (field.in_python) f(field);
  });
}

template <class O>
O validated(O value) {
  value.validate();
  return value;
}

// "Adam(lr=0.001, beta1=0.9, ...)".
template <class O>
std::string repr_of(std::string_view class_name, const O& o) {
  std::string out = std::string(class_name) + "(";
  bool first = true;
  for_each_python_field<O>([&](const auto& field) {
    out += first ? "" : ", ";
    first = false;
    out += std::string(field.name) + "=" +
           py::repr(py::cast(o.*field.member)).template cast<std::string>();
  });
  return out + ")";
}

// "__init__(self, lr: float = 0.001, ...) -> None", the signature help() shows.
template <class O>
std::string init_signature(const O& defaults) {
  std::string out = "__init__(self";
  for_each_python_field<O>([&](const auto& field) {
    using Field = std::decay_t<decltype(field)>;
    out += ", " + std::string(field.name) + ": " + (is_flag<Field> ? "bool" : "float") + " = " +
           py::repr(py::cast(defaults.*field.member)).template cast<std::string>();
  });
  return out + ") -> None";
}

// A tuple aligned with OptimizerState.slots: the name of each slot of `kept`
// that kind O names (its slot_names, torch.optim's state keys), None elsewhere.
template <class O>
py::tuple slot_names_of(StateSlots kept) {
  py::list names;
  for (std::size_t j = 0; j < static_cast<std::size_t>(kMaxStateSlots); ++j) {
    if (j < O::slot_names.size() && kept.uses(static_cast<int>(j))) {
      names.append(std::string(O::slot_names[j]));
    } else {
      names.append(py::none());
    }
  }
  return py::tuple(names);
}

template <class O, std::size_t I>
void register_class(py::module_& m, py::list& classes) {
  using Py = PythonOptimizer<O, I>;
  const PythonClass<O> info = O::python_classes()[I];
  const std::string name(info.name);
  const std::string doc = std::string(info.doc) +
                          "\n\nA value type: attributes can be read and set, and every setting "
                          "is validated (ValueError names the parameter and the value).\n";
  py::class_<Py> cls(m, name.c_str(), py::is_final(), doc.c_str());
  exported_from(cls, "optex");

  {
    py::options written_signatures;
    written_signatures.disable_function_signatures();
    const std::string init_doc =
        init_signature(info.defaults) +
        "\n\nPositional arguments follow the order above. Raises ValueError for a value "
        "outside its range (each attribute's documentation says which), TypeError for an "
        "unknown keyword or a value of the wrong type.";
    cls.def(py::init([name](const py::args& args, const py::kwargs& kwargs) {
              Py value;
              std::vector<std::string> order;
              for_each_python_field<O>([&](const auto& field) { order.emplace_back(field.name); });
              if (args.size() > order.size()) {
                throw py::type_error(name + "() takes at most " + std::to_string(order.size()) +
                                     " positional arguments, got " + std::to_string(args.size()));
              }
              std::vector<bool> given(order.size(), false);
              std::size_t index = 0;
              for_each_python_field<O>([&](const auto& field) {
                if (index < args.size()) {
                  value.*field.member = field_value(field, args[index]);
                  given[index] = true;
                }
                ++index;
              });
              for (const auto& [key, item] : kwargs) {
                const auto key_name = py::str(key).template cast<std::string>();
                bool known = false;
                index = 0;
                for_each_python_field<O>([&](const auto& field) {
                  if (field.name == key_name) {
                    if (given[index]) {
                      throw py::type_error(name + "() got multiple values for argument '" +
                                           key_name + "'");
                    }
                    value.*field.member = field_value(field, item);
                    known = true;
                  }
                  ++index;
                });
                if (!known) {
                  throw py::type_error(name + "() got an unexpected keyword argument '" + key_name +
                                       "'");
                }
              }
              value.validate();
              return value;
            }),
            init_doc.c_str());
  }

  for_each_python_field<O>([&](const auto& field) {
    using Field = std::decay_t<decltype(field)>;
    const auto member = field.member;
    cls.def_property(
        std::string(field.name).c_str(), [member](const Py& self) { return self.*member; },
        [field](Py& self, py::handle v) {
          Py changed = self;
          changed.*field.member = field_value(field, v);
          changed.validate();  // the object is unchanged when the value is refused
          self = changed;
        },
        std::string(field.doc).c_str());
    (void)sizeof(Field);
  });

  cls.def("__repr__", [name](const Py& self) { return repr_of<O>(name, self); });
  cls.def(
      "__eq__", [](const Py& a, const Py& b) { return static_cast<const O&>(a) == b; },
      py::is_operator());
  cls.def(py::pickle(
      [](const Py& self) {
        py::list values;
        for_each_python_field<O>([&](const auto& field) { values.append(self.*field.member); });
        return py::tuple(values);
      },
      [name](const py::tuple& state) {
        Py value;
        std::size_t index = 0;
        for_each_python_field<O>([&](const auto& field) {
          if (index < state.size()) value.*field.member = field_value(field, state[index]);
          ++index;
        });
        if (index != state.size()) {
          throw std::invalid_argument("pickle: the state of a " + name + " has " +
                                      std::to_string(state.size()) + " values, expected " +
                                      std::to_string(index));
        }
        return Py(validated<O>(value));
      }));

  py::tuple names(0);
  {
    py::list list;
    for_each_python_field<O>([&](const auto& field) { list.append(std::string(field.name)); });
    names = py::tuple(list);
  }
  cls.attr("hyperparameters") = names;
  cls.attr("kind") = std::string(O::name);
  cls.attr("state_slot_names") = slot_names_of<O>(StateSlots{(1u << kMaxStateSlots) - 1u});
  cls.def_property_readonly(
      "state_slots", [](const Py& self) { return slot_names_of<O>(self.state_slots()); },
      "The state slots these values keep, aligned with OptimizerState.slots: each slot's name "
      "(torch.optim's state key) where kept, None elsewhere (SGD keeps its momentum_buffer only "
      "with momentum).");
  classes.append(cls);
}

template <class O>
void register_kind(py::module_& m, py::list& classes) {
  [&]<std::size_t... I>(std::index_sequence<I...>) { (register_class<O, I>(m, classes), ...); }
  (std::make_index_sequence<O::python_classes().size()>{});
}

// Whether `obj` is an instance of Python class I of kind O; then its value.
template <class O, std::size_t I>
bool cast_if(py::handle obj, std::optional<Optimizer>& out) {
  if (out || !py::isinstance<PythonOptimizer<O, I>>(obj)) return false;
  out = Optimizer(static_cast<const O&>(obj.cast<const PythonOptimizer<O, I>&>()));
  return true;
}

// The Python class of `o`: the first one whose hidden fields (those the class
// fixes, like AdamW's decoupled flag) hold o's values.
template <class O, std::size_t I>
bool to_python_if(const O& o, py::object& out) {
  if (out) return false;
  const O defaults = O::python_classes()[I].defaults;  // a copy: the array is a temporary
  bool matches = true;
  detail::for_each_hyperparameter<O>([&](const auto& field) {
    if (!field.in_python) matches = matches && (o.*field.member == defaults.*field.member);
  });
  if (matches) out = py::cast(PythonOptimizer<O, I>(o));
  return matches;
}

// "optex.Sgd, optex.Adam, ... or optex.Lion".
std::string class_names() {
  std::vector<std::string> names;
  for_each_optimizer_kind([&](auto kind) {
    using O = typename decltype(kind)::type;
    for (const auto& cls : O::python_classes()) names.push_back("optex." + std::string(cls.name));
  });
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : (i + 1 == names.size() ? " or " : ", ")) + names[i];
  return out;
}

}  // namespace

void register_optimizers(py::module_& m) {
  py::list classes;
  for_each_optimizer_kind(
      [&](auto kind) { register_kind<typename decltype(kind)::type>(m, classes); });
  m.attr("_optimizer_classes") = py::tuple(classes);
  m.def(
      "optimizer_classes",
      // A py::tuple, not the attribute accessor: help() shows "-> tuple".
      [m]() -> py::tuple { return m.attr("_optimizer_classes"); },
      "The base optimizer classes (optex.Sgd, optex.Adam, ...), in a fixed order. Each has\n"
      "`hyperparameters` (the names of its attributes, in constructor order), `kind`\n"
      "(the engine's optimizer kind: 'adam' for Adam and AdamW) and `state_slot_names`\n"
      "(the names of the state slots it may keep, aligned with OptimizerState.slots, None\n"
      "for a slot index it never uses); an instance's `state_slots` names those its values\n"
      "keep.");
}

Optimizer optimizer_from_python(py::handle obj, const char* param) {
  std::optional<Optimizer> found;
  for_each_optimizer_kind([&](auto kind) {
    using O = typename decltype(kind)::type;
    [&]<std::size_t... I>(std::index_sequence<I...>) { (cast_if<O, I>(obj, found), ...); }
    (std::make_index_sequence<O::python_classes().size()>{});
  });
  if (!found) {
    throw py::type_error(std::string(param) + ": expected " + class_names() + ", got " +
                         py::str(py::type::of(obj).attr("__name__")).cast<std::string>());
  }
  return *found;
}

py::object optimizer_to_python(const Optimizer& optimizer) {
  return std::visit(
      [](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        py::object out;
        [&]<std::size_t... I>(std::index_sequence<I...>) { (to_python_if<O, I>(o, out), ...); }
        (std::make_index_sequence<O::python_classes().size()>{});
        if (!out) throw std::logic_error("optex: an optimizer value without a Python class");
        return out;
      },
      optimizer);
}

namespace {

// A whole number of a range: an int (bool refused, TypeError), at least
// `minimum` and at most `maximum` (ValueError naming `where` and `what`).
long long range_integer(py::handle value, const std::string& where, const char* what,
                        long long minimum, const char* too_large) {
  if (py::isinstance<py::bool_>(value) || !PyIndex_Check(value.ptr())) {
    throw py::type_error(where + ": the " + what + " must be an int, got " +
                         py::repr(value).cast<std::string>());
  }
  const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow > 0) {
    throw std::invalid_argument(where + ": the " + what + " " +
                                py::repr(value).cast<std::string>() + " is " + too_large);
  }
  if (overflow < 0 || v < minimum) {
    throw std::invalid_argument(where + ": the " + what + " must be >= " + std::to_string(minimum) +
                                ", got " + py::repr(value).cast<std::string>());
  }
  return v;
}

}  // namespace

OptimizerRanges ranges_from_python(py::handle obj, const char* param) {
  if (!py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj)) {
    return OptimizerRanges(optimizer_from_python(obj, param));
  }
  const std::string name(param);
  std::vector<OptimizerRange> ranges;
  std::size_t r = 0;
  for (py::handle item : obj) {
    const std::string where = name + "[" + std::to_string(r) + "]";
    if ((!py::isinstance<py::list>(item) && !py::isinstance<py::tuple>(item)) ||
        (py::len(item) != 2 && py::len(item) != 3)) {
      throw py::type_error(where +
                           ": expected a (size, optimizer) pair or a (size, optimizer, "
                           "step_offset) triple, got " +
                           py::repr(item).cast<std::string>());
    }
    const long long size =
        range_integer(item[py::int_(0)], where, "size", 1, "larger than any dimension");
    const std::int64_t step_offset = py::len(item) == 3
                                         ? range_integer(item[py::int_(2)], where, "step_offset", 0,
                                                         "larger than any step count")
                                         : 0;
    ranges.push_back({static_cast<std::size_t>(size),
                      optimizer_from_python(item[py::int_(1)], (where + "'s optimizer").c_str()),
                      step_offset});
    ++r;
  }
  return OptimizerRanges(std::move(ranges));
}

py::object ranges_to_python(const OptimizerRanges& ranges) {
  const bool offsets = std::any_of(ranges.ranges().begin(), ranges.ranges().end(),
                                   [](const OptimizerRange& r) { return r.step_offset != 0; });
  if (ranges.count() == 1 && !offsets) return optimizer_to_python(ranges.front());
  py::list out;
  for (const OptimizerRange& range : ranges.ranges()) {
    if (offsets) {
      out.append(
          py::make_tuple(range.size, optimizer_to_python(range.optimizer), range.step_offset));
    } else {
      out.append(py::make_tuple(range.size, optimizer_to_python(range.optimizer)));
    }
  }
  return out;
}

}  // namespace optex::python

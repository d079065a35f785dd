#include "options.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "bindings.hpp"
#include "names.hpp"

namespace optex::python {
namespace {

std::string type_name(py::handle value) {
  return py::str(py::type::of(value).attr("__name__")).cast<std::string>();
}

// An integer for a message: its digits, or its size where Python refuses to
// print that many digits (sys.set_int_max_str_digits).
std::string integer_text(py::handle value) {
  const auto text = py::reinterpret_steal<py::object>(PyObject_Str(value.ptr()));
  if (text) return text.cast<std::string>();
  PyErr_Clear();
  const auto index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  return "an int of " + py::str(index.attr("bit_length")()).cast<std::string>() + " bits";
}

// Python ints (and numpy integers, through __index__); bool and float are
// refused, as Python's own int-only arguments refuse them.
long long to_integer(py::handle value, const char* name) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr())) {
    throw py::type_error(std::string(name) + ": expected an int, got " + type_name(value));
  }
  const auto index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0) {
    throw std::invalid_argument(std::string(name) + ": " + integer_text(index) +
                                " is out of range");
  }
  return v;
}

int to_int(py::handle value, const char* name) {
  const long long v = to_integer(value, name);
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    throw std::invalid_argument(std::string(name) + ": " + std::to_string(v) + " is out of range");
  }
  return static_cast<int>(v);
}

double to_double(py::handle value, const char* name) {
  if (py::isinstance<py::str>(value) || py::isinstance<py::bytes>(value) ||
      !(PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr()) ||
        py::hasattr(value, "__float__"))) {
    throw py::type_error(std::string(name) + ": expected a float, got " + type_name(value));
  }
  const double v = PyFloat_AsDouble(value.ptr());
  if (v == -1.0 && PyErr_Occurred()) {
    // An int beyond the double range: refused with the field's name, as to_int does.
    if (PyErr_ExceptionMatches(PyExc_OverflowError) && PyLong_Check(value.ptr())) {
      PyErr_Clear();
      throw std::invalid_argument(std::string(name) + ": " + integer_text(value) +
                                  " is out of range");
    }
    throw py::error_already_set();
  }
  return v;
}

std::string to_string(py::handle value, const char* name) {
  if (!py::isinstance<py::str>(value)) {
    throw py::type_error(std::string(name) + ": expected a str, got " + type_name(value));
  }
  return value.cast<std::string>();
}

std::uint64_t to_seed(py::handle value, const char* name) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr())) {
    throw py::type_error(std::string(name) + ": expected an int, got " + type_name(value));
  }
  const auto index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  const unsigned long long v = PyLong_AsUnsignedLongLong(index.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw std::invalid_argument(std::string(name) + ": must be an integer in [0, 2**64), got " +
                                py::str(value).cast<std::string>());
  }
  return static_cast<std::uint64_t>(v);
}

std::vector<double> to_double_list(py::handle value, const char* name) {
  if (py::isinstance<py::str>(value) || !py::hasattr(value, "__iter__")) {
    throw py::type_error(std::string(name) + ": expected a sequence of floats, got " +
                         type_name(value));
  }
  std::vector<double> out;
  for (const py::handle item : value) out.push_back(to_double(item, name));
  return out;
}

template <class E>
E to_enum(py::handle value, const char* name) {
  return parse_name<E>(name, to_string(value, name));
}

// Every field of optex::Options, in declaration order: the one list that
// __init__'s keywords, the attributes, repr, equality and pickling share.
struct Field {
  const char* name;
  const char* type;  // for the generated signature of Options(...)
  py::object (*get)(const Options&);
  void (*set)(Options&, py::handle);
  const char* doc;
};

const std::array<Field, 24> kFields{{
    {"parallelism", "int", [](const Options& o) -> py::object { return py::int_(o.parallelism); },
     [](Options& o, py::handle v) { o.parallelism = to_int(v, "parallelism"); },
     "N: points evaluated per iteration, one per worker, in [1, 65536]."},
    {"history", "int", [](const Options& o) -> py::object { return py::int_(o.history); },
     [](Options& o, py::handle v) { o.history = to_int(v, "history"); },
     "T0: how many (point, gradient) pairs the estimator keeps, in [1, 4096]."},
    {"kernel", "str", [](const Options& o) -> py::object { return py::str(name_of(o.kernel)); },
     [](Options& o, py::handle v) { o.kernel = to_enum<Covariance>(v, "kernel"); },
     "Covariance function (GP kernel): 'matern12', 'matern32', 'matern52' or 'rbf'."},
    {"lengthscale", "float",
     [](const Options& o) -> py::object { return py::float_(o.lengthscale); },
     [](Options& o, py::handle v) { o.lengthscale = to_double(v, "lengthscale"); },
     "Lengthscale of the covariance in the units of the scaled inputs (> 0); the starting value "
     "when "
     "lengthscale_selection is not 'fixed'."},
    {"noise", "float", [](const Options& o) -> py::object { return py::float_(o.noise); },
     [](Options& o, py::handle v) { o.noise = to_double(v, "noise"); },
     "sigma^2 added to the Gram matrix diagonal (>= 0)."},
    {"input_scaling", "str",
     [](const Options& o) -> py::object { return py::str(name_of(o.input_scaling)); },
     [](Options& o, py::handle v) { o.input_scaling = to_enum<InputScaling>(v, "input_scaling"); },
     "How points are scaled before the kernel sees them: 'none' or 'reference_mean_sqrt_norm' "
     "(the authors' code: divide by the mean over history of sqrt(||x_j||))."},
    {"warmup", "str", [](const Options& o) -> py::object { return py::str(name_of(o.warmup)); },
     [](Options& o, py::handle v) { o.warmup = to_enum<Warmup>(v, "warmup"); },
     "What the proxy steps do while the history holds fewer than two points: 'zero_gradient' "
     "(the reference) or 'last_gradient'."},
    {"lengthscale_selection", "str",
     [](const Options& o) -> py::object { return py::str(name_of(o.lengthscale_selection)); },
     [](Options& o, py::handle v) {
       o.lengthscale_selection = to_enum<LengthscaleSelection>(v, "lengthscale_selection");
     },
     "How the lengthscale is chosen: 'fixed', 'leave_one_out' or 'marginal_likelihood'."},
    {"selection_interval", "int",
     [](const Options& o) -> py::object { return py::int_(o.selection_interval); },
     [](Options& o, py::handle v) { o.selection_interval = to_int(v, "selection_interval"); },
     "Re-select the lengthscale every this many iterations (>= 1)."},
    {"lengthscale_grid", "Sequence[float]",
     [](const Options& o) -> py::object { return py::tuple(py::cast(o.lengthscale_grid)); },
     [](Options& o, py::handle v) { o.lengthscale_grid = to_double_list(v, "lengthscale_grid"); },
     "Candidate lengthscales as multiples of the median pairwise history distance (each > 0); "
     "empty means the built-in grid."},
    {"proxy", "str", [](const Options& o) -> py::object { return py::str(name_of(o.proxy)); },
     [](Options& o, py::handle v) { o.proxy = to_enum<Proxy>(v, "proxy"); },
     "What the proxy steps use as the gradient: 'gp' (OptEx), 'target' (true gradients from "
     "the gradient oracle: the upper bound) or 'last_gradient' (an ablation)."},
    {"proxy_distances", "str",
     [](const Options& o) -> py::object { return py::str(name_of(o.proxy_distances)); },
     [](Options& o, py::handle v) {
       o.proxy_distances = to_enum<ProxyDistances>(v, "proxy_distances");
     },
     "How the GP proxy steps find their squared distances to the history: 'direct' (one pass "
     "over the history's points per proxy step: the reference) or 'coefficients' (from "
     "products taken once a round, no pass per step). 'coefficients' applies to SGD (momentum, "
     "Nesterov, weight decay) on a whole (unsharded) engine with one optimizer range; elsewhere "
     "the engine uses 'direct'. The trajectories agree to fp32 rounding."},
    {"seed", "int", [](const Options& o) -> py::object { return py::int_(o.seed); },
     [](Options& o, py::handle v) { o.seed = to_seed(v, "seed"); },
     "Drives the per-point seeds handed to stochastic objectives, in [0, 2**64)."},
    {"evaluations_per_point", "int",
     [](const Options& o) -> py::object { return py::int_(o.evaluations_per_point); },
     [](Options& o, py::handle v) { o.evaluations_per_point = to_int(v, "evaluations_per_point"); },
     "D: how many of a round's N evaluations each point gets, each with its own seed; the round "
     "evaluates N / D distinct points (batch row r belongs to point r // D) and a point's "
     "gradient and loss are the means of its evaluations. 1 is OptEx, N is N x minibatch. Must "
     "divide parallelism."},
    {"strategy", "str", [](const Options& o) -> py::object { return py::str(name_of(o.strategy)); },
     [](Options& o, py::handle v) { o.strategy = to_enum<Strategy>(v, "strategy"); },
     "How each round's N evaluations are split into points: 'fixed' (N / evaluations_per_point "
     "points every round) or 'adaptive' (chosen each round from the measured gradient noise, "
     "starting from evaluations_per_point)."},
    {"continue_from", "str",
     [](const Options& o) -> py::object { return py::str(name_of(o.continue_from)); },
     [](Options& o, py::handle v) { o.continue_from = to_enum<ContinueFrom>(v, "continue_from"); },
     "Which point the commit steps from: 'last' (the last admissible point: OptEx) or "
     "'best_loss' (the admissible point with the lowest loss)."},
    {"max_posterior_variance", "float",
     [](const Options& o) -> py::object { return py::float_(o.max_posterior_variance); },
     [](Options& o, py::handle v) {
       o.max_posterior_variance = to_double(v, "max_posterior_variance");
     },
     "Stop the proxy chain at a point whose GP posterior variance, in units of the prior "
     "variance, is above this (> 0; inf: off)."},
    {"trust_region", "float",
     [](const Options& o) -> py::object { return py::float_(o.trust_region); },
     [](Options& o, py::handle v) { o.trust_region = to_double(v, "trust_region"); },
     "Stop the proxy chain at point i once it lies farther from the iterate than trust_region * "
     "i * (length of the last committed step) (> 0; inf: off)."},
    {"max_lengthscale_change", "float",
     [](const Options& o) -> py::object { return py::float_(o.max_lengthscale_change); },
     [](Options& o, py::handle v) {
       o.max_lengthscale_change = to_double(v, "max_lengthscale_change");
     },
     "The factor by which a lengthscale selection may change the lengthscale at most, up or "
     "down (>= 1; inf: off)."},
    {"mode", "str", [](const Options& o) -> py::object { return py::str(name_of(o.mode)); },
     [](Options& o, py::handle v) { o.mode = to_enum<Mode>(v, "mode"); },
     "'approximate' (OptEx: the commit uses predicted gradients) or 'verified' (the base "
     "optimizer's own trajectory: the commit replays it through the round's guesses with their "
     "true gradients and keeps the steps whose guess agreed within tolerance)."},
    {"tolerance", "float", [](const Options& o) -> py::object { return py::float_(o.tolerance); },
     [](Options& o, py::handle v) { o.tolerance = to_double(v, "tolerance"); },
     "Verified mode: a guess is accepted where ||guess - replayed|| <= tolerance * ||replayed|| "
     "(finite, >= 0; 0: bit for bit the sequential run)."},
    {"device", "str", [](const Options& o) -> py::object { return py::str(o.device.name()); },
     [](Options& o, py::handle v) { o.device = parse_device("device", to_string(v, "device")); },
     "Where the iterate, optimizer state, history and batch rows live: 'cpu', 'cuda' or "
     "'cuda:<index>' (read back as 'cpu' or 'cuda:<index>')."},
    {"threads", "int", [](const Options& o) -> py::object { return py::int_(o.threads); },
     [](Options& o, py::handle v) { o.threads = to_int(v, "threads"); },
     "Threads for the CPU's passes over d-vectors (proxy steps, history update, commit "
     "statistics), in [0, 1024]; 0: every core this process may run on. Results are the same "
     "bit for bit for every value; checkpoints do not store it (OptEx.set_threads changes it)."},
    {"history_precision", "str",
     [](const Options& o) -> py::object { return py::str(name_of(o.history_precision)); },
     [](Options& o, py::handle v) {
       o.history_precision = to_enum<Precision>(v, "history_precision");
     },
     "Storage of the history on a CUDA device: 'fp32', 'bf16' or 'bf16_gradients'."},
}};

py::dict state_of(const Options& o) {
  py::dict state;
  for (const Field& f : kFields) state[f.name] = f.get(o);
  return state;
}

Options options_from_state(const py::dict& state) {
  Options o;
  for (const auto& [key, value] : state) {
    const auto name = key.cast<std::string>();
    if (!set_option_field(o, name, value)) {
      throw std::invalid_argument("Options: no field named '" + name + "'");
    }
  }
  o.validate();
  return o;
}

}  // namespace

py::dict options_to_dict(const Options& options) {
  py::dict out = state_of(options);
  out["lengthscale_grid"] = py::list(out["lengthscale_grid"]);
  return out;
}

Options options_from_dict(py::handle dict, const std::string& name) {
  if (!py::isinstance<py::dict>(dict)) {
    throw std::invalid_argument(name + ": expected a dict of Options fields, got " +
                                type_name(dict));
  }
  const auto fields = py::reinterpret_borrow<py::dict>(dict);
  for (const auto& [key, value] : fields) {
    const bool known = py::isinstance<py::str>(key) &&
                       std::any_of(kFields.begin(), kFields.end(), [&](const Field& f) {
                         return key.cast<std::string>() == f.name;
                       });
    if (!known) {
      throw std::invalid_argument(name + ": unknown key " + py::repr(key).cast<std::string>() +
                                  " (not a field of optex.Options)");
    }
  }
  // Fields added after dicts were first saved: a dict saved before one existed
  // (a pickle, a torch state_dict) does not have it, and the run it describes
  // behaved as its default does.
  constexpr std::array<std::string_view, 1> kAddedLater{"proxy_distances"};
  Options o;
  for (const Field& f : kFields) {
    const std::string where = name + "['" + f.name + "']";
    if (!fields.contains(f.name)) {
      if (std::find(kAddedLater.begin(), kAddedLater.end(), f.name) != kAddedLater.end()) continue;
      throw std::invalid_argument(where + ": missing");
    }
    try {
      f.set(o, fields[f.name]);
    } catch (const py::type_error& e) {
      throw std::invalid_argument(where + ": " + e.what());
    } catch (const py::error_already_set& e) {
      throw std::invalid_argument(where + ": " + e.what());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(where + ": " + e.what());
    }
  }
  try {
    o.validate();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(name + ": " + e.what());
  }
  return o;
}

bool set_option_field(Options& options, const std::string& name, py::handle value) {
  for (const Field& f : kFields) {
    if (name == f.name) {
      f.set(options, value);
      return true;
    }
  }
  return false;
}

void register_options(py::module_& m) {
  py::class_<Options> cls(m, "Options", py::is_final(),
                          R"doc(Everything that configures an OptEx run besides the base optimizer.

The defaults are the C++ optex::Options{} (the library's tuned defaults);
Options.reference() gives the authors' reference semantics, Options.adaptive()
the robust configuration. Enumerations are strings: an unknown one raises
ValueError listing the valid ones. Attributes can be read and set; every change
is validated as a whole (ValueError names the field and its value) and a
refused change leaves the object as it was. To change fields that depend on
each other (device and history_precision, parallelism and
evaluations_per_point), build a new Options with both keywords.
)doc");
  exported_from(cls, "optex");
  {
    // Keywords only, each converted by its field's setter, so that Options(...)
    // and OptEx(x0, **fields) accept and refuse the same values with the same
    // messages. The signature is written out from the field table and the
    // C++ defaults instead of pybind11's generic (**kwargs).
    static const std::string doc = [] {
      const Options defaults;
      std::string signature = "__init__(self, *";
      for (const Field& f : kFields) {
        signature += std::string(", ") + f.name + ": " + f.type + " = " +
                     py::repr(f.get(defaults)).cast<std::string>();
      }
      return signature +
             ") -> None\n\nEvery argument is keyword-only; the defaults are the C++ "
             "optex::Options{}. Raises ValueError naming the first bad field, TypeError for a "
             "value of the wrong type or an unknown keyword.";
    }();
    py::options written_signature;
    written_signature.disable_function_signatures();
    cls.def(
        py::init([](const py::kwargs& fields) {
          Options o;
          for (const auto& [key, value] : fields) {
            const auto name = key.cast<std::string>();
            if (!set_option_field(o, name, value)) {
              throw py::type_error("Options() got an unexpected keyword argument '" + name + "'");
            }
          }
          o.validate();
          return o;
        }),
        doc.c_str());
  }
  for (const Field& f : kFields) {
    cls.def_property(
        f.name, [get = f.get](const Options& o) { return get(o); },
        [set = f.set](Options& o, py::handle value) {
          Options changed = o;
          set(changed, value);
          changed.validate();
          o = changed;
        },
        f.doc);
  }
  {
    // The field's own conversion: the same TypeError or ValueError as
    // Options(parallelism=...), raised here rather than at the first OptEx.
    py::options written_signature;
    written_signature.disable_function_signatures();
    cls.def_static(
        "reference",
        [](const py::object& parallelism) {
          return Options::reference(to_int(parallelism, "parallelism"));
        },
        // The C++ default argument of Options::reference.
        py::arg("parallelism") = 5,
        R"doc(reference(parallelism: int = 5) -> Options

The reference semantics of the authors' JAX code: Matern-5/2,
lengthscale 0.1 on inputs divided by the mean of sqrt(||x_j||), noise 1e-3,
history 50, a zero predicted gradient before two history points exist, no
lengthscale selection. A parallelism < 1 raises ValueError, a non-int TypeError,
both naming parallelism.
)doc");
  }
  {
    py::options written_signature;
    written_signature.disable_function_signatures();
    cls.def_static(
        "adaptive",
        [](const py::object& parallelism) {
          return Options::adaptive(to_int(parallelism, "parallelism"));
        },
        // The C++ default argument of Options::adaptive.
        py::arg("parallelism") = 4,
        R"doc(adaptive(parallelism: int = 4) -> Options

The robust configuration: Options() with strategy 'adaptive' (each round
splits its N evaluations into points from the gradient noise it measured),
continue_from 'best_loss' and max_lengthscale_change 10. A parallelism < 1
raises ValueError, a non-int TypeError, both naming parallelism.
)doc");
    cls.def_static(
        "verified",
        [](const py::object& parallelism, const py::object& tolerance) {
          return Options::verified(to_int(parallelism, "parallelism"),
                                   to_double(tolerance, "tolerance"));
        },
        // The C++ default arguments of Options::verified.
        py::arg("parallelism") = 8, py::arg("tolerance") = 0.0,
        R"doc(verified(parallelism: int = 8, tolerance: float = 0.0) -> Options

The verified mode: the base optimizer's own trajectory in fewer rounds. Each
round's points are guesses of the next iterates; the commit replays the base
optimizer through them with their true gradients and keeps the steps whose
guess agreed within tolerance (relative), at least one. At tolerance 0 every
committed iterate and state is the sequential run's bit for bit. The history
holds at least parallelism pairs. A bad parallelism or tolerance raises
ValueError naming it.
)doc");
  }
  cls.def("__repr__", [](const Options& o) {
    std::string out = "Options(";
    for (std::size_t i = 0; i < kFields.size(); ++i) {
      if (i > 0) out += ", ";
      out += std::string(kFields[i].name) + "=" + py::repr(kFields[i].get(o)).cast<std::string>();
    }
    return out + ")";
  });
  cls.def(
      "__eq__", [](const Options& a, const Options& b) { return state_of(a).equal(state_of(b)); },
      py::is_operator());
  cls.def(py::pickle([](const Options& o) { return state_of(o); },
                     [](const py::dict& state) { return options_from_state(state); }));
}

}  // namespace optex::python

#include "optimizers.hpp"

#include <string>
#include <variant>

#include "bindings.hpp"

namespace optex::python {
namespace {

// A hyperparameter as a read/write attribute. Setting it validates the whole
// optimizer (the C++ validate(), so ValueError names the parameter and value)
// and leaves the object unchanged when the value is refused.
template <class T, class Owner, class V>
void def_validated(py::class_<T>& cls, const char* name, V Owner::*member, const char* doc) {
  cls.def_property(
      name, [member](const T& self) { return self.*member; },
      [member](T& self, V value) {
        T changed = self;
        changed.*member = value;
        changed.validate();
        self = changed;
      },
      doc);
}

template <class T>
T validated(T value) {
  value.validate();
  return value;
}

void register_sgd(py::module_& m) {
  const Sgd defaults;
  py::class_<Sgd> cls(
      m, "Sgd", py::is_final(),
      R"doc(Stochastic gradient descent with torch.optim.SGD semantics (dampening 0).

With momentum, the buffer starts as the first gradient (PyTorch), and
nesterov=True uses Nesterov momentum. weight_decay adds weight_decay * x to the
gradient (coupled L2). A value type: attributes can be read and set, and every
setting is validated (ValueError names the parameter and the value).
)doc");
  exported_from(cls, "optex");
  cls.def(
      py::init([](double lr, double momentum, bool nesterov, double weight_decay) {
        return validated(Sgd{
            .lr = lr, .momentum = momentum, .nesterov = nesterov, .weight_decay = weight_decay});
      }),
      py::arg("lr") = defaults.lr, py::arg("momentum") = defaults.momentum,
      py::arg("nesterov") = defaults.nesterov, py::arg("weight_decay") = defaults.weight_decay,
      "Raises ValueError for lr <= 0, momentum outside [0, 1), weight_decay < 0, or "
      "nesterov without momentum.");
  def_validated(cls, "lr", &Sgd::lr, "Learning rate (> 0).");
  def_validated(cls, "momentum", &Sgd::momentum, "Momentum factor in [0, 1).");
  def_validated(cls, "nesterov", &Sgd::nesterov, "Nesterov momentum (needs momentum > 0).");
  def_validated(cls, "weight_decay", &Sgd::weight_decay,
                "Coupled L2 weight decay (>= 0): adds weight_decay * x to the gradient.");
  cls.def("__repr__", [](const Sgd& s) {
    return py::str("Sgd(lr={!r}, momentum={!r}, nesterov={!r}, weight_decay={!r})")
        .format(s.lr, s.momentum, s.nesterov, s.weight_decay);
  });
  cls.def(
      "__eq__",
      [](const Sgd& a, const Sgd& b) {
        return a.lr == b.lr && a.momentum == b.momentum && a.nesterov == b.nesterov &&
               a.weight_decay == b.weight_decay;
      },
      py::is_operator());
  cls.def(py::pickle(
      [](const Sgd& s) { return py::make_tuple(s.lr, s.momentum, s.nesterov, s.weight_decay); },
      [](const py::tuple& t) {
        return validated(Sgd{.lr = t[0].cast<double>(),
                             .momentum = t[1].cast<double>(),
                             .nesterov = t[2].cast<bool>(),
                             .weight_decay = t[3].cast<double>()});
      }));
}

// Adam and AdamW share everything but the class, the defaults and the kind of
// weight decay.
template <class T>
void define_adam(py::class_<T>& cls, const T& defaults, const char* name,
                 const char* weight_decay_doc) {
  cls.def(py::init([](double lr, double beta1, double beta2, double eps, double weight_decay) {
            T a;
            a.lr = lr;
            a.beta1 = beta1;
            a.beta2 = beta2;
            a.eps = eps;
            a.weight_decay = weight_decay;
            return validated(a);
          }),
          py::arg("lr") = defaults.lr, py::arg("beta1") = defaults.beta1,
          py::arg("beta2") = defaults.beta2, py::arg("eps") = defaults.eps,
          py::arg("weight_decay") = defaults.weight_decay,
          "Raises ValueError for lr <= 0, beta1 or beta2 outside [0, 1), eps <= 0 or "
          "weight_decay < 0.");
  def_validated(cls, "lr", &Adam::lr, "Learning rate (> 0).");
  def_validated(cls, "beta1", &Adam::beta1, "Decay of the first moment, in [0, 1).");
  def_validated(cls, "beta2", &Adam::beta2, "Decay of the second moment, in [0, 1).");
  def_validated(cls, "eps", &Adam::eps, "Added to the denominator (> 0).");
  def_validated(cls, "weight_decay", &Adam::weight_decay, weight_decay_doc);
  const std::string format =
      std::string(name) + "(lr={!r}, beta1={!r}, beta2={!r}, eps={!r}, weight_decay={!r})";
  cls.def("__repr__", [format](const T& a) {
    return py::str(format).format(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay);
  });
  cls.def(
      "__eq__",
      [](const T& a, const T& b) {
        return a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
               a.weight_decay == b.weight_decay;
      },
      py::is_operator());
  cls.def(py::pickle(
      [](const T& a) { return py::make_tuple(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay); },
      [](const py::tuple& t) {
        T a;
        a.lr = t[0].cast<double>();
        a.beta1 = t[1].cast<double>();
        a.beta2 = t[2].cast<double>();
        a.eps = t[3].cast<double>();
        a.weight_decay = t[4].cast<double>();
        return validated(a);
      }));
}

void register_adam(py::module_& m) {
  py::class_<Adam> cls(
      m, "Adam", py::is_final(),
      R"doc(Adam with torch.optim.Adam semantics: bias-corrected moments, and weight_decay
as coupled L2 (added to the gradient). See AdamW for decoupled weight decay.

A value type: attributes can be read and set, and every setting is validated
(ValueError names the parameter and the value).
)doc");
  exported_from(cls, "optex");
  define_adam(cls, Adam{}, "Adam",
              "Coupled L2 weight decay (>= 0): adds weight_decay * x to the gradient.");
}

void register_adamw(py::module_& m) {
  py::class_<AdamW> cls(
      m, "AdamW", py::is_final(),
      R"doc(AdamW (Loshchilov and Hutter 2019) with torch.optim.AdamW semantics and
defaults: Adam whose weight decay is decoupled, x -= lr * weight_decay * x
before the Adam step (weight_decay 1e-2 by default).

A value type: attributes can be read and set, and every setting is validated
(ValueError names the parameter and the value; lr * weight_decay must be < 1).
)doc");
  exported_from(cls, "optex");
  define_adam(cls, AdamW{}, "AdamW",
              "Decoupled weight decay (>= 0, lr * weight_decay < 1): x -= lr * weight_decay * x "
              "before each step.");
}

}  // namespace

void register_optimizers(py::module_& m) {
  register_sgd(m);
  register_adam(m);
  register_adamw(m);
}

Optimizer optimizer_from_python(py::handle obj, const char* param) {
  if (py::isinstance<Sgd>(obj)) return obj.cast<Sgd>();
  if (py::isinstance<AdamW>(obj)) return Adam(obj.cast<AdamW>());
  if (py::isinstance<Adam>(obj)) return obj.cast<Adam>();
  throw py::type_error(std::string(param) +
                       ": expected optex.Sgd, optex.Adam or optex.AdamW, got " +
                       py::str(py::type::of(obj).attr("__name__")).cast<std::string>());
}

py::object optimizer_to_python(const Optimizer& optimizer) {
  if (const auto* sgd = std::get_if<Sgd>(&optimizer)) return py::cast(*sgd);
  const auto& adam = std::get<Adam>(optimizer);
  if (!adam.decoupled_weight_decay) return py::cast(adam);
  AdamW w;
  static_cast<Adam&>(w) = adam;
  return py::cast(w);
}

}  // namespace optex::python

// optex.problems: the shipped test problems, evaluated by the C++ code at one
// point (d,) or at a batch of points (B, d), rows looped in C++ with the GIL
// released.
#include <pybind11/numpy.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "arrays.hpp"
#include "bindings.hpp"
#include "problem.hpp"

namespace optex::python {
namespace {

// A problem class of its own for Python: Sphere(), Rosenbrock(), ...
template <class P>
struct Named : Problem {
  Named() : Problem(P{}) {}
};

// The wrappers keep the Python object they wrap, for `base`, repr and pickling.
struct RotatedProblem : Problem {
  RotatedProblem(const problems::Rotated<Problem>& r, py::object base_object)
      : Problem(r), rotated(r), base(std::move(base_object)) {}
  problems::Rotated<Problem> rotated;
  py::object base;
};

struct NoisyProblem : Problem {
  NoisyProblem(const problems::WithGradientNoise<Problem>& p, py::object base_object)
      : Problem(p), noisy(p), base(std::move(base_object)) {}
  problems::WithGradientNoise<Problem> noisy;
  py::object base;
};

// The points an evaluation reads: float32, C-contiguous, `rows` x `dim`.
struct Points {
  py::array_t<float> values;
  bool batch;  // given as (B, d) rather than (d,)
  std::size_t rows;
  std::size_t dim;
};

Points points_of(py::handle x) {
  const py::array a = float_array(x, "x");
  if (a.ndim() != 1 && a.ndim() != 2) {
    throw std::invalid_argument(
        "x: expected one point of shape (d,) or a batch of points of shape (B, d), got shape " +
        shape_string(a));
  }
  const bool batch = a.ndim() == 2;
  const auto rows = batch ? static_cast<std::size_t>(a.shape(0)) : std::size_t{1};
  const auto dim = static_cast<std::size_t>(a.shape(batch ? 1 : 0));
  const py::array contiguous = py::module_::import("numpy").attr("ascontiguousarray")(a);
  py::array_t<float> values;
  if (is_float32(contiguous)) {
    values = py::reinterpret_borrow<py::array_t<float>>(contiguous);
  } else {
    // The problems are defined on float32 points, as the engine's are.
    values = py::array_t<float>(contiguous.size());
    round_to_float32(values_of<double>(contiguous), {values.mutable_data(), rows * dim}, "x", 0,
                     false, "");
  }
  return {values, batch, rows, dim};
}

py::object loss_result(py::array_t<double>& losses, bool batch) {
  if (batch) return std::move(losses);
  return py::float_(losses.at(0));
}

py::object evaluate(const Problem& p, py::handle x) {
  const Points pts = points_of(x);
  py::array_t<double> losses(static_cast<py::ssize_t>(pts.rows));
  {
    const float* in = pts.values.data();
    double* out = losses.mutable_data();
    py::gil_scoped_release release;
    for (std::size_t r = 0; r < pts.rows; ++r) {
      out[r] = p.Evaluate({in + r * pts.dim, pts.dim});
    }
  }
  return loss_result(losses, pts.batch);
}

py::tuple value_and_grad(const Problem& p, py::handle x) {
  const Points pts = points_of(x);
  py::array_t<double> losses(static_cast<py::ssize_t>(pts.rows));
  py::array_t<float> grads({static_cast<py::ssize_t>(pts.rows), static_cast<py::ssize_t>(pts.dim)});
  {
    const float* in = pts.values.data();
    double* out = losses.mutable_data();
    float* g = grads.mutable_data();
    py::gil_scoped_release release;
    for (std::size_t r = 0; r < pts.rows; ++r) {
      out[r] = p.EvaluateWithGradient({in + r * pts.dim, pts.dim}, {g + r * pts.dim, pts.dim});
    }
  }
  if (pts.batch) return py::make_tuple(loss_result(losses, true), grads);
  return py::make_tuple(loss_result(losses, false),
                        grads.reshape({static_cast<py::ssize_t>(pts.dim)}));
}

// Dimensions come in as Python ints; a negative one gets the core's message
// rather than a TypeError about unsigned integers.
std::size_t dimension(long long d) {
  if (d < 0) {
    throw std::invalid_argument("d: dimension must be >= 1, got " + std::to_string(d));
  }
  return static_cast<std::size_t>(d);
}

py::array_t<float> to_array(const std::vector<float>& v) {
  py::array_t<float> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

std::string class_name(py::handle self) {
  return py::str(py::type::of(self).attr("__name__")).cast<std::string>();
}

void register_domain(py::module_& m) {
  using problems::Domain;
  py::class_<Domain> cls(m, "Domain", py::is_final(),
                         "The per-coordinate search box of a problem: every x_i in [lower, upper]. "
                         "Unpacks as lower, upper = domain.");
  exported_from(cls, "optex.problems");
  cls.def(py::init([](double lower, double upper) {
            return Domain{lower, upper};
          }),
          py::arg("lower"), py::arg("upper"));
  cls.def_readonly("lower", &Domain::lower);
  cls.def_readonly("upper", &Domain::upper);
  cls.def("contains", &Domain::contains, py::arg("v"), "lower <= v <= upper.");
  cls.def("__iter__", [](const Domain& d) { return py::iter(py::make_tuple(d.lower, d.upper)); });
  cls.def("__repr__", [](const Domain& d) {
    return py::str("Domain(lower={!r}, upper={!r})").format(d.lower, d.upper);
  });
  cls.def(
      "__eq__",
      [](const Domain& a, const Domain& b) { return a.lower == b.lower && a.upper == b.upper; },
      py::is_operator());
}

void register_problem_base(py::module_& m) {
  py::class_<Problem> cls(
      m, "Problem", R"doc(A test problem: f and its gradient at float32 points, computed by the C++
optex::problems code (bit for bit what a C++ program gets). The base class of
every problem here; not constructible itself.

Points are float32 (float64 input is rounded to float32 first, as the engine's
points are). One point x of shape (d,) gives a float loss and a (d,) float32
gradient; a batch of shape (B, d) gives a (B,) float64 array of losses and a
(B, d) float32 array of gradients.
)doc");
  exported_from(cls, "optex.problems");
  cls.def_property_readonly(
      "name", [](const Problem& p) { return std::string(p.name()); },
      "The problem's name ('sphere', 'rotated_rastrigin', ...).");
  cls.def_property_readonly("domain", &Problem::domain,
                            "The usual search box, an optex.problems.Domain.");
  cls.def("__call__", &evaluate, py::arg("x"),
          "f(x): a float for one point (d,), a float64 (B,) array for a batch (B, d).");
  cls.def("value_and_grad", &value_and_grad, py::arg("x"),
          "(f(x), grad f(x)): (float, float32 (d,)) for one point, (float64 (B,), float32 "
          "(B, d)) for a batch.");
  cls.def(
      "standard_start",
      [](const Problem& p, long long d) { return to_array(p.standard_start(dimension(d))); },
      py::arg("d"), "The problem's usual start point in dimension d, float32 (d,).");
  cls.def(
      "minimizer",
      [](const Problem& p, long long d) { return to_array(p.minimizer(dimension(d))); },
      py::arg("d"), "A global minimiser in dimension d (rounded to float32), float32 (d,).");
  cls.def(
      "minimum", [](const Problem& p, long long d) { return p.minimum(dimension(d)); },
      py::arg("d"), "The global minimum value in dimension d.");
}

template <class P>
void register_named(py::module_& m, const char* name, const char* doc) {
  py::class_<Named<P>, Problem> cls(m, name, py::is_final(), doc);
  exported_from(cls, "optex.problems");
  cls.def(py::init<>());
  cls.def("__repr__", [](const py::object& self) { return class_name(self) + "()"; });
  cls.def(py::pickle([](const Named<P>&) { return py::tuple(); },
                     [](const py::tuple&) { return Named<P>{}; }));
}

// Problem arguments: any optex.problems.Problem.
const Problem& problem_of(py::handle base) {
  if (!py::isinstance<Problem>(base)) {
    throw py::type_error("base: expected an optex.problems problem, got " + class_name(base));
  }
  return base.cast<const Problem&>();
}

RotatedProblem make_rotated(const py::object& base, long long d, std::uint64_t seed) {
  const Problem& p = problem_of(base);
  std::unique_ptr<problems::Rotated<Problem>> r;
  {
    // Building Q is O(d^3): seconds near the 4096 limit.
    py::gil_scoped_release release;
    r = std::make_unique<problems::Rotated<Problem>>(p, dimension(d), seed);
  }
  return RotatedProblem(*r, base);
}

NoisyProblem make_noisy(const py::object& base, double sigma, std::uint64_t seed) {
  return NoisyProblem(problems::WithGradientNoise<Problem>(problem_of(base), sigma, seed), base);
}

void register_wrappers(py::module_& m) {
  py::class_<RotatedProblem, Problem> rotated(
      m, "Rotated", py::is_final(),
      R"doc(f(x) = base(Q x), Q a seeded Haar-random orthogonal d x d matrix (d <= 4096):
removes the separability that flatters per-coordinate models, minimum unchanged.
standard_start and minimizer are the base's mapped by Q^T.
)doc");
  exported_from(rotated, "optex.problems");
  rotated.def(py::init(&make_rotated), py::arg("base"), py::arg("d"), py::arg("seed") = 0);
  rotated.def_readonly("base", &RotatedProblem::base, "The wrapped problem.");
  rotated.def_property_readonly(
      "dimension", [](const RotatedProblem& r) { return r.rotated.dimension(); }, "d.");
  rotated.def_property_readonly(
      "seed", [](const RotatedProblem& r) { return r.rotated.seed(); }, "The rotation's seed.");
  rotated.def_property_readonly(
      "rotation",
      [](const RotatedProblem& r) {
        const auto d = static_cast<py::ssize_t>(r.rotated.dimension());
        py::array_t<float> q({d, d});
        const auto values = r.rotated.rotation();
        std::copy(values.begin(), values.end(), q.mutable_data());
        return q;
      },
      "Q as a float32 (d, d) copy.");
  rotated.def("__repr__", [](const RotatedProblem& r) {
    return py::str("Rotated({!r}, d={}, seed={})")
        .format(r.base, r.rotated.dimension(), r.rotated.seed());
  });
  rotated.def(py::pickle(
      [](const RotatedProblem& r) {
        return py::make_tuple(r.base, r.rotated.dimension(), r.rotated.seed());
      },
      [](const py::tuple& t) {
        return make_rotated(t[0], t[1].cast<long long>(), t[2].cast<std::uint64_t>());
      }));

  py::class_<NoisyProblem, Problem> noisy(
      m, "WithGradientNoise", py::is_final(),
      R"doc(The base problem with N(0, sigma^2) noise added to every gradient coordinate
(the loss stays exact): a stand-in for stochastic gradients. The noise is a
function of (seed, the bytes of x), so the same point gets the same noise in any
order, thread or process.
)doc");
  exported_from(noisy, "optex.problems");
  noisy.def(py::init(&make_noisy), py::arg("base"), py::arg("sigma"), py::arg("seed") = 0);
  noisy.def_readonly("base", &NoisyProblem::base, "The wrapped problem.");
  noisy.def_property_readonly(
      "sigma", [](const NoisyProblem& p) { return p.noisy.sigma(); }, "The noise's std.");
  noisy.def_property_readonly(
      "seed", [](const NoisyProblem& p) { return p.noisy.seed(); }, "The noise's seed.");
  noisy.def("__repr__", [](const NoisyProblem& p) {
    return py::str("WithGradientNoise({!r}, sigma={!r}, seed={})")
        .format(p.base, p.noisy.sigma(), p.noisy.seed());
  });
  noisy.def(py::pickle(
      [](const NoisyProblem& p) { return py::make_tuple(p.base, p.noisy.sigma(), p.noisy.seed()); },
      [](const py::tuple& t) {
        return make_noisy(t[0], t[1].cast<double>(), t[2].cast<std::uint64_t>());
      }));
}

}  // namespace

void register_problems(py::module_& m) {
  register_domain(m);
  register_problem_base(m);
  register_named<problems::Sphere>(
      m, "Sphere", "sum x_i^2 on [-5.12, 5.12]^d; minimum 0 at x = 0; start x_i = 1.");
  register_named<problems::Rosenbrock>(
      m, "Rosenbrock",
      "sum_{i<d} 100 (x_{i+1} - x_i^2)^2 + (x_i - 1)^2 on [-5, 10]^d (d >= 2); minimum 0 at x = "
      "1; start (-1.2, 1, -1.2, 1, ...).");
  register_named<problems::Ackley>(
      m, "Ackley",
      "Ackley (a = 20, b = 0.2, c = 2 pi) on [-32.768, 32.768]^d; minimum 0 at x = 0; start "
      "x_i = 2.25.");
  register_named<problems::Rastrigin>(
      m, "Rastrigin",
      "10 d + sum x_i^2 - 10 cos(2 pi x_i) on [-5.12, 5.12]^d; minimum 0 at x = 0; start x_i = "
      "2.25.");
  register_named<problems::Levy>(m, "Levy",
                                 "Levy on [-10, 10]^d; minimum 0 at x = 1; start x_i = 4.");
  register_named<problems::Griewank>(
      m, "Griewank",
      "sum x_i^2 / 4000 - prod cos(x_i / sqrt(i)) + 1 on [-600, 600]^d; minimum 0 at x = 0; "
      "start x_i = 100.");
  register_named<problems::StyblinskiTang>(
      m, "StyblinskiTang",
      "0.5 sum x_i^4 - 16 x_i^2 + 5 x_i on [-5, 5]^d; minimum -39.16616570 d at x_i = "
      "-2.903534; start x_i = 0.");
  register_named<problems::Schwefel>(
      m, "Schwefel",
      "418.9828872724338 d - sum x_i sin(sqrt(|x_i|)) on [-500, 500]^d; minimum 0 at x_i = "
      "420.968746; start x_i = 100.");
  register_wrappers(m);
  m.def(
      "uniform_start",
      [](long long d, double lower, double upper, std::uint64_t seed) {
        return to_array(problems::uniform_start(dimension(d), lower, upper, seed));
      },
      py::arg("d"), py::arg("lower"), py::arg("upper"), py::arg("seed") = 0,
      "A float32 point drawn uniformly from [lower, upper]^d with the core's portable "
      "SplitMix64 generator: the same seed gives the C++ optex::problems::uniform_start point.");
}

}  // namespace optex::python

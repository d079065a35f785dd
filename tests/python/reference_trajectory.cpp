// The C++ side of the Python tests' bit-for-bit comparisons (tests/python):
// drives optex::Engine and the optex::problems directly, exactly as a C++
// user would, and prints every number as the hex of its bits. The pytest suite
// runs the same configuration through the `optex` module and compares.
//
//   optex_reference_trajectory trajectory problem=rosenbrock dim=20 optimizer=adam lr=0.02
//       [momentum= nesterov=0|1 weight_decay=] [preset=default|reference] [parallelism=4]
//       [history=] [proxy=gp|target|last_gradient] [seed=0] [iterations=10]
//       [save_at=<iteration> save_path=<file>] [load_path=<file>]
//     One line per committed iteration:
//       iteration=<t> x=<iterate> loss= best_loss= grad_norm= cosine= lengthscale= seeds=<seeds>
//     With load_path the run resumes from that checkpoint instead of starting.
//   optex_reference_trajectory evaluate problem=rastrigin dim=7 [points=3] [seed=0]
//       [rotated_seed=<seed>] [noise_sigma=<sigma> noise_seed=<seed>]
//     One line per point drawn with uniform_start(dim, domain, seed + k):
//       x=<point> loss=<loss> grad=<gradient>
//
// Floats print as 8 hex digits of their bits, doubles as 16, uint64 seeds as 16,
// each array as its elements' digits concatenated.
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/engine/engine.hpp"
#include "optex/problems/problems.hpp"

namespace {

using Args = std::map<std::string, std::string>;

// The keys a mode reads; any other key is a mistake in the caller.
class ArgReader {
 public:
  explicit ArgReader(Args args) : args_(std::move(args)) {}
  std::string get(const std::string& key, const std::string& fallback) {
    used_.push_back(key);
    const auto it = args_.find(key);
    return it == args_.end() ? fallback : it->second;
  }
  std::string required(const std::string& key) {
    used_.push_back(key);
    const auto it = args_.find(key);
    if (it == args_.end()) throw std::invalid_argument("missing argument " + key + "=...");
    return it->second;
  }
  bool has(const std::string& key) const { return args_.count(key) != 0; }
  void check_all_used() const {
    for (const auto& [key, value] : args_) {
      bool used = false;
      for (const auto& u : used_) used = used || u == key;
      if (!used) throw std::invalid_argument("unknown argument " + key + "=" + value);
    }
  }

 private:
  Args args_;
  std::vector<std::string> used_;
};

std::string hex(std::span<const float> values) {
  std::string out;
  char digits[9];
  for (const float v : values) {
    std::snprintf(digits, sizeof digits, "%08x", std::bit_cast<std::uint32_t>(v));
    out += digits;
  }
  return out;
}

std::string hex(std::uint64_t bits) {
  char digits[17];
  std::snprintf(digits, sizeof digits, "%016llx", static_cast<unsigned long long>(bits));
  return digits;
}

std::string hex(double v) { return hex(std::bit_cast<std::uint64_t>(v)); }

// Calls f with the named shipped problem.
template <class F>
void with_problem(const std::string& name, F&& f) {
  namespace p = optex::problems;
  if (name == "sphere") return f(p::Sphere{});
  if (name == "rosenbrock") return f(p::Rosenbrock{});
  if (name == "ackley") return f(p::Ackley{});
  if (name == "rastrigin") return f(p::Rastrigin{});
  if (name == "levy") return f(p::Levy{});
  if (name == "griewank") return f(p::Griewank{});
  if (name == "styblinski_tang") return f(p::StyblinskiTang{});
  if (name == "schwefel") return f(p::Schwefel{});
  throw std::invalid_argument("unknown problem " + name);
}

optex::Optimizer optimizer_from(ArgReader& args) {
  const std::string kind = args.required("optimizer");
  const double lr = std::stod(args.required("lr"));
  const double weight_decay = std::stod(args.get("weight_decay", "0"));
  if (kind == "sgd") {
    return optex::Sgd{.lr = lr,
                      .momentum = std::stod(args.get("momentum", "0")),
                      .nesterov = args.get("nesterov", "0") == "1",
                      .weight_decay = weight_decay};
  }
  if (kind == "adam") return optex::Adam{.lr = lr, .weight_decay = weight_decay};
  if (kind == "adamw") return optex::adamw(lr, weight_decay);
  throw std::invalid_argument("unknown optimizer " + kind);
}

optex::Options options_from(ArgReader& args) {
  const int n = std::stoi(args.get("parallelism", "4"));
  const std::string preset = args.get("preset", "default");
  optex::Options o;
  if (preset == "reference") {
    o = optex::Options::reference(n);
  } else if (preset != "default") {
    throw std::invalid_argument("unknown preset " + preset);
  }
  o.parallelism = n;
  if (args.has("history")) o.history = std::stoi(args.get("history", ""));
  const std::string proxy = args.get("proxy", "gp");
  if (proxy == "target") o.proxy = optex::Proxy::target;
  if (proxy == "last_gradient") o.proxy = optex::Proxy::last_gradient;
  o.seed = std::stoull(args.get("seed", "0"));
  return o;
}

void trajectory(ArgReader& args) {
  const std::string problem = args.required("problem");
  const auto dim = static_cast<std::size_t>(std::stoul(args.required("dim")));
  const long iterations = std::stol(args.get("iterations", "10"));
  const std::string load_path = args.get("load_path", "");
  const long save_at = std::stol(args.get("save_at", "-1"));
  const std::string save_path = args.get("save_path", "");
  std::optional<optex::Optimizer> optimizer;
  std::optional<optex::Options> options;
  if (load_path.empty()) {
    optimizer = optimizer_from(args);
    options = options_from(args);
  }
  args.check_all_used();
  with_problem(problem, [&](const auto& f) {
    optex::Engine engine = load_path.empty()
                               ? optex::Engine(f.standard_start(dim), *optimizer, *options)
                               : optex::Engine::load(load_path);
    engine.set_gradient_oracle([&f](std::span<const float> x, std::span<float> g) {
      return f.EvaluateWithGradient(x, g);
    });
    for (long t = 0; t < iterations; ++t) {
      optex::Batch& b = engine.ask();
      std::string seeds;
      for (int i = 0; i < b.size(); ++i) {
        b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
        seeds += hex(b.seed(i));
      }
      const optex::IterationInfo& info = engine.tell(b);
      std::printf(
          "iteration=%lld x=%s loss=%s best_loss=%s grad_norm=%s cosine=%s "
          "lengthscale=%s seeds=%s\n",
          static_cast<long long>(info.iteration), hex(engine.iterate()).c_str(),
          hex(info.loss).c_str(), hex(info.best_loss).c_str(), hex(info.grad_norm).c_str(),
          hex(info.cosine).c_str(), hex(info.lengthscale).c_str(), seeds.c_str());
      if (info.iteration == save_at) engine.save(save_path);
    }
  });
}

template <class P>
void print_evaluations(const P& f, std::size_t dim, long points, std::uint64_t seed) {
  std::vector<float> g(dim);
  for (long k = 0; k < points; ++k) {
    const std::vector<float> x =
        optex::problems::uniform_start(dim, f.domain(), seed + static_cast<std::uint64_t>(k));
    const double loss = f.EvaluateWithGradient(x, g);
    std::printf("x=%s loss=%s grad=%s\n", hex(x).c_str(), hex(loss).c_str(), hex(g).c_str());
  }
}

void evaluate(ArgReader& args) {
  const std::string problem = args.required("problem");
  const auto dim = static_cast<std::size_t>(std::stoul(args.required("dim")));
  const long points = std::stol(args.get("points", "3"));
  const std::uint64_t seed = std::stoull(args.get("seed", "0"));
  const bool rotated = args.has("rotated_seed");
  const std::uint64_t rotated_seed = std::stoull(args.get("rotated_seed", "0"));
  const bool noisy = args.has("noise_sigma");
  const double sigma = std::stod(args.get("noise_sigma", "0"));
  const std::uint64_t noise_seed = std::stoull(args.get("noise_seed", "0"));
  args.check_all_used();
  with_problem(problem, [&](const auto& base) {
    using Base = std::decay_t<decltype(base)>;
    if (rotated && noisy) {
      using Noisy = optex::problems::WithGradientNoise<Base>;
      print_evaluations(
          optex::problems::Rotated<Noisy>(Noisy(base, sigma, noise_seed), dim, rotated_seed), dim,
          points, seed);
    } else if (rotated) {
      print_evaluations(optex::problems::Rotated<Base>(base, dim, rotated_seed), dim, points, seed);
    } else if (noisy) {
      print_evaluations(optex::problems::WithGradientNoise<Base>(base, sigma, noise_seed), dim,
                        points, seed);
    } else {
      print_evaluations(base, dim, points, seed);
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) throw std::invalid_argument("usage: see the comment at the top of the source");
    Args args;
    for (int i = 2; i < argc; ++i) {
      const std::string arg = argv[i];
      const auto eq = arg.find('=');
      if (eq == std::string::npos) throw std::invalid_argument("expected key=value, got " + arg);
      args[arg.substr(0, eq)] = arg.substr(eq + 1);
    }
    ArgReader reader(std::move(args));
    const std::string mode = argv[1];
    if (mode == "trajectory") {
      trajectory(reader);
    } else if (mode == "evaluate") {
      evaluate(reader);
    } else {
      throw std::invalid_argument("unknown mode " + mode + " (trajectory or evaluate)");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "optex_reference_trajectory: %s\n", e.what());
    return 2;
  }
  return 0;
}

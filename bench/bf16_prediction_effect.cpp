// How much does storing the history in bfloat16 change the GP-predicted gradient?
//
// A CPU emulation of the CUDA backend's bf16 storage: every stored point and
// gradient is rounded to bf16 when it enters the history, and everything the
// estimator computes from the history (distances, Gram, kernel vector, weighted
// sum) uses the rounded values, in the usual fp32/fp64 arithmetic. The query
// point (a proxy point) stays fp32.
//
// For every shipped problem and seed, the CPU engine runs its ask/tell loop
// (Adam, default Options, N = 5). From round --skip on, right after ask(), the
// engine's history is copied once per variant below, each copy is fitted, and
// it predicts the gradient at the batch's first N - 1 points (the points whose
// predictions drive the proxy steps). Recorded per prediction: its cosine to
// the fp32 copy's prediction and to the true gradient there. The copies are
// only measured: the engine's own trajectory is the plain fp32 one.
//
// Variants: fp32 (the reference), bf16 and bf16-grads (the storage formats in
// question), and two diagnostics: bf16-own-ls (does choosing the lengthscale
// on the rounded history repair bf16?) and bf16-offsets (does storing points
// relative to a recent fp32 anchor?).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optex/backend/bf16.hpp>
#include <optex/estimator/gp_estimator.hpp>
#include <optex/estimator/gradient_history.hpp>
#include <optex/estimator/lengthscale_selection.hpp>
#include <optex/optex.hpp>
#include <span>
#include <string>
#include <vector>

namespace {

using LossFn = std::function<double(std::span<const float>, std::span<float>)>;

struct Problem {
  std::string name;
  LossFn f;
};

template <class P>
Problem make(P p) {
  std::string name(p.name());
  return {std::move(name), [p = std::move(p)](std::span<const float> x, std::span<float> g) {
            return p.EvaluateWithGradient(x, g);
          }};
}

// How a variant stores the history and picks its lengthscale.
struct Variant {
  const char* name;
  const char* title;
  bool round_points;
  bool round_gradients;
  // Points stored as bf16 offsets from an fp32 anchor, so the rounding error
  // scales with the offset instead of with |x|. Idealised: every offset is
  // taken from the current iterate, as if the store were re-encoded whenever
  // the iterate moves (a fixed anchor at x0 does much worse).
  bool offsets_from_iterate;
  // Select the lengthscale on the rounded history, as a backend that computes
  // its Gram from the stored values would; otherwise use the engine's.
  bool own_lengthscale;
};

constexpr int kFp32 = 0;
constexpr std::array<Variant, 5> kVariants = {{
    {"fp32", "fp32: exact copy (the reference)", false, false, false, false},
    {"bf16", "bf16: points and gradients rounded, the engine's lengthscale", true, true, false,
     false},
    {"bf16-grads", "bf16-grads: gradients rounded, points fp32, the engine's lengthscale", false,
     true, false, false},
    {"bf16-own-ls",
     "bf16-own-ls: points and gradients rounded, lengthscale selected on the rounded history", true,
     true, false, true},
    {"bf16-offsets",
     "bf16-offsets (idealised): gradients rounded, points stored as bf16 offsets from the current "
     "fp32 iterate, the engine's lengthscale",
     true, true, true, false},
}};
constexpr std::size_t kCount = kVariants.size();

// Everything recorded for one problem, pooled over seeds, rounds and points.
struct Samples {
  std::array<std::vector<double>, kCount> cos_to_fp32;
  std::array<std::vector<double>, kCount> cos_to_true;
  // ||pred - pred_fp32|| / ||pred_fp32 - true||: the change the rounding makes,
  // relative to the error the fp32 GP makes anyway.
  std::array<std::vector<double>, kCount> change_over_error;
  // Per analysed round: the largest relative change of a pairwise history
  // distance caused by the rounding (0 when points stay fp32).
  std::array<std::vector<double>, kCount> distance_error;
  // The fp32 copy against the engine's own prediction: checks the emulation.
  double min_cos_to_engine = 1.0;
};

float bf16_round(float x) { return optex::detail::from_bf16(optex::detail::to_bf16(x)); }

std::vector<float> round_to_bf16(std::span<const float> v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = bf16_round(v[i]);
  return out;
}

// anchor + bf16(x - anchor): what a point stored as a bf16 offset reads back as.
std::vector<float> round_offset_to_bf16(std::span<const float> x, std::span<const float> anchor) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = anchor[i] + bf16_round(x[i] - anchor[i]);
  return out;
}

// Cosine in double; NaN when either vector is zero (no direction to compare).
double cosine(std::span<const float> a, std::span<const float> b) {
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  if (aa == 0.0 || bb == 0.0) return std::numeric_limits<double>::quiet_NaN();
  return ab / std::sqrt(aa * bb);
}

// ||a - b|| / ||b - c|| in double; NaN when b = c.
double distance_ratio(std::span<const float> a, std::span<const float> b,
                      std::span<const float> c) {
  double ab = 0.0, bc = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double u = static_cast<double>(a[i]) - b[i];
    const double w = static_cast<double>(b[i]) - c[i];
    ab += u * u;
    bc += w * w;
  }
  if (bc == 0.0) return std::numeric_limits<double>::quiet_NaN();
  return std::sqrt(ab / bc);
}

// The engine's history pushed in slot order (the GP mean does not depend on
// the order), stored as the variant stores it.
optex::GradientHistory copy_history(const optex::GradientHistory& h, const Variant& v,
                                    std::span<const float> iterate) {
  optex::GradientHistory out(h.capacity(), h.dim());
  for (std::size_t j = 0; j < h.size(); ++j) {
    std::vector<float> point(h.point(j).begin(), h.point(j).end());
    std::vector<float> gradient(h.gradient(j).begin(), h.gradient(j).end());
    if (v.round_points) {
      point = v.offsets_from_iterate ? round_offset_to_bf16(point, iterate) : round_to_bf16(point);
    }
    if (v.round_gradients) gradient = round_to_bf16(gradient);
    out.push(point, gradient);
  }
  return out;
}

double max_relative_distance_error(const optex::GradientHistory& exact,
                                   const optex::GradientHistory& stored) {
  double worst = 0.0;
  for (std::size_t i = 0; i < exact.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      const double e = std::sqrt(exact.squared_distance(i, j));
      const double r = std::sqrt(stored.squared_distance(i, j));
      if (e > 0.0) worst = std::max(worst, std::abs(r - e) / e);
    }
  }
  return worst;
}

// Called after ask() with the batch's true gradients filled in, before tell().
void analyse(const optex::Engine& engine, const optex::Batch& batch, Samples& s) {
  const optex::Options& o = engine.options();
  const std::size_t d = engine.dim();
  std::vector<optex::GradientHistory> copies;
  std::vector<optex::GpGradientEstimator> estimators;
  std::array<std::vector<float>, kCount> predicted;
  for (std::size_t v = 0; v < kCount; ++v) {
    copies.push_back(copy_history(engine.history(), kVariants[v], batch.point(0)));
    s.distance_error[v].push_back(max_relative_distance_error(copies[kFp32], copies[v]));
    double lengthscale = engine.lengthscale();
    if (kVariants[v].own_lengthscale &&
        o.lengthscale_selection != optex::LengthscaleSelection::fixed) {
      lengthscale = optex::select_lengthscale(copies[v], o, engine.lengthscale()).lengthscale;
    }
    estimators.emplace_back(o.kernel, o.noise, o.input_scaling, copies[v].capacity());
    estimators.back().fit(copies[v], lengthscale);
    predicted[v].resize(d);
  }
  for (int i = 0; i + 1 < batch.size(); ++i) {
    for (std::size_t v = 0; v < kCount; ++v) {
      estimators[v].predict(copies[v], batch.point(i), predicted[v]);
    }
    for (std::size_t v = 0; v < kCount; ++v) {
      s.cos_to_fp32[v].push_back(cosine(predicted[v], predicted[kFp32]));
      s.cos_to_true[v].push_back(cosine(predicted[v], batch.grad(i)));
      s.change_over_error[v].push_back(
          distance_ratio(predicted[v], predicted[kFp32], batch.grad(i)));
    }
    s.min_cos_to_engine =
        std::min(s.min_cos_to_engine, cosine(predicted[kFp32], batch.predicted_gradient(i)));
  }
}

// Median and minimum over the finite values; NaN when there are none.
struct Summary {
  double median = std::numeric_limits<double>::quiet_NaN();
  double min = std::numeric_limits<double>::quiet_NaN();
  std::size_t count = 0;    // finite values
  std::size_t skipped = 0;  // NaN values (a zero vector)
};

Summary summarise(const std::vector<double>& values) {
  std::vector<double> v;
  for (double x : values) {
    if (std::isfinite(x)) v.push_back(x);
  }
  Summary s;
  s.count = v.size();
  s.skipped = values.size() - v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front();
  return s;
}

// One table row: a problem under one variant.
struct Row {
  std::string problem;
  std::size_t predictions = 0;
  std::size_t skipped = 0;
  double median_cos_to_fp32 = 0.0;
  double min_cos_to_fp32 = 0.0;
  double median_cos_fp32_to_true = 0.0;
  double median_cos_to_true = 0.0;
  double median_change_over_error = 0.0;
  double median_distance_error = 0.0;
};

Row make_row(const std::string& problem, const Samples& s, std::size_t v) {
  const Summary to_fp32 = summarise(s.cos_to_fp32[v]);
  return {problem,
          to_fp32.count,
          to_fp32.skipped,
          to_fp32.median,
          to_fp32.min,
          summarise(s.cos_to_true[kFp32]).median,
          summarise(s.cos_to_true[v]).median,
          summarise(s.change_over_error[v]).median,
          summarise(s.distance_error[v]).median};
}

// JSON has no NaN: write null.
std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Effect of bf16 history storage on the GP-predicted gradient (CPU emulation)"};
  std::size_t dim = 10000;
  int parallelism = 5;
  long rounds = 60;
  long skip = 5;
  int seeds = 3;
  double lr = 0.01;
  std::string json_path;
  app.add_option("--dim", dim, "problem dimension d")->check(CLI::PositiveNumber);
  app.add_option("--parallelism", parallelism, "N: points per OptEx round")
      ->check(CLI::Range(2, 64));
  app.add_option("--rounds", rounds, "OptEx rounds per run")->check(CLI::PositiveNumber);
  app.add_option("--skip", skip, "analyse rounds from this one on (0-based)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seeds", seeds, "start points U(-1, 1)^d per problem")
      ->check(CLI::Range(1, 100));
  app.add_option("--lr", lr, "Adam learning rate")->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "also write the figures as JSON to this path");
  CLI11_PARSE(app, argc, argv);

  namespace pr = optex::problems;
  const std::vector<Problem> problems = {
      make(pr::Sphere{}), make(pr::Rosenbrock{}), make(pr::Ackley{}),         make(pr::Rastrigin{}),
      make(pr::Levy{}),   make(pr::Griewank{}),   make(pr::StyblinskiTang{}), make(pr::Schwefel{})};
  optex::Options options;  // the library's defaults, as a user gets them
  options.parallelism = parallelism;

  const auto start = std::chrono::steady_clock::now();
  std::array<std::vector<Row>, kCount> rows;  // per variant, one row per problem
  double check = 1.0;
  for (const Problem& p : problems) {
    Samples samples;
    for (int seed = 0; seed < seeds; ++seed) {
      // The demo's starts: U(-1, 1)^d, seeded.
      const auto x0 = pr::uniform_start(dim, -1.0, 1.0, static_cast<std::uint64_t>(seed));
      optex::Engine engine(x0, optex::Adam{.lr = lr}, options);
      for (long t = 0; t < rounds; ++t) {
        optex::Batch& b = engine.ask();
        for (int i = 0; i < b.size(); ++i) b.loss(i) = p.f(b.point(i), b.grad(i));
        // Before tell(): the history is still the one the proxy steps used.
        if (t >= skip && engine.history().size() >= 2) analyse(engine, b, samples);
        engine.tell(b);
      }
    }
    for (std::size_t v = 0; v < kCount; ++v) rows[v].push_back(make_row(p.name, samples, v));
    check = std::min(check, samples.min_cos_to_engine);
    std::fprintf(stderr, "%s done\n", p.name.c_str());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::printf(
      "bf16 history storage, CPU emulation: d = %zu, N = %d, Adam lr %g, default Options, %d "
      "seeds, %ld rounds, analysed from round %ld, predictions at the first N - 1 points of each "
      "batch\n",
      dim, parallelism, lr, seeds, rounds, skip);
  for (std::size_t v = 1; v < kCount; ++v) {
    std::printf("\n### %s\n\n", kVariants[v].title);
    std::printf(
        "| problem | predictions | median cos to fp32 pred | min cos to fp32 pred | median "
        "cos(fp32 pred, true) | median cos(%s pred, true) | median change / fp32 error | "
        "median max rel. distance error |\n",
        kVariants[v].name);
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const Row& r : rows[v]) {
      std::printf("| %s | %zu | %.6f | %.6f | %.6f | %.6f | %.3g | %.3g |\n", r.problem.c_str(),
                  r.predictions, r.median_cos_to_fp32, r.min_cos_to_fp32, r.median_cos_fp32_to_true,
                  r.median_cos_to_true, r.median_change_over_error, r.median_distance_error);
    }
  }
  std::printf("\n");
  for (std::size_t v = 0; v < kCount; ++v) {
    for (const Row& r : rows[v]) {
      if (r.skipped > 0) {
        std::printf("%s, %s: %zu zero predictions skipped\n", kVariants[v].name, r.problem.c_str(),
                    r.skipped);
      }
    }
  }
  std::printf("check: min cos(fp32 copy pred, engine's own pred) = %.9f\n", check);
  std::printf("elapsed: %.1f s\n", seconds);

  if (!json_path.empty()) {
    std::FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "--json: cannot open '%s': %s\n", json_path.c_str(),
                   std::strerror(errno));
      return 1;
    }
    std::fprintf(f,
                 "{\n  \"config\": {\"dim\": %zu, \"parallelism\": %d, \"rounds\": %ld, "
                 "\"skip\": %ld, \"seeds\": %d, \"adam_lr\": %s, \"options\": \"default\", "
                 "\"start\": \"U(-1, 1)\"},\n",
                 dim, parallelism, rounds, skip, seeds, json_number(lr).c_str());
    std::fprintf(f, "  \"check_min_cos_fp32_copy_to_engine\": %s,\n", json_number(check).c_str());
    std::fprintf(f, "  \"elapsed_seconds\": %s,\n  \"variants\": {\n",
                 json_number(seconds).c_str());
    for (std::size_t v = 1; v < kCount; ++v) {
      std::fprintf(f, "    \"%s\": {\"description\": \"%s\", \"problems\": [\n", kVariants[v].name,
                   kVariants[v].title);
      for (std::size_t k = 0; k < rows[v].size(); ++k) {
        const Row& r = rows[v][k];
        std::fprintf(f, "      {\"problem\": \"%s\", \"predictions\": %zu", r.problem.c_str(),
                     r.predictions);
        const std::pair<const char*, double> fields[] = {
            {"median_cos_to_fp32_pred", r.median_cos_to_fp32},
            {"min_cos_to_fp32_pred", r.min_cos_to_fp32},
            {"median_cos_fp32_pred_to_true", r.median_cos_fp32_to_true},
            {"median_cos_pred_to_true", r.median_cos_to_true},
            {"median_change_over_fp32_error", r.median_change_over_error},
            {"median_max_rel_distance_error", r.median_distance_error}};
        for (const auto& [key, value] : fields) {
          std::fprintf(f, ", \"%s\": %s", key, json_number(value).c_str());
        }
        std::fprintf(f, "}%s\n", k + 1 < rows[v].size() ? "," : "");
      }
      std::fprintf(f, "    ]}%s\n", v + 1 < kCount ? "," : "");
    }
    std::fprintf(f, "  }\n}\n");
    // A full disk shows at the flush or the close: the file is lost, so say so.
    const bool lost = std::fflush(f) != 0 || std::ferror(f) != 0;
    const int error = errno;
    if (std::fclose(f) != 0 || lost) {
      std::fprintf(stderr, "--json: writing '%s' failed: %s\n", json_path.c_str(),
                   std::strerror(lost ? error : errno));
      return 1;
    }
  }
  return 0;
}

#include "methods.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <optex/distributed/data_parallel.hpp>  // minibatch_seed
#include <optex/engine/engine.hpp>
#include <optex/util/random.hpp>
#include <optional>
#include <stdexcept>
#include <utility>

#include "../number_text.hpp"

namespace optex_bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct NamedKind {
  std::string_view name;
  MethodKind kind;
};
constexpr NamedKind kMethods[] = {
    {"vanilla", MethodKind::vanilla},
    {"vanilla_nlr", MethodKind::vanilla_nlr},
    {"data_parallel", MethodKind::data_parallel},
    {"line_search", MethodKind::line_search},
    {"target", MethodKind::target},
    {"optex_reference", MethodKind::optex_reference},
    {"optex_default", MethodKind::optex_default},
    {"optex_adaptive", MethodKind::optex_adaptive},
    {"ablation_last_gradient", MethodKind::ablation_last_gradient},
    {"ablation_last_point", MethodKind::ablation_last_point},
};

bool uses_engine_options(MethodKind kind) {
  return kind == MethodKind::optex_reference || kind == MethodKind::optex_default ||
         kind == MethodKind::optex_adaptive || kind == MethodKind::ablation_last_gradient ||
         kind == MethodKind::ablation_last_point;
}

constexpr double kOff = std::numeric_limits<double>::infinity();

double parse_number(std::string_view method, std::string_view key, std::string_view text) {
  const std::string s(text);
  const std::optional<double> v = whole_number(s);
  if (!v || !std::isfinite(*v)) {
    throw std::invalid_argument("method '" + std::string(method) + "': " + std::string(key) +
                                " needs a number, got '" + s + "'");
  }
  return *v;
}

[[noreturn]] void refuse_value(std::string_view method, std::string_view key,
                               std::string_view requirement, std::string_view value) {
  throw std::invalid_argument("method '" + std::string(method) + "': " + std::string(key) +
                              " must be " + std::string(requirement) + ", got '" +
                              std::string(value) + "'");
}

// An integer in [1, highest].
int parse_count(std::string_view method, std::string_view key, std::string_view value,
                int highest) {
  const double v = parse_number(method, key, value);
  if (v != std::floor(v) || v < 1 || v > highest) {
    refuse_value(method, key, "an integer in [1, " + std::to_string(highest) + "]", value);
  }
  return static_cast<int>(v);
}

// A safeguard threshold: a number above `lowest` (at least 1 when lowest is 1), or
// "off" for +infinity, as Options::validate takes them.
double parse_threshold(std::string_view method, std::string_view key, std::string_view value,
                       double lowest) {
  if (value == "off") return kOff;
  const std::string requirement = lowest >= 1.0 ? "a number >= 1 or off" : "a number > 0 or off";
  double v = 0.0;
  try {
    v = parse_number(method, key, value);
  } catch (const std::invalid_argument&) {
    refuse_value(method, key, requirement, value);
  }
  if (!(lowest >= 1.0 ? v >= lowest : v > lowest)) refuse_value(method, key, requirement, value);
  return v;
}

// One of the listed words.
template <class T, std::size_t K>
T parse_choice(std::string_view method, std::string_view key, std::string_view value,
               const std::pair<std::string_view, T> (&choices)[K]) {
  std::string names;
  for (const auto& [name, choice] : choices) {
    if (value == name) return choice;
    names += (names.empty() ? "" : " or ") + std::string(name);
  }
  refuse_value(method, key, names, value);
}

template <class T>
void set_once(std::string_view method, std::string_view key, std::optional<T>& slot, T value) {
  // The last of two settings would win silently.
  if (slot) {
    throw std::invalid_argument("method '" + std::string(method) + "': option '" +
                                std::string(key) + "' is given twice");
  }
  slot = value;
}

constexpr std::pair<std::string_view, optex::Strategy> kStrategies[] = {
    {"fixed", optex::Strategy::fixed}, {"adaptive", optex::Strategy::adaptive}};
constexpr std::pair<std::string_view, optex::ContinueFrom> kContinueFrom[] = {
    {"last", optex::ContinueFrom::last}, {"best", optex::ContinueFrom::best_loss}};

// Applies one "key=value" of a bracket suffix.
void parse_override(std::string_view method, std::string_view item, OptionOverrides& out) {
  const auto eq = item.find('=');
  if (eq == std::string_view::npos) {
    throw std::invalid_argument("method '" + std::string(method) + "': expected key=value, got '" +
                                std::string(item) + "'");
  }
  const std::string_view key = item.substr(0, eq);
  const std::string_view value = item.substr(eq + 1);
  if (key == "history") {
    set_once(method, key, out.history, parse_count(method, key, value, optex::kMaxHistory));
  } else if (key == "lengthscale") {
    if (value == "loo") {
      set_once(method, key, out.selection, optex::LengthscaleSelection::leave_one_out);
    } else if (value == "ml") {
      set_once(method, key, out.selection, optex::LengthscaleSelection::marginal_likelihood);
    } else {
      const double l = parse_number(method, key, value);
      if (!(l > 0.0)) refuse_value(method, key, "> 0, loo or ml", value);
      set_once(method, key, out.selection, optex::LengthscaleSelection::fixed);
      out.fixed_lengthscale = l;
    }
  } else if (key == "kernel") {
    optex::Covariance kernel{};
    try {
      kernel = optex::covariance_from_name(value);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("method '" + std::string(method) + "': " + e.what());
    }
    set_once(method, key, out.kernel, kernel);
  } else if (key == "evaluations") {
    set_once(method, key, out.evaluations_per_point,
             parse_count(method, key, value, optex::kMaxParallelism));
  } else if (key == "strategy") {
    set_once(method, key, out.strategy, parse_choice(method, key, value, kStrategies));
  } else if (key == "continue") {
    set_once(method, key, out.continue_from, parse_choice(method, key, value, kContinueFrom));
  } else if (key == "variance") {
    set_once(method, key, out.max_posterior_variance, parse_threshold(method, key, value, 0.0));
  } else if (key == "trust") {
    set_once(method, key, out.trust_region, parse_threshold(method, key, value, 0.0));
  } else if (key == "lengthscale_change") {
    set_once(method, key, out.max_lengthscale_change, parse_threshold(method, key, value, 1.0));
  } else {
    throw std::invalid_argument("method '" + std::string(method) + "': unknown option '" +
                                std::string(key) +
                                "' (known: history, lengthscale, kernel, evaluations, strategy, "
                                "continue, variance, trust, lengthscale_change)");
  }
}

void apply(const OptionOverrides& o, optex::Options& options) {
  if (o.history) options.history = *o.history;
  if (o.fixed_lengthscale) options.lengthscale = *o.fixed_lengthscale;
  if (o.selection) options.lengthscale_selection = *o.selection;
  if (o.kernel) options.kernel = *o.kernel;
  if (o.evaluations_per_point) options.evaluations_per_point = *o.evaluations_per_point;
  if (o.strategy) options.strategy = *o.strategy;
  if (o.continue_from) options.continue_from = *o.continue_from;
  if (o.max_posterior_variance) options.max_posterior_variance = *o.max_posterior_variance;
  if (o.trust_region) options.trust_region = *o.trust_region;
  if (o.max_lengthscale_change) options.max_lengthscale_change = *o.max_lengthscale_change;
}

// Scales g down to Euclidean norm `max_norm` when it is longer; 0 = no clip.
void clip_gradient_norm(std::span<float> g, double max_norm) {
  if (max_norm <= 0.0) return;
  double sum = 0.0;
  for (float v : g) sum += static_cast<double>(v) * v;
  const double norm = std::sqrt(sum);
  if (!(norm > max_norm)) return;  // also leaves non-finite gradients alone
  const double scale = max_norm / norm;
  for (float& v : g) v = static_cast<float>(v * scale);
}

// The noise seed of a run: the gradient noise differs from seed to seed.
std::uint64_t noise_seed(std::uint64_t run_seed) {
  constexpr std::uint64_t kNoiseStream = 0x6e6f697365ull;  // "noise"
  return optex::mix_seed(run_seed, kNoiseStream);
}

// Builds a Trajectory round by round; the loss measurement is timed out of it.
class Recorder {
 public:
  Recorder(const Task& task, std::span<const float> x0) : task_(task) {
    trajectory_.loss.push_back(task_.loss(x0));
    trajectory_.evaluations.push_back(0);
    trajectory_.seconds.push_back(0.0);
    resumed_ = Clock::now();
  }

  void record_round(std::span<const float> x, std::int64_t evaluations) {
    spent_ += std::chrono::duration<double>(Clock::now() - resumed_).count();
    trajectory_.loss.push_back(task_.loss(x));
    trajectory_.evaluations.push_back(evaluations);
    trajectory_.seconds.push_back(spent_);
    resumed_ = Clock::now();
  }

  // Rounds a failed run did not reach hold NaN losses and its last counts.
  Trajectory finish(int rounds, std::string failure) {
    const auto wanted = static_cast<std::size_t>(rounds) + 1;
    while (trajectory_.loss.size() < wanted) {
      trajectory_.loss.push_back(kNaN);
      trajectory_.evaluations.push_back(trajectory_.evaluations.back());
      trajectory_.seconds.push_back(trajectory_.seconds.back());
    }
    trajectory_.failure = std::move(failure);
    return std::move(trajectory_);
  }

 private:
  const Task& task_;
  Trajectory trajectory_;
  double spent_ = 0.0;
  Clock::time_point resumed_;
};

// vanilla and vanilla_nlr: one gradient, one optimizer step per round.
void run_vanilla(const RunInputs& in, std::vector<float> x, Recorder& recorder) {
  const GradientSource gradient = in.task->gradient_source(noise_seed(in.seed));
  optex::OptimizerState state = optex::init_state(in.optimizer, x.size());
  std::vector<float> g(x.size());
  for (int r = 1; r <= in.rounds; ++r) {
    gradient(x, g);
    clip_gradient_norm(g, in.clip);
    optex::apply_step(in.optimizer, x, state, g);
    recorder.record_round(x, r);
  }
}

// out = the mean of the rows, accumulated in double: N equal rows (no noise) give
// back that row bit for bit, so data_parallel is then exactly vanilla.
void mean_of_rows(std::span<const float> rows, std::span<float> out) {
  const std::size_t d = out.size();
  const std::size_t n = rows.size() / d;
  std::vector<double> sum(d, 0.0);
  for (std::size_t k = 0; k < n; ++k) {
    for (std::size_t j = 0; j < d; ++j) sum[j] += rows[k * d + j];
  }
  for (std::size_t j = 0; j < d; ++j) out[j] = static_cast<float>(sum[j] / static_cast<double>(n));
}

// Minibatches 0 .. count-1 of `count` at one point: independently-noised gradient
// sources (minibatch 0 of 1 is the run's own noise, the one vanilla sees).
std::vector<GradientSource> minibatch_sources(const RunInputs& in, int count) {
  std::vector<GradientSource> sources;
  for (int k = 0; k < count; ++k) {
    sources.push_back(
        in.task->gradient_source(optex::minibatch_seed(noise_seed(in.seed), k, count)));
  }
  return sources;
}

// N x minibatch: N independently-noised gradients at the iterate, averaged.
void run_data_parallel(const RunInputs& in, std::vector<float> x, Recorder& recorder) {
  const int n = in.parallelism;
  const std::size_t d = x.size();
  const std::vector<GradientSource> minibatches = minibatch_sources(in, n);
  optex::OptimizerState state = optex::init_state(in.optimizer, d);
  std::vector<float> rows(static_cast<std::size_t>(n) * d);
  std::vector<float> g(d);
  std::int64_t evaluations = 0;
  for (int r = 1; r <= in.rounds; ++r) {
    for (int k = 0; k < n; ++k) {
      minibatches[static_cast<std::size_t>(k)](x, std::span<float>(rows).subspan(k * d, d));
    }
    evaluations += n;
    mean_of_rows(rows, g);
    clip_gradient_norm(g, in.clip);
    optex::apply_step(in.optimizer, x, state, g);
    recorder.record_round(x, evaluations);
  }
}

// Parallel line search: N step sizes along one optimizer update, best loss wins.
void run_line_search(const RunInputs& in, std::vector<float> x, Recorder& recorder) {
  const int n = in.parallelism;
  const std::size_t d = x.size();
  const GradientSource gradient = in.task->gradient_source(noise_seed(in.seed));
  optex::OptimizerState state = optex::init_state(in.optimizer, d);
  std::vector<float> g(d), stepped(d), candidate(d), candidate_g(d), best(d), best_g(d);
  gradient(x, g);  // the one extra evaluation: the direction of round 1 needs it
  clip_gradient_norm(g, in.clip);
  std::int64_t evaluations = 1;
  const int lowest_power = -(n - 1) / 2;  // the grid 2^k x lr is centred on the lr
  for (int r = 1; r <= in.rounds; ++r) {
    std::copy(x.begin(), x.end(), stepped.begin());
    optex::OptimizerState next_state = state;
    optex::apply_step(in.optimizer, stepped, next_state, g);
    double best_loss = std::numeric_limits<double>::infinity();
    bool found = false;
    for (int k = 0; k < n; ++k) {
      const int power = lowest_power + k;
      if (power == 0) {
        std::copy(stepped.begin(), stepped.end(), candidate.begin());
      } else {
        const float factor = std::ldexp(1.0f, power);
        for (std::size_t j = 0; j < d; ++j) candidate[j] = x[j] + factor * (stepped[j] - x[j]);
      }
      const double loss = gradient(candidate, candidate_g);
      ++evaluations;
      if (loss < best_loss) {
        best_loss = loss;
        found = true;
        std::swap(best, candidate);
        std::swap(best_g, candidate_g);
      }
    }
    if (!found) throw std::runtime_error("line_search: every candidate's loss is non-finite");
    std::swap(x, best);
    std::swap(g, best_g);
    clip_gradient_norm(g, in.clip);
    state = std::move(next_state);  // the state advances once per round
    recorder.record_round(x, evaluations);
  }
}

// N true sequential base-optimizer steps per round (Proxy::target). The engine's
// oracle evaluates points 0..N-2 for the proxy steps; the batch holds the same
// points again, so their gradients are reused rather than counted twice: N
// evaluations per round, where Engine::evaluations() would count 2N - 1.
void run_target(const RunInputs& in, std::vector<float> x, Recorder& recorder) {
  const GradientSource gradient = in.task->gradient_source(noise_seed(in.seed));
  optex::Options options;
  options.parallelism = in.parallelism;
  options.seed = in.seed;
  options.proxy = optex::Proxy::target;
  // The proxy steps never read the history: skip choosing a lengthscale for it.
  options.lengthscale_selection = optex::LengthscaleSelection::fixed;
  optex::Engine engine(x, in.optimizer, options);

  struct OracleCall {
    std::vector<float> point, gradient;
    double loss;
  };
  std::vector<OracleCall> calls;
  std::int64_t evaluations = 0;
  engine.set_gradient_oracle([&](std::span<const float> point, std::span<float> g) {
    const double loss = gradient(point, g);
    clip_gradient_norm(g, in.clip);
    ++evaluations;
    calls.push_back({{point.begin(), point.end()}, {g.begin(), g.end()}, loss});
    return loss;
  });
  const auto same_point = [](std::span<const float> a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
  };
  for (int r = 1; r <= in.rounds; ++r) {
    calls.clear();
    optex::Batch& batch = engine.ask();
    for (int i = 0; i < batch.size(); ++i) {
      const auto done = std::find_if(calls.begin(), calls.end(), [&](const OracleCall& c) {
        return same_point(batch.point(i), c.point);
      });
      if (done != calls.end()) {
        batch.set_gradient(i, done->gradient);
        batch.loss(i) = done->loss;
        continue;
      }
      batch.loss(i) = gradient(batch.point(i), batch.grad(i));
      clip_gradient_norm(batch.grad(i), in.clip);
      ++evaluations;
    }
    engine.tell(batch);
    recorder.record_round(engine.iterate(), evaluations);
  }
}

// OptEx through the ask/tell engine. With `last_point_only`, points 0..N-2 get a
// non-finite gradient and loss, which the engine drops: it neither stores them in
// the history nor steps from them, so one evaluation per round drives the run.
//
// The gradient noise is drawn per evaluation: the k-th of L consecutive rows at the
// same point (one point's L evaluations, or proxy points that coincide, as in a
// warm-up round) draws minibatch k of L, with the seeds data_parallel's workers use,
// so D evaluations of a point are D independent minibatches; a row at a point of
// its own draws the run's own noise.
void run_optex(const RunInputs& in, optex::Options options, bool last_point_only,
               std::vector<float> x, Recorder& recorder) {
  const GradientSource lone = minibatch_sources(in, 1).front();
  const std::vector<GradientSource> shared = minibatch_sources(in, std::max(in.parallelism, 2));
  options.parallelism = in.parallelism;
  options.seed = in.seed;
  optex::Engine engine(x, in.optimizer, options);
  std::int64_t evaluations = 0;
  std::vector<int> position, run_length;  // per row: k and L above
  for (int r = 1; r <= in.rounds; ++r) {
    optex::Batch& batch = engine.ask();
    const int n = batch.size();
    position.assign(static_cast<std::size_t>(n), 0);
    run_length.assign(static_cast<std::size_t>(n), 1);
    for (int i = 1; i < n; ++i) {
      const std::span<const float> a = batch.point(i - 1);
      const std::span<const float> b = batch.point(i);
      if (std::memcmp(a.data(), b.data(), b.size_bytes()) == 0) {
        position[static_cast<std::size_t>(i)] = position[static_cast<std::size_t>(i - 1)] + 1;
      }
    }
    for (int i = n - 1; i >= 0; --i) {
      const auto k = static_cast<std::size_t>(i);
      run_length[k] =
          k + 1 < position.size() && position[k + 1] > 0 ? run_length[k + 1] : position[k] + 1;
    }
    for (int i = 0; i < n; ++i) {
      if (last_point_only && i < n - 1) {
        std::span<float> g = batch.grad(i);
        std::fill(g.begin(), g.end(), std::numeric_limits<float>::quiet_NaN());
        batch.loss(i) = kNaN;
        continue;
      }
      const auto k = static_cast<std::size_t>(i);
      const GradientSource& gradient =
          run_length[k] == 1 ? lone : shared[static_cast<std::size_t>(position[k])];
      batch.loss(i) = gradient(batch.point(i), batch.grad(i));
      clip_gradient_norm(batch.grad(i), in.clip);
      ++evaluations;
    }
    engine.tell(batch);
    recorder.record_round(engine.iterate(), evaluations);
  }
}

optex::Options engine_options(const MethodSpec& method, int parallelism) {
  optex::Options options;
  if (method.kind == MethodKind::optex_reference) options = optex::Options::reference(parallelism);
  if (method.kind == MethodKind::optex_adaptive) options = optex::Options::adaptive(parallelism);
  if (method.kind == MethodKind::ablation_last_gradient) {
    options.proxy = optex::Proxy::last_gradient;
  }
  apply(method.overrides, options);
  options.parallelism = parallelism;
  return options;
}

}  // namespace

const std::vector<std::string>& standard_method_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const NamedKind& m : kMethods) out.emplace_back(m.name);
    return out;
  }();
  return names;
}

MethodSpec parse_method(std::string_view name) {
  const auto open = name.find('[');
  const std::string_view base = name.substr(0, open);
  const auto known = std::find_if(std::begin(kMethods), std::end(kMethods),
                                  [&](const NamedKind& m) { return m.name == base; });
  if (known == std::end(kMethods)) {
    std::string list;
    for (const NamedKind& m : kMethods) list += (list.empty() ? "" : ", ") + std::string(m.name);
    throw std::invalid_argument("unknown method '" + std::string(name) + "' (known: " + list + ")");
  }
  MethodSpec spec{std::string(name), known->kind, {}};
  if (open == std::string_view::npos) return spec;
  if (!uses_engine_options(known->kind)) {
    throw std::invalid_argument("method '" + std::string(name) +
                                "': only optex_* and ablation_* methods take [options]");
  }
  if (!name.ends_with(']')) {
    throw std::invalid_argument("method '" + std::string(name) + "': missing the closing ']'");
  }
  std::string_view inside = name.substr(open + 1, name.size() - open - 2);
  while (!inside.empty()) {
    const auto end = inside.find(';');
    parse_override(name, inside.substr(0, end), spec.overrides);
    inside = end == std::string_view::npos ? std::string_view{} : inside.substr(end + 1);
  }
  return spec;
}

void check_method_for_parallelism(const MethodSpec& method, int parallelism) {
  if (!uses_engine_options(method.kind)) return;
  try {
    engine_options(method, parallelism).validate();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("method '" + method.name +
                                "' at N = " + std::to_string(parallelism) + ": " + e.what());
  }
}

bool is_same_budget_baseline(MethodKind kind) {
  return kind == MethodKind::vanilla_nlr || kind == MethodKind::data_parallel ||
         kind == MethodKind::line_search;
}

double centre_learning_rate(MethodKind kind, double lr, int parallelism) {
  return kind == MethodKind::vanilla_nlr ? lr * parallelism : lr;
}

std::string evaluations_per_round(MethodKind kind) {
  switch (kind) {
    case MethodKind::vanilla:
    case MethodKind::vanilla_nlr:
    case MethodKind::ablation_last_point:
      return "1";
    case MethodKind::line_search:
      return "N, plus 1 once in round 1 (the gradient at x0)";
    case MethodKind::target:
      return "N (sequential)";
    case MethodKind::data_parallel:
    case MethodKind::optex_reference:
    case MethodKind::optex_default:
    case MethodKind::optex_adaptive:
    case MethodKind::ablation_last_gradient:
      return "N";
  }
  return "N";
}

Trajectory run_method(const MethodSpec& method, const RunInputs& in) {
  std::vector<float> x0 = start_point(in.task->dim, in.seed);
  Recorder recorder(*in.task, x0);
  std::string failure;
  try {
    switch (method.kind) {
      case MethodKind::vanilla:
      case MethodKind::vanilla_nlr:
        run_vanilla(in, std::move(x0), recorder);
        break;
      case MethodKind::data_parallel:
        run_data_parallel(in, std::move(x0), recorder);
        break;
      case MethodKind::line_search:
        run_line_search(in, std::move(x0), recorder);
        break;
      case MethodKind::target:
        run_target(in, std::move(x0), recorder);
        break;
      case MethodKind::optex_reference:
      case MethodKind::optex_default:
      case MethodKind::optex_adaptive:
      case MethodKind::ablation_last_gradient:
      case MethodKind::ablation_last_point:
        run_optex(in, engine_options(method, in.parallelism),
                  method.kind == MethodKind::ablation_last_point, std::move(x0), recorder);
        break;
    }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  return recorder.finish(in.rounds, std::move(failure));
}

}  // namespace optex_bench

// Everything that configures an OptEx run besides the base optimizer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "optex/backend/device.hpp"
#include "optex/estimator/covariance.hpp"

namespace optex {

// What the proxy steps use as the gradient at the points they have not evaluated.
enum class Proxy {
  // GP mean over the history: the OptEx algorithm.
  gp,
  // The true gradient, evaluated sequentially by a gradient oracle: N true
  // sequential steps per round. Not an algorithm one would deploy; the upper
  // bound the benchmarks compare against ("Target" in the paper).
  target,
  // The most recent true gradient in the history (an ablation: no model).
  last_gradient,
};

// How the GP proxy steps find their T0 squared distances to the history (DESIGN.md section 7).
enum class ProxyDistances {
  direct,        // one pass over the history's points per proxy step: the reference
  coefficients,  // from per-round anchor products, no pass per step (SGD family, exact)
};

// How history and query points are scaled before the kernel sees them.
enum class InputScaling {
  // Raw coordinates: the lengthscale is a distance in parameter space.
  none,
  // The authors' code: divide by the mean over history of sqrt(||x_j||).
  reference_mean_sqrt_norm,
};

// How the engine chooses the lengthscale.
enum class LengthscaleSelection {
  // Keep `Options::lengthscale`.
  fixed,
  // Closed-form leave-one-out error of the GP mean, over a grid.
  leave_one_out,
  // Log marginal likelihood of the history gradients, over a grid.
  marginal_likelihood,
};

// What the proxy steps do while the history holds fewer than two points.
enum class Warmup {
  // The reference: predict a zero gradient, and still advance the optimizer
  // state (Adam's step counter grows, its moments decay).
  zero_gradient,
  // Use the last history gradient as the prediction when the history holds
  // one point (or more), and put every point at the iterate without touching
  // the optimizer state while it holds none.
  last_gradient,
};

// Which of the N evaluated points the commit steps from.
enum class ContinueFrom {
  // The last point whose pair is admissible: the OptEx algorithm (and the reference).
  last,
  // The admissible point with the lowest loss (the paper's ablation b): a round
  // then never ends worse than a plain step from its best point, so bad
  // predictions cost progress but cannot make the method diverge.
  best_loss,
};

// How the engine splits each round's N evaluations into points.
enum class Strategy {
  // Every round: N / evaluations_per_point points, each evaluated
  // evaluations_per_point times.
  fixed,
  // Each round the engine chooses the evaluations per point from the gradient
  // noise it measured (DESIGN.md section 2, "The adaptive strategy"):
  // noise-free gradients get one evaluation per point (OptEx), noise-dominated
  // ones all N at one point (N x minibatch), and what lies between a split in
  // between. evaluations_per_point is where it starts.
  adaptive,
};

// Whether a round's commit may use predicted gradients.
enum class Mode {
  // OptEx: the commit steps from the last (or best) point of a proxy chain whose
  // steps used predicted gradients; the trajectory is not the base optimizer's.
  approximate,
  // The base optimizer's own trajectory, in fewer rounds (DESIGN.md section 2,
  // "The verified mode"): the round's points are guesses of the next iterates
  // (the last round's unverified steps redone with their true gradients, then GP
  // proxy steps); the commit replays the base optimizer through them with their
  // true gradients and keeps the steps whose guess agreed within `tolerance`.
  verified,
};

// The largest history Options::validate accepts.
inline constexpr int kMaxHistory = 4096;
// The largest parallelism Options::validate accepts (and the most threads a
// ThreadPool starts): N points per iteration, one thread each in minimize(),
// N points of d floats allocated up front. Far beyond any useful N; a larger
// value is a typo or a crafted checkpoint, refused rather than attempted.
inline constexpr int kMaxParallelism = 65536;

struct Options {
  int parallelism = 4;  // N: points evaluated per iteration (one per worker), <= 65536
  int history = 32;     // T0: how many (point, gradient) pairs the estimator keeps (<= 4096)

  Covariance kernel = Covariance::matern52;
  // Lengthscale in the units of the scaled inputs. With selection enabled it is
  // the starting value, and the grid is relative to the history's median distance.
  double lengthscale = 0.1;
  double noise = 1e-3;  // sigma^2 added to the Gram matrix diagonal
  InputScaling input_scaling = InputScaling::none;
  Warmup warmup = Warmup::last_gradient;

  LengthscaleSelection lengthscale_selection = LengthscaleSelection::leave_one_out;
  int selection_interval = 1;  // re-select every this many iterations
  // Candidate lengthscales as multiples of the median pairwise history distance
  // (after input scaling). Empty means the built-in grid.
  std::vector<double> lengthscale_grid;

  Proxy proxy = Proxy::gp;
  // `coefficients` applies to SGD (momentum, Nesterov, weight decay) on a whole
  // (unsharded) engine with one optimizer range; elsewhere the engine uses
  // `direct`; the trajectories agree to fp32 rounding (DESIGN.md).
  ProxyDistances proxy_distances = ProxyDistances::direct;
  std::uint64_t seed = 0;  // drives the per-evaluation seeds handed to stochastic objectives

  // D: how many of a round's N evaluations each point gets (each with its own
  // seed). The round evaluates P = N / D distinct points; a point's gradient
  // and loss are the means of its admissible evaluations, in evaluation order.
  // D = N is N x minibatch, D = 1 is plain OptEx. Must divide parallelism.
  int evaluations_per_point = 1;
  Strategy strategy = Strategy::fixed;
  ContinueFrom continue_from = ContinueFrom::best_loss;

  // Safeguards on the proxy chain; +infinity turns each off. Where one stops
  // the chain, the evaluations of the points not made go to the last point made.
  // Stop at a point whose GP posterior variance, in units of the prior
  // variance (about `noise` at a history point, 1 far from every one), is above this.
  double max_posterior_variance = std::numeric_limits<double>::infinity();
  // Stop at proxy point i once it lies farther from the iterate than
  // trust_region * i * (length of the last committed step).
  double trust_region = std::numeric_limits<double>::infinity();
  // A lengthscale selection may change the lengthscale by at most this factor
  // (up or down) from the one before; >= 1.
  double max_lengthscale_change = std::numeric_limits<double>::infinity();
  // Where the iterate, optimizer state, history and batch rows live.
  Device device = Device::cpu();
  // Threads for the passes over d-vectors on the CPU (proxy steps, the
  // history update, the commit's statistics), in [0, 1024]; 0 uses every core
  // this process may run on. Every value gives the same results bit for bit.
  // It describes the machine, not the run: checkpoints and the ranks'
  // configuration agreement leave it out, and Engine::set_threads changes it.
  // A DistributedEngine turns 0 into its share: the cores over the ranks on
  // the same host.
  int threads = 0;
  // Storage of the history's points and gradients (CUDA devices only;
  // arithmetic stays fp32 / fp64). See Precision for what bf16 costs.
  Precision history_precision = Precision::fp32;
  Mode mode = Mode::approximate;
  // Verified mode: a guess is accepted where ||guess - replayed iterate|| is at
  // most tolerance * ||replayed iterate||. 0: bit-for-bit equal, so that every
  // committed iterate and state are the base optimizer's sequential ones exactly.
  double tolerance = 0.0;

  // The reference semantics of the authors' JAX code: Matern-5/2,
  // lengthscale 0.1 on inputs divided by mean sqrt(||x_j||), noise 1e-3,
  // T0 = 50, zero gradient before two history points, no selection. Throws
  // std::invalid_argument at once for a parallelism < 1.
  static Options reference(int parallelism = 5) {
    Options o;
    o.parallelism = parallelism;
    o.history = 50;
    o.kernel = Covariance::matern52;
    o.lengthscale = 0.1;
    o.noise = 1e-3;
    o.input_scaling = InputScaling::reference_mean_sqrt_norm;
    o.warmup = Warmup::zero_gradient;
    o.lengthscale_selection = LengthscaleSelection::fixed;
    o.strategy = Strategy::fixed;
    o.evaluations_per_point = 1;
    o.continue_from = ContinueFrom::last;
    o.proxy_distances = ProxyDistances::direct;
    o.validate();
    return o;
  }

  // The robust configuration (DESIGN.md section 2, "The adaptive strategy"):
  // Options{} with the adaptive split, commits from the best loss of the
  // round, and the lengthscale guard. Throws std::invalid_argument at once for
  // a parallelism < 1.
  static Options adaptive(int parallelism = 4) {
    Options o;
    o.parallelism = parallelism;
    o.strategy = Strategy::adaptive;
    o.continue_from = ContinueFrom::best_loss;
    o.max_lengthscale_change = 10.0;
    o.validate();
    return o;
  }

  // The verified mode (Mode::verified) at this tolerance, with the defaults
  // otherwise: one evaluation per point, the fixed split, the GP guesses, no
  // safeguards (the commit checks every guess). Throws std::invalid_argument at
  // once for a bad parallelism or tolerance.
  static Options verified(int parallelism = 8, double tolerance = 0.0) {
    Options o;
    o.parallelism = parallelism;
    o.history = std::max(o.history, parallelism);
    o.mode = Mode::verified;
    o.tolerance = tolerance;
    o.validate();
    return o;
  }

  // Throws std::invalid_argument naming the first bad field and its value.
  // Whether these options can make a round's points differ from its rows
  // (several evaluations per point, the adaptive strategy, a safeguard that
  // cuts the chain): the engine then keeps the proxy chain in a second batch.
  bool separates_points_from_rows() const;

  void validate() const;
};

// When `minimize` stops. Whichever criterion is met first wins.
struct Stop {
  long max_iters = 1000;
  // Stop once a round's loss (at its last point) is <= this.
  double target_loss = -1e300;
  // Stop once the committed gradient's Euclidean norm is <= this.
  double grad_tol = 0.0;

  void validate() const;
};

}  // namespace optex

// The one GP pipeline (optex/estimator/gp_fit.hpp): the jitter escalation of
// fit_with_jitter, GpFactor's weights and variance, and GpGradientEstimator
// against the engine's device backend on the CPU's primitives: the same
// jitter, weights and variance, bit for bit, for the same history and query,
// and the same error where even the last jitter fails.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <Eigen/Cholesky>
#include <Eigen/Core>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "optex/backend/device_primitives.hpp"
#include "optex/backend/engine_backend.hpp"
#include "optex/engine/batch.hpp"
#include "optex/engine/options.hpp"
#include "optex/estimator/covariance.hpp"
#include "optex/estimator/gp_estimator.hpp"
#include "optex/estimator/gp_fit.hpp"
#include "optex/estimator/gradient_history.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "optex/sharded/coordinate_shard.hpp"
#include "support/engine_equality.hpp"
#include "support/test_support.hpp"

namespace {

using optex::Covariance;
using optex::GpFactor;
using optex::GpGradientEstimator;
using optex::GradientHistory;
using optex::InputScaling;
using optex::test::SameBits;
using optex::test::UniformStart;
namespace detail = optex::detail;

constexpr Covariance kAllKernels[] = {Covariance::matern12, Covariance::matern32,
                                      Covariance::matern52, Covariance::rbf};

// ---- fit_with_jitter ---------------------------------------------------------------------

GradientHistory two_point_history() {
  GradientHistory h(4, 3);
  h.push(std::vector<float>{0.0f, 0.0f, 0.0f}, std::vector<float>{1.0f, 0.0f, 0.0f});
  h.push(std::vector<float>{1.0f, 2.0f, 2.0f}, std::vector<float>{0.0f, 1.0f, 0.0f});
  return h;
}

// A factor that never succeeds sees jitter 0, then 1e-10 up to 1e-2 by decades, then the fit
// throws naming the lengthscale, the noise and the history size.
TEST(FitWithJitter, TriesEveryDecadeFrom1e10To1e2ThenThrows) {
  const GradientHistory h = two_point_history();
  const double noise = 0.25;
  std::vector<double> jitters;
  Eigen::MatrixXd covariance;
  try {
    optex::fit_with_jitter(h, {Covariance::rbf, noise, InputScaling::none}, 2.0, covariance,
                           [&](const Eigen::MatrixXd& k) {
                             EXPECT_EQ(k.rows(), 2);
                             EXPECT_EQ(k.cols(), 2);
                             EXPECT_EQ(k(0, 0), k(1, 1));
                             jitters.push_back(k(0, 0) - 1.0 - noise);
                             return 1;
                           });
    FAIL() << "no factor succeeded, yet the fit returned";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(),
                 "gp estimator: Cholesky failed even with jitter 1e-2 (lengthscale 2, noise 0.25, "
                 "history 2)");
  }
  const std::vector<double> expected = {0.0, 1e-10, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2};
  ASSERT_EQ(jitters.size(), expected.size());
  EXPECT_EQ(jitters[0], 0.0);
  // 1.25 + j carries j to about 2e-16 absolute.
  for (std::size_t t = 1; t < expected.size(); ++t)
    EXPECT_NEAR(jitters[t], expected[t], 1e-15 + 1e-9 * expected[t]) << "try " << t;
}

// The first jitter that factorises is the one returned, with the off-diagonal the kernel's
// value at distance 3 / (scale * lengthscale): here ||(1, 2, 2)|| = 3, lengthscale 2, scale 1.
TEST(FitWithJitter, StopsAtTheFirstFactorThatSucceeds) {
  const GradientHistory h = two_point_history();
  Eigen::MatrixXd covariance;
  int calls = 0;
  const optex::GpFit fit =
      optex::fit_with_jitter(h, {Covariance::matern12, 0.0, InputScaling::none}, 2.0, covariance,
                             [&](const Eigen::MatrixXd& k) {
                               EXPECT_DOUBLE_EQ(k(1, 0), std::exp(-1.5));
                               EXPECT_DOUBLE_EQ(k(0, 1), std::exp(-1.5));
                               return ++calls < 4 ? 3 : 0;  // 0, 1e-10 and 1e-9 fail
                             });
  EXPECT_EQ(calls, 4);
  EXPECT_NEAR(fit.jitter, 1e-8, 1e-20);
  EXPECT_EQ(fit.scale, 1.0);
  EXPECT_EQ(fit.inv_scaled_lengthscale, 0.5);
}

TEST(FitWithJitter, AnEmptyHistoryFactorsNothing) {
  const GradientHistory h(4, 3);
  Eigen::MatrixXd covariance;
  const optex::GpFit fit =
      optex::fit_with_jitter(h, {Covariance::rbf, 1e-3, InputScaling::reference_mean_sqrt_norm},
                             4.0, covariance, [](const Eigen::MatrixXd&) -> int {
                               ADD_FAILURE() << "factor called for an empty history";
                               return 0;
                             });
  EXPECT_EQ(fit.jitter, 0.0);
  EXPECT_EQ(fit.scale, 1.0);
  EXPECT_EQ(fit.inv_scaled_lengthscale, 0.25);
}

// Whatever the factor throws passes through, at its first try.
TEST(FitWithJitter, TheFactorsOwnErrorPassesThrough) {
  const GradientHistory h = two_point_history();
  Eigen::MatrixXd covariance;
  int calls = 0;
  EXPECT_THROW(
      optex::fit_with_jitter(h, {Covariance::rbf, 0.0, InputScaling::none}, 1.0, covariance,
                             [&](const Eigen::MatrixXd&) -> int {
                               ++calls;
                               throw std::logic_error("refused");
                             }),
      std::logic_error);
  EXPECT_EQ(calls, 1);
}

// ---- GpFactor ------------------------------------------------------------------------------

// The weights solve (K + sigma^2 I) w = k and the variance is 1 - k . w, against a 2 x 2
// solved by hand: K = [[1 + s, c], [c, 1 + s]].
TEST(GpFactor, WeightsAndVarianceOfATwoByTwo) {
  const double s = 0.1;
  const double c = std::exp(-0.5);  // rbf at r = 1
  const Eigen::Matrix2d k{{1.0 + s, c}, {c, 1.0 + s}};
  GpFactor gp;
  ASSERT_EQ(gp.factor(k.data(), 2), 0);
  // The query at distances 0 and 2 * (lengthscale 2): r = 0 and r = 1.
  const std::vector<double> d2 = {0.0, 4.0};
  std::vector<double> w(2);
  const double variance = gp.weigh(d2, Covariance::rbf, 0.5, w);
  const double kq0 = 1.0, kq1 = c;
  const double det = (1.0 + s) * (1.0 + s) - c * c;
  const double w0 = ((1.0 + s) * kq0 - c * kq1) / det;
  const double w1 = ((1.0 + s) * kq1 - c * kq0) / det;
  EXPECT_NEAR(w[0], w0, 1e-14);
  EXPECT_NEAR(w[1], w1, 1e-14);
  EXPECT_NEAR(variance, 1.0 - kq0 * w0 - kq1 * w1, 1e-14);
  EXPECT_GT(variance, 0.0);
}

// Where k . w exceeds 1 the variance is clamped at 0, never negative (a 1 x 1 "covariance"
// of 0.5 makes k . w = 2 at distance 0); a NaN distance gives NaN weights and variance 0
// (the backend refuses the step for its weights).
TEST(GpFactor, VarianceIsNeverNegative) {
  const double half = 0.5;
  GpFactor gp;
  ASSERT_EQ(gp.factor(&half, 1), 0);
  std::vector<double> w(1);
  EXPECT_EQ(gp.weigh(std::vector<double>{0.0}, Covariance::matern52, 1.0, w), 0.0);
  EXPECT_DOUBLE_EQ(w[0], 2.0);
  const Eigen::Matrix2d identity = Eigen::Matrix2d::Identity();
  ASSERT_EQ(gp.factor(identity.data(), 2), 0);
  w.resize(2);
  EXPECT_EQ(gp.weigh(std::vector<double>{std::nan(""), 0.0}, Covariance::rbf, 1.0, w), 0.0);
  EXPECT_TRUE(std::isnan(w[0]));
}

TEST(GpFactor, ReportsANonPositiveDefiniteMatrix) {
  const Eigen::Matrix2d indefinite{{1.0, 2.0}, {2.0, 1.0}};
  GpFactor gp;
  EXPECT_EQ(gp.factor(indefinite.data(), 2), 1);
  const Eigen::Matrix2d singular{{1.0, 1.0}, {1.0, 1.0}};
  EXPECT_EQ(gp.factor(singular.data(), 2), 1);
}

// A query of another size than the factor, or too few weights, is refused before anything
// is written; so is gp_weights on the CPU's primitives, as on CUDA's.
TEST(GpFactor, RefusesAQueryOfAnotherSizeWritingNothing) {
  const Eigen::Matrix2d k{{1.0, 0.5}, {0.5, 1.0}};
  GpFactor gp;
  ASSERT_EQ(gp.factor(k.data(), 2), 0);
  std::vector<double> w = {7.0, 7.0, 7.0};
  EXPECT_THROW(gp.weigh(std::vector<double>{1.0, 1.0, 1.0}, Covariance::rbf, 1.0, w),
               std::logic_error);
  EXPECT_THROW(gp.weigh(std::vector<double>{1.0}, Covariance::rbf, 1.0, w), std::logic_error);
  EXPECT_THROW(
      gp.weigh(std::vector<double>{1.0, 1.0}, Covariance::rbf, 1.0, std::span<double>(w.data(), 1)),
      std::logic_error);
  EXPECT_EQ(w, (std::vector<double>{7.0, 7.0, 7.0}));

  const std::unique_ptr<detail::DevicePrimitives> cpu = detail::make_cpu_primitives(1);
  int* info = cpu->ints(1);
  double* scratch = cpu->doubles(8);
  cpu->factor(k.data(), 2, info);
  EXPECT_EQ(*info, 0);
  scratch[6] = 7.0;
  EXPECT_THROW(cpu->gp_weights(scratch, 3, Covariance::rbf, 1.0, scratch + 3, scratch + 6, info),
               std::logic_error);
  EXPECT_EQ(scratch[6], 7.0);
}

// ---- the estimator is the engine's GP, bit for bit ---------------------------------------

// The CPU's primitives, keeping what every gp_weights() call wrote. step() is forwarded
// with the parameters of DevicePrimitives::step, whatever they are (StepParameters): the
// optimizer's side of the interface is no concern of the GP's.
template <class StepMember>
class Recording;
template <class... StepParameters>
class Recording<void (detail::DevicePrimitives::*)(StepParameters...)> final
    : public detail::DevicePrimitives {
 public:
  struct Weighing {
    std::vector<double> weights;
    double variance;
  };
  std::vector<Weighing> weighings;

  Recording() : cpu_(detail::make_cpu_primitives(1)) {}

  optex::Device device() const override { return cpu_->device(); }
  bool host_memory() const override { return cpu_->host_memory(); }
  bool copies_cannot_fail() const override { return cpu_->copies_cannot_fail(); }
  void set_threads(int threads) override { cpu_->set_threads(threads); }
  void check_memory(std::size_t bytes, std::size_t staging, const std::string& what) override {
    cpu_->check_memory(bytes, staging, what);
  }
  float* floats(std::size_t count) override { return cpu_->floats(count); }
  detail::StoredRows rows(std::size_t count, detail::Storage storage) override {
    return cpu_->rows(count, storage);
  }
  double* doubles(std::size_t count) override { return cpu_->doubles(count); }
  int* ints(std::size_t count) override { return cpu_->ints(count); }
  void put(const void* host, void* to, std::size_t bytes) override { cpu_->put(host, to, bytes); }
  void copy(const float* from, float* to, std::size_t count) override {
    cpu_->copy(from, to, count);
  }
  void zero(float* to, std::size_t count) override { cpu_->zero(to, count); }
  void copy_stored(detail::StoredRows from, detail::StoredRows to, std::size_t count) override {
    cpu_->copy_stored(from, to, count);
  }
  void store(const float* from, detail::StoredRows to, std::size_t count) override {
    cpu_->store(from, to, count);
  }
  void load(detail::StoredRows from, float* to, std::size_t count) override {
    cpu_->load(from, to, count);
  }
  void squared_distances(detail::StoredRows rows, std::size_t nrows, std::size_t d,
                         std::span<const detail::StoredRows> queries, double* out,
                         double* norms) override {
    cpu_->squared_distances(rows, nrows, d, queries, out, norms);
  }
  void inner_products(detail::StoredRows rows, std::size_t nrows, std::size_t d,
                      std::span<const detail::StoredRows> queries, double* out) override {
    cpu_->inner_products(rows, nrows, d, queries, out);
  }
  void anchor_products(detail::StoredRows points, detail::StoredRows gradients, std::size_t n,
                       std::size_t d, const float* a, const float* m, std::span<const int> fresh,
                       double* out) override {
    cpu_->anchor_products(points, gradients, n, d, a, m, fresh, out);
  }
  void pair_statistics(const float* a, const float* b, std::size_t d, double* out) override {
    cpu_->pair_statistics(a, b, d, out);
  }
  void dot(const float* a, const float* b, std::size_t d, double* out) override {
    cpu_->dot(a, b, d, out);
  }
  void within_bound(const float* rows, std::size_t nrows, std::size_t d, float bound,
                    int* flags) override {
    cpu_->within_bound(rows, nrows, d, bound, flags);
  }
  void factor(const double* host, std::size_t n, int* info) override {
    cpu_->factor(host, n, info);
  }
  void gp_weights(const double* squared_distances, std::size_t n, Covariance kernel,
                  double inv_scaled_lengthscale, double* weights, double* variance,
                  int* info) override {
    cpu_->gp_weights(squared_distances, n, kernel, inv_scaled_lengthscale, weights, variance, info);
    weighings.push_back({{weights, weights + n}, *variance});  // the CPU has run it already
  }
  void step(StepParameters... parameters) override { cpu_->step(parameters...); }
  void mean_of_rows(const float* rows, std::span<const int> which, std::size_t d, float* mean,
                    double* sums) override {
    cpu_->mean_of_rows(rows, which, d, mean, sums);
  }
  void mean_in_rank_order(const float* blocks, std::size_t count, std::size_t n,
                          float* out) override {
    cpu_->mean_in_rank_order(blocks, count, n, out);
  }
  void fetch(std::span<const detail::Fetch> values) override { cpu_->fetch(values); }
  const float* view(const float* data, std::size_t count, std::vector<float>& scratch) override {
    return cpu_->view(data, count, scratch);
  }
  void view_stored(detail::StoredRows data, std::size_t count, std::vector<float>& out) override {
    cpu_->view_stored(data, count, out);
  }
  void download(const float* device_src, float* host_dst, std::size_t count) const override {
    cpu_->download(device_src, host_dst, count);
  }
  void upload(const float* host_src, float* device_dst, std::size_t count) const override {
    cpu_->upload(host_src, device_dst, count);
  }

 private:
  std::unique_ptr<detail::DevicePrimitives> cpu_;
};
using RecordingPrimitives = Recording<decltype(&detail::DevicePrimitives::step)>;

// One GP problem: n pairs (row-major n x d points and gradients), the query and the fit.
struct GpCase {
  std::size_t dim;
  std::vector<float> points, gradients;
  std::vector<float> query;
  Covariance kernel;
  double noise;
  InputScaling scaling;
  double lengthscale;
  std::size_t pairs() const { return points.size() / dim; }
};

// What a fit and one weighing gave, or the fit's error.
struct GpOutcome {
  double jitter = 0.0;
  std::vector<double> weights;
  double variance = 0.0;
  std::optional<std::string> fit_error;
};

constexpr int kCapacity = 8;  // T0, above every case's pairs

// The engine's path: the pairs enter a device backend on the CPU's primitives as a commit's
// pushes do (observe), fit() at the lengthscale, then one GP proxy step from point 0, the
// iterate, which is the query.
// A device backend on recording CPU primitives (`record` watches them) with
// the case's pairs observed, not yet fitted.
std::unique_ptr<detail::EngineBackend> backend_of(const GpCase& c, RecordingPrimitives*& record) {
  optex::Options options;
  options.parallelism = 2;
  options.history = kCapacity;
  options.kernel = c.kernel;
  options.noise = c.noise;
  options.input_scaling = c.scaling;
  options.threads = 1;
  auto recording = std::make_unique<RecordingPrimitives>();
  record = recording.get();
  const optex::OptimizerRanges sgd =
      optex::OptimizerRanges(optex::Sgd{.lr = 1e-3}).for_dimension(c.dim);
  std::unique_ptr<detail::EngineBackend> backend = detail::make_device_backend(
      std::move(recording), c.query, sgd, options, optex::CoordinateShard::whole(c.dim));
  backend->observe(c.points, c.gradients);
  return backend;
}

GpOutcome through_the_backend(const GpCase& c) {
  RecordingPrimitives* recorded = nullptr;
  const std::unique_ptr<detail::EngineBackend> backend = backend_of(c, recorded);
  RecordingPrimitives& record = *recorded;
  GpOutcome out;
  try {
    out.jitter = backend->fit(c.lengthscale);
  } catch (const std::runtime_error& e) {
    out.fit_error = e.what();
    return out;
  }
  optex::Batch batch;
  detail::BatchAccess::allocate(batch, 2, c.dim, optex::Device::cpu());
  backend->begin_batch(batch);
  backend->proxy_step(batch, 1, detail::ProxySource::gp, {});
  EXPECT_TRUE(backend->finish_batch(batch));
  EXPECT_EQ(record.weighings.size(), 1u);
  if (record.weighings.empty()) return out;
  out.weights = record.weighings.front().weights;
  out.variance = record.weighings.front().variance;
  // The backend reports the variance it computed.
  EXPECT_TRUE(SameBits(backend->posterior_variance(0), out.variance));
  return out;
}

// GpGradientEstimator on its own history of the same pairs.
GpOutcome through_the_estimator(const GpCase& c) {
  GradientHistory history(kCapacity, c.dim);
  for (std::size_t j = 0; j < c.pairs(); ++j) {
    history.push({c.points.data() + j * c.dim, c.dim}, {c.gradients.data() + j * c.dim, c.dim});
  }
  GpGradientEstimator estimator(c.kernel, c.noise, c.scaling, kCapacity);
  GpOutcome out;
  try {
    estimator.fit(history, c.lengthscale);
  } catch (const std::runtime_error& e) {
    out.fit_error = e.what();
    // A failed fit leaves the estimator unfitted.
    EXPECT_THROW(estimator.weigh(history, c.query), std::logic_error);
    return out;
  }
  out.jitter = estimator.jitter();
  estimator.weigh(history, c.query);
  out.weights.assign(estimator.weights().begin(), estimator.weights().end());
  out.variance = estimator.variance();
  return out;
}

::testing::AssertionResult SameOutcome(const GpOutcome& estimator, const GpOutcome& backend) {
  if (estimator.fit_error != backend.fit_error) {
    return ::testing::AssertionFailure()
           << "fit errors differ: estimator '" << estimator.fit_error.value_or("none")
           << "', backend '" << backend.fit_error.value_or("none") << "'";
  }
  if (!SameBits(estimator.jitter, backend.jitter)) {
    return ::testing::AssertionFailure()
           << "jitter " << estimator.jitter << " vs the backend's " << backend.jitter;
  }
  if (estimator.weights.size() != backend.weights.size()) {
    return ::testing::AssertionFailure()
           << estimator.weights.size() << " weights vs the backend's " << backend.weights.size();
  }
  for (std::size_t j = 0; j < estimator.weights.size(); ++j) {
    if (!SameBits(estimator.weights[j], backend.weights[j])) {
      return ::testing::AssertionFailure() << "weight " << j << ": " << estimator.weights[j]
                                           << " vs the backend's " << backend.weights[j];
    }
  }
  if (!SameBits(estimator.variance, backend.variance)) {
    return ::testing::AssertionFailure()
           << "variance " << estimator.variance << " vs the backend's " << backend.variance;
  }
  return ::testing::AssertionSuccess();
}

GpCase random_case(std::size_t pairs, std::size_t dim, std::uint64_t seed) {
  GpCase c{dim, UniformStart(pairs * dim, seed), UniformStart(pairs * dim, seed + 1),
           UniformStart(dim, seed + 2), Covariance::matern52, 1e-3, InputScaling::none,
           // Uniform points in [-1, 1]^d lie about sqrt(2 d / 3) apart.
           std::sqrt(static_cast<double>(dim))};
  return c;
}

TEST(OneGpPipeline, DistinctPointsEveryKernelAndScaling) {
  for (const Covariance kernel : kAllKernels) {
    for (const InputScaling scaling :
         {InputScaling::none, InputScaling::reference_mean_sqrt_norm}) {
      GpCase c = random_case(6, 37, 11);
      c.kernel = kernel;
      c.scaling = scaling;
      const GpOutcome backend = through_the_backend(c);
      const GpOutcome estimator = through_the_estimator(c);
      EXPECT_FALSE(backend.fit_error.has_value());
      EXPECT_EQ(backend.jitter, 0.0);
      ASSERT_EQ(backend.weights.size(), 6u);
      EXPECT_GT(backend.variance, 0.0);
      EXPECT_LT(backend.variance, 1.0);
      EXPECT_TRUE(SameOutcome(estimator, backend)) << optex::covariance_name(kernel);
    }
  }
}

// Three copies of one point and no noise: K is singular, the jitter escalates, and both
// stop at the same jitter with the same weights, at a fresh query and at the repeated point
// (where the variance is about the jitter).
TEST(OneGpPipeline, DuplicatePointsEscalateTheJitterAlike) {
  constexpr std::size_t kDim = 9;
  const std::vector<float> a = UniformStart(kDim, 31);
  const std::vector<float> b = UniformStart(kDim, 32);
  for (const Covariance kernel : kAllKernels) {
    for (const bool query_at_a : {false, true}) {
      GpCase c{kDim,   {},  UniformStart(4 * kDim, 33), query_at_a ? a : UniformStart(kDim, 34),
               kernel, 0.0, InputScaling::none,         2.0};
      for (const std::vector<float>* p : {&a, &b, &a, &a})
        c.points.insert(c.points.end(), p->begin(), p->end());
      const GpOutcome backend = through_the_backend(c);
      const GpOutcome estimator = through_the_estimator(c);
      EXPECT_FALSE(backend.fit_error.has_value());
      EXPECT_GT(backend.jitter, 0.0) << optex::covariance_name(kernel);
      EXPECT_LE(backend.jitter, 1e-2);
      ASSERT_EQ(backend.weights.size(), 4u);
      if (query_at_a) {
        EXPECT_LT(backend.variance, 1e-2);
      }
      EXPECT_TRUE(SameOutcome(estimator, backend))
          << optex::covariance_name(kernel) << (query_at_a ? " at a" : " fresh");
    }
  }
}

// A negative lengthscale turns the kernel into exp(+r): off-diagonals above 1, indefinite
// whatever the jitter. Both refuse with the same message.
// A lengthscale that is not finite and > 0 is refused by both fits alike, with
// the same message, and a refused fit keeps the fit that was there: the
// weights that follow are the bits of the fit at the good lengthscale.
TEST(OneGpPipeline, ALengthscaleNotFiniteAndPositiveIsRefusedKeepingTheFit) {
  const GpCase c = random_case(3, 5, 41);
  const GpOutcome before = through_the_estimator(c);
  ASSERT_FALSE(before.fit_error.has_value());
  const double inf = std::numeric_limits<double>::infinity();
  for (const double bad : {-1.0, 0.0, -0.0, inf, -inf, std::nan("")}) {
    SCOPED_TRACE("lengthscale " + std::to_string(bad));
    // The estimator.
    GradientHistory history(kCapacity, c.dim);
    for (std::size_t j = 0; j < c.pairs(); ++j) {
      history.push({c.points.data() + j * c.dim, c.dim}, {c.gradients.data() + j * c.dim, c.dim});
    }
    GpGradientEstimator estimator(c.kernel, c.noise, c.scaling, kCapacity);
    estimator.fit(history, c.lengthscale);
    std::string estimator_error;
    try {
      estimator.fit(history, bad);
    } catch (const std::invalid_argument& e) {
      estimator_error = e.what();
    }
    EXPECT_THAT(estimator_error, ::testing::StartsWith("lengthscale: must be finite and > 0, got"));
    estimator.weigh(history, c.query);
    ASSERT_EQ(estimator.weights().size(), before.weights.size());
    for (std::size_t j = 0; j < before.weights.size(); ++j) {
      EXPECT_TRUE(SameBits(estimator.weights()[j], before.weights[j])) << "weight " << j;
    }
    // The engine's backend: the same refusal, and its fit still serves a GP step.
    RecordingPrimitives* recorded = nullptr;
    const std::unique_ptr<detail::EngineBackend> backend = backend_of(c, recorded);
    RecordingPrimitives& record = *recorded;
    (void)backend->fit(c.lengthscale);
    std::string backend_error;
    try {
      (void)backend->fit(bad);
    } catch (const std::invalid_argument& e) {
      backend_error = e.what();
    }
    EXPECT_EQ(backend_error, estimator_error);
    optex::Batch batch;
    detail::BatchAccess::allocate(batch, 2, c.dim, optex::Device::cpu());
    backend->begin_batch(batch);
    backend->proxy_step(batch, 1, detail::ProxySource::gp, {});
    EXPECT_TRUE(backend->finish_batch(batch));
    ASSERT_EQ(record.weighings.size(), 1u);
    ASSERT_EQ(record.weighings.front().weights.size(), before.weights.size());
    for (std::size_t j = 0; j < before.weights.size(); ++j) {
      EXPECT_TRUE(SameBits(record.weighings.front().weights[j], before.weights[j]))
          << "backend weight " << j;
    }
  }
}

}  // namespace

// Problem: any shipped test problem (or a wrapper around one) behind one
// copyable type, so that Python can hand any of them to Rotated or
// WithGradientNoise, which are templates over the problem they wrap. It
// satisfies optex::problems::TestProblem by forwarding every call unchanged:
// results are the wrapped problem's bit for bit.
#pragma once

#include <concepts>
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "optex/problems/problems.hpp"

namespace optex::python {

class Problem {
 public:
  template <problems::TestProblem P>
  requires(!std::same_as<P, Problem>) explicit Problem(P problem)
      : impl_(std::make_shared<const Model<P>>(std::move(problem))) {}

  std::string_view name() const { return impl_->name(); }
  double Evaluate(std::span<const float> x) const { return impl_->Evaluate(x); }
  void Gradient(std::span<const float> x, std::span<float> g) const { impl_->Gradient(x, g); }
  double EvaluateWithGradient(std::span<const float> x, std::span<float> g) const {
    return impl_->EvaluateWithGradient(x, g);
  }
  problems::Domain domain() const { return impl_->domain(); }
  std::vector<float> standard_start(std::size_t d) const { return impl_->standard_start(d); }
  std::vector<float> minimizer(std::size_t d) const { return impl_->minimizer(d); }
  double minimum(std::size_t d) const { return impl_->minimum(d); }

 private:
  struct Concept {
    virtual ~Concept() = default;
    virtual std::string_view name() const = 0;
    virtual double Evaluate(std::span<const float> x) const = 0;
    virtual void Gradient(std::span<const float> x, std::span<float> g) const = 0;
    virtual double EvaluateWithGradient(std::span<const float> x, std::span<float> g) const = 0;
    virtual problems::Domain domain() const = 0;
    virtual std::vector<float> standard_start(std::size_t d) const = 0;
    virtual std::vector<float> minimizer(std::size_t d) const = 0;
    virtual double minimum(std::size_t d) const = 0;
  };

  template <class P>
  struct Model final : Concept {
    explicit Model(P p) : problem(std::move(p)) {}
    std::string_view name() const override { return problem.name(); }
    double Evaluate(std::span<const float> x) const override { return problem.Evaluate(x); }
    void Gradient(std::span<const float> x, std::span<float> g) const override {
      problem.Gradient(x, g);
    }
    double EvaluateWithGradient(std::span<const float> x, std::span<float> g) const override {
      return problem.EvaluateWithGradient(x, g);
    }
    problems::Domain domain() const override { return problem.domain(); }
    std::vector<float> standard_start(std::size_t d) const override {
      return problem.standard_start(d);
    }
    std::vector<float> minimizer(std::size_t d) const override { return problem.minimizer(d); }
    double minimum(std::size_t d) const override { return problem.minimum(d); }

    P problem;
  };

  // Immutable once made (every problem member is const), so copies share it.
  std::shared_ptr<const Concept> impl_;
};

static_assert(problems::TestProblem<Problem>);

}  // namespace optex::python

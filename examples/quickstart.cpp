// The README's C++ quickstart (kept identical to it; a test builds the README's copy).
#include <cstdio>
#include <optex/optex.hpp>

int main() {
  optex::problems::Rosenbrock f;
  std::vector<float> x0 = f.standard_start(20);

  optex::Options options;
  options.parallelism = 4;  // N points per round, evaluated on 4 threads

  optex::Result r = optex::minimize(f, x0, optex::Adam{.lr = 0.02}, options,
                                    optex::Stop{.max_iters = 3000, .target_loss = 1e-3});
  std::printf("loss %.3g after %lld rounds, %lld gradient evaluations (%s)\n", r.fun,
              static_cast<long long>(r.iterations), static_cast<long long>(r.evaluations),
              optex::stop_reason_name(r.stop_reason).data());
}

// The README's C++ quickstart (kept identical to it; a test builds the README's copy).
#include <cstdio>
#include <cstring>
#include <optex/optex.hpp>

// It takes no flags: --help says what it does, anything else is refused (exit 2).
constexpr const char* kHelp =
    "optex_quickstart: minimizes the 20-dimensional Rosenbrock function with OptEx\n"
    "(N = 4 points per round on 4 threads, Adam lr 0.02) until the loss is below 1e-3\n"
    "or 3000 rounds have passed, and prints the loss, rounds and gradient evaluations.\n"
    "No flags: those defaults are fixed in examples/quickstart.cpp.\n";

int main(int argc, char** argv) {
  if (argc > 1) {
    const bool help =
        argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0);
    if (!help) std::fprintf(stderr, "optex_quickstart: unknown argument '%s'\n", argv[1]);
    std::fputs(kHelp, help ? stdout : stderr);
    return help ? 0 : 2;
  }

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

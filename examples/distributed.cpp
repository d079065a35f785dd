// OptEx across processes: one MPI rank per worker, or per GPU with NCCL.
//
//   mpirun -np 4 ./build/examples/optex_distributed                 # N = 4, one point per rank
//   mpirun -np 8 ./build/examples/optex_distributed --data-parallel 2
//                                        # 4 groups x 2 ranks, each group averages 2 minibatches
//   mpirun -np 2 ./build/examples/optex_distributed --backend nccl  # one process per GPU
//   mpirun -np 4 ./build/examples/optex_distributed --timeout 30     # a lost rank ends the run in
//   30 s
//   mpirun -np 4 ./build/examples/optex_distributed --shard-state --dim 1000000
//                                        # each rank holds 1/4 of the optimizer state and history
//
// Every rank parses its own command line; before anything else the ranks
// agree on it (optex/distributed/startup_agreement.hpp), so a bad flag or --help on one
// rank, or settings that differ between ranks, end every rank at once with a
// message naming the rank and the reason.
//
// The objective is Rosenbrock with minibatch noise: a stochastic gradient
// whose noise is a pure function of the minibatch seed, so every run with the
// same seed follows the same trajectory on every rank.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optex/distributed/distributed_minimize.hpp>
#include <optex/distributed/mpi_communicator.hpp>
#include <optex/distributed/startup_agreement.hpp>
#include <optex/problems/problems.hpp>
#include <optex/sharded/sharded_engine.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>
#if OPTEX_HAVE_NCCL
#include <optex/distributed/nccl_communicator.hpp>
#endif

namespace {

// Rosenbrock plus N(0, sigma^2) per coordinate, drawn from the minibatch seed.
struct NoisyRosenbrock {
  double sigma = 0.1;
  double EvaluateWithGradient(std::span<const float> x, std::span<float> g,
                              std::uint64_t seed) const {
    const double f = optex::problems::Rosenbrock().EvaluateWithGradient(x, g);
    optex::SplitMix64 rng(seed);
    for (float& v : g) v += static_cast<float>(sigma * rng.normal());
    return f;
  }
};

// The rounds of a sharded engine (sharded_engine.hpp): each rank evaluates
// its rows, whole, and holds a slice of everything else.
double run_sharded(const NoisyRosenbrock& f, std::span<const float> x0, double lr,
                   const optex::Options& options, optex::Communicator& comm,
                   const optex::DistributedOptions& distributed, long iterations) {
  optex::ShardedEngine engine(x0, optex::Adam{.lr = lr}, options, comm, distributed);
  double loss = 0.0;
  for (long t = 0; t < iterations; ++t) {
    optex::ShardedBatch& b = engine.ask();
    for (int i : b.rows()) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i), b.seed(i));
    const optex::IterationInfo& info = engine.tell(b);
    loss = info.loss;
    if (comm.rank() == 0 && info.iteration % 10 == 0) {
      std::printf("round %4lld  loss %.6g  cosine %.3f\n", static_cast<long long>(info.iteration),
                  info.loss, info.cosine);
    }
  }
  return loss;
}

int run(int argc, char** argv, optex::MpiCommunicator& world) {
  CLI::App app{
      "optex_distributed: OptEx across processes, launched with mpirun: one MPI rank per "
      "worker (or per GPU with --backend nccl). It minimizes Rosenbrock with seeded "
      "minibatch noise for --iterations rounds, N points per round evaluated by groups of "
      "--data-parallel ranks, printing the loss every 10 rounds and the final loss. Every rank "
      "must get the same flags: the ranks agree on them before running, so a bad flag or "
      "--help on one rank ends every rank at once.\n",
      "optex_distributed"};
  app.footer("\n--flag TYPE=VALUE: VALUE is the default; --shard-state is off by default.\n");
  // Every option shows its default in the help ("--dim UINT=1000").
  app.option_defaults()->always_capture_default();
  std::size_t dim = 1000;
  int parallelism = 0;
  int data_parallel = 1;
  long iterations = 100;
  double lr = 0.01;
  double sigma = 0.1;
  double timeout = optex::Communicator::kDefaultTimeout.count();
  std::string backend = "mpi";
  bool shard_state = false;
  app.add_option("--dim", dim, "dimension of the problem (>= 1)");
  app.add_option("--parallelism", parallelism,
                 "N: points per iteration, in [1, 65536]; 0 (the default): one per group of ranks")
      ->check(CLI::Range(1, optex::kMaxParallelism));
  app.add_option("--data-parallel", data_parallel,
                 "D: ranks per group averaging their minibatch gradients")
      ->check(CLI::PositiveNumber);
  app.add_option("--iterations", iterations, "rounds")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "Adam learning rate")->check(CLI::PositiveNumber);
  app.add_option("--sigma", sigma, "gradient noise per coordinate")->check(CLI::NonNegativeNumber);
  app.add_option("--timeout", timeout,
                 "seconds a rank waits for the others in a collective before the run aborts "
                 "(positive, finite)");
  app.add_option("--backend", backend, "mpi (host rows) or nccl (device rows, one GPU per rank)")
      ->check(CLI::IsMember({"mpi", "nccl"}));
  app.add_flag("--shard-state", shard_state,
               "each rank holds its slice of the iterate, optimizer state and history "
               "(ShardedEngine; CPU, host communicators)");

  // Every rank parses its own command line; the ranks then agree on the
  // outcome before any other collective, so that a rank with a bad flag (or
  // --help) does not leave the others waiting for it.
  optex::StartupStatus status;
  try {
    app.parse(argc, argv);
    if (dim < 1) throw std::invalid_argument("--dim: must be >= 1, got 0");
    try {
      world.set_timeout(optex::Communicator::Seconds{timeout});
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--") + e.what());  // "--timeout: must be ..."
    }
  } catch (const CLI::CallForHelp&) {
    status.kind = optex::StartupStatus::Kind::help;
  } catch (const CLI::ParseError& e) {
    status.fail(e.what());
  } catch (const std::invalid_argument& e) {
    status.fail(e.what());
  }
  if (parallelism == 0) parallelism = world.size() / std::max(1, data_parallel);
  status.add("--dim", dim);
  status.add("--parallelism", parallelism);
  status.add("--data-parallel", data_parallel);
  status.add("--iterations", iterations);
  status.add("--lr", lr);
  status.add("--sigma", sigma);
  status.add("--timeout", timeout);
  status.add("--backend", backend);
  status.add("--shard-state", shard_state);
  const optex::StartupOutcome agreed = optex::agree_on_startup(world, status);
  if (!optex::report_startup(agreed, world, "optex_distributed", app.help()))
    return agreed.exit_code;

  optex::Options options;
  options.parallelism = parallelism;
  optex::DistributedOptions distributed;
  distributed.data_parallel = data_parallel;

  // The communicator that moves the gradients: MPI itself, or NCCL
  // bootstrapped over MPI, with the engine on the GPU NCCL picked.
  optex::Communicator* comm = &world;
  std::unique_ptr<optex::Communicator> nccl;
  if (backend == "nccl") {
#if OPTEX_HAVE_NCCL
    nccl = optex::NcclCommunicator::create(world);
    options.device = nccl->row_device();
    comm = nccl.get();
#else
    if (world.rank() == 0) std::fprintf(stderr, "this build of optex has no NCCL backend\n");
    return 2;
#endif
  }

  const std::vector<float> x0 = optex::problems::Rosenbrock().standard_start(dim);
  const NoisyRosenbrock f{sigma};
  if (shard_state) {
    const double loss = run_sharded(f, x0, lr, options, *comm, distributed, iterations);
    if (world.rank() == 0) {
      std::printf(
          "%d ranks (sharded state, %d groups x %d data-parallel), N = %d: loss %.6g after "
          "%ld rounds\n",
          world.size(), world.size() / data_parallel, data_parallel, options.parallelism, loss,
          iterations);
    }
    return 0;
  }
  const optex::Result r = optex::minimize_distributed(
      f, x0, optex::Adam{.lr = lr}, options, *comm, distributed,
      optex::Stop{.max_iters = iterations}, [&](const optex::IterationInfo& info) {
        if (world.rank() == 0 && info.iteration % 10 == 0) {
          std::printf("round %4lld  loss %.6g  cosine %.3f\n",
                      static_cast<long long>(info.iteration), info.loss, info.cosine);
        }
      });
  if (world.rank() == 0) {
    std::printf(
        "%d ranks (%s, %d groups x %d data-parallel), N = %d: loss %.6g after %lld rounds, "
        "%lld gradient evaluations\n",
        world.size(), backend.c_str(), world.size() / data_parallel, data_parallel,
        options.parallelism, r.fun, static_cast<long long>(r.iterations),
        static_cast<long long>(r.evaluations));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  optex::MpiSession mpi(&argc, &argv);
  optex::MpiCommunicator world;
  try {
    return run(argc, argv, world);
  } catch (const std::exception& e) {
    // Every rank sees the same RankFailure, RankDivergence or bad argument
    // and leaves cleanly; anything else (a timeout, a local error) ends the whole job.
    if (dynamic_cast<const optex::RankFailure*>(&e) ||
        dynamic_cast<const optex::RankDivergence*>(&e) ||
        dynamic_cast<const std::invalid_argument*>(&e)) {
      if (world.rank() == 0) std::fprintf(stderr, "optex_distributed: %s\n", e.what());
      return 1;
    }
    world.abort(e.what());
    return 1;
  }
}

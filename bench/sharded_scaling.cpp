// Sharded against replicated state under mpirun: per-rank memory, time per
// round and bytes sent per round, side by side in one run.
//
//   mpirun -np W ./build/bench/sharded_scaling --json out.json --markdown out.md
//
// For each --dims d (Sphere, Adam, N = --parallelism, T0 = --history):
// 1. Memory: the growth of this process's resident set while each engine is
//    built and runs two rounds, the other not alive (the larger over ranks),
//    next to ShardMemory's formula.
// 2. Time and bytes: both engines alive, --repeats alternations of --rounds
//    rounds each, after rounds that fill the history; the median seconds per
//    round, and the payload each rank
//    sends per round (the engine's CommunicationStats: for the replicated
//    layout its share of the all-gather, which reaches W - 1 ranks; for the
//    sharded one its all-to-all sends, each to one rank, and the all-reduces).
// 3. A model of both at --model-dim, --model-ranks (d = 1e9, W = 8 by default)
//    from the same formula, nothing allocated.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optex/distributed/distributed_engine.hpp>
#include <optex/distributed/mpi_communicator.hpp>
#include <optex/problems/problems.hpp>
#include <optex/sharded/sharded_engine.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "list_flag.hpp"
#include "output_file.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// This process's resident set, in bytes (VmRSS).
double resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      double kib = 0.0;
      status >> kib;
      return kib * 1024.0;
    }
    status.ignore(1 << 16, '\n');
  }
  return std::nan("");
}

// One round of either engine on the sphere: each rank evaluates its rows.
void round(optex::DistributedEngine& e) {
  const optex::problems::Sphere f;
  optex::Batch& b = e.ask();
  for (int i : e.my_points()) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
  e.tell(b);
}
void round(optex::ShardedEngine& e) {
  const optex::problems::Sphere f;
  optex::ShardedBatch& b = e.ask();
  for (int i : b.rows()) b.loss(i) = f.EvaluateWithGradient(b.point(i), b.grad(i));
  e.tell(b);
}

// The largest growth of the resident set over the ranks while `make` builds an
// engine and runs two rounds.
template <class Make>
double measured_memory(optex::Communicator& world, Make&& make) {
  world.barrier();
  const double before = resident_bytes();
  {
    auto engine = make();
    round(engine);
    round(engine);
    double grown = resident_bytes() - before;
    world.all_reduce(std::span<double>(&grown, 1), optex::ReduceOp::max);
    return grown;
  }
}

struct Timing {
  std::vector<double> seconds;  // per round, one entry per repeat (a median of rounds)
  double bytes_per_round = 0.0;
  double collectives_per_round = 0.0;
};

template <class Engine>
void time_rounds(Engine& e, int rounds, Timing& t) {
  const auto bytes = e.communication().bytes_sent;
  const auto collectives = e.communication().collectives;
  std::vector<double> each;
  for (int k = 0; k < rounds; ++k) {
    const auto start = Clock::now();
    round(e);
    each.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  t.seconds.push_back(median(each));
  t.bytes_per_round = static_cast<double>(e.communication().bytes_sent - bytes) / rounds;
  t.collectives_per_round =
      static_cast<double>(e.communication().collectives - collectives) / rounds;
}

// Replicated: every rank holds the whole engine (the formula at W = 1, whose
// "whole rows" are the batch's own N rows instead).
optex::ShardMemory replicated_memory(std::size_t d, const optex::Options& o) {
  optex::ShardMemory m = optex::shard_memory(d, 1, 0, o, optex::Adam{});
  m.rows = static_cast<std::size_t>(3 * o.parallelism - 1) * d * sizeof(float);
  return m;
}

std::string gib(double bytes) {
  std::ostringstream s;
  s.precision(3);
  s << bytes / (1024.0 * 1024.0 * 1024.0);
  return s.str();
}
std::string gib(std::size_t bytes) { return gib(static_cast<double>(bytes)); }

}  // namespace

int main(int argc, char** argv) {
  optex::MpiSession mpi(&argc, &argv);
  optex::MpiCommunicator world;
  CLI::App app{"Sharded against replicated state under mpirun: memory, time and bytes per round"};
  std::string dims_text = "1e6,4e6";
  int parallelism = 4, history = 32, rounds = 5, repeats = 3;
  double model_dim = 1e9;
  int model_ranks = 8;
  std::string json_path, markdown_path;
  app.add_option("--dims", dims_text, "dimensions, comma-separated");
  app.add_option("--parallelism", parallelism, "N")->check(CLI::Range(2, 64));
  app.add_option("--history", history, "T0")->check(CLI::Range(2, 4096));
  app.add_option("--rounds", rounds, "rounds per timed run")->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "alternations of the two layouts")
      ->check(CLI::PositiveNumber);
  app.add_option("--model-dim", model_dim, "d of the model rows")->check(CLI::Range(1e4, 1e12));
  app.add_option("--model-ranks", model_ranks, "W of the model rows")->check(CLI::Range(1, 4096));
  app.add_option("--json", json_path, "write the results as JSON (rank 0)");
  app.add_option("--markdown", markdown_path, "write the results as Markdown (rank 0)");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::size_t> dims;
  try {
    dims = optex_bench::dimension_list("--dims", dims_text);
  } catch (const std::invalid_argument& e) {
    if (world.rank() == 0) std::fprintf(stderr, "sharded_scaling: error: %s\n", e.what());
    return 2;
  }
  optex::Options o;
  o.parallelism = parallelism;
  o.history = history;
  const int w = world.size();

  std::ostringstream md, json;
  md << "W = " << w << " ranks (" << world.backend() << "), N = " << parallelism
     << ", T0 = " << history << ", Adam, Sphere; median of " << repeats << " x " << rounds
     << " rounds; memory = largest growth of a rank's resident set (GiB)\n\n"
     << "| d | layout | memory measured | memory formula | s / round | MB sent / rank / round | "
        "collectives / round |\n|---|---|---|---|---|---|---|\n";
  json << "{\n  \"world_size\": " << w << ", \"parallelism\": " << parallelism
       << ", \"history\": " << history << ",\n  \"rows\": [\n";
  bool first_row = true;
  for (std::size_t d : dims) {
    const std::vector<float> x0 = optex::problems::Sphere().standard_start(d);
    const double sharded_rss = measured_memory(
        world, [&] { return optex::ShardedEngine(x0, optex::Adam{}, o, world, {}, true); });
    const double replicated_rss = measured_memory(
        world, [&] { return optex::DistributedEngine(x0, optex::Adam{}, o, world); });
    optex::ShardedEngine sharded(x0, optex::Adam{}, o, world, {}, true);
    optex::DistributedEngine replicated(x0, optex::Adam{}, o, world);
    // Until the history is full, so that every timed round fits and predicts.
    for (int k = 0; k <= history / parallelism; ++k) {
      round(sharded);
      round(replicated);
    }
    Timing ts, tr;
    for (int k = 0; k < repeats; ++k) {
      time_rounds(sharded, rounds, ts);
      time_rounds(replicated, rounds, tr);
    }
    double formula[2] = {static_cast<double>(sharded.memory().total()),
                         static_cast<double>(replicated_memory(d, o).total())};
    world.all_reduce(std::span<double>(formula, 1), optex::ReduceOp::max);
    const struct {
      const char* name;
      double rss, formula;
      const Timing& t;
    } rows[] = {{"sharded", sharded_rss, formula[0], ts},
                {"replicated", replicated_rss, formula[1], tr}};
    for (const auto& r : rows) {
      md << "| " << d << " | " << r.name << " | " << gib(r.rss) << " | " << gib(r.formula) << " | "
         << median(r.t.seconds) << " | " << r.t.bytes_per_round / 1e6 << " | "
         << r.t.collectives_per_round << " |\n";
      json << (first_row ? "" : ",\n") << "    {\"dim\": " << d << ", \"layout\": \"" << r.name
           << "\", \"memory_measured_bytes\": " << r.rss
           << ", \"memory_formula_bytes\": " << r.formula
           << ", \"seconds_per_round\": " << median(r.t.seconds)
           << ", \"bytes_sent_per_rank_per_round\": " << r.t.bytes_per_round
           << ", \"collectives_per_round\": " << r.t.collectives_per_round << "}";
      first_row = false;
    }
  }
  // The model: per-rank bytes from the formula; bytes sent per rank per round
  // from the exchanges' sizes (fp32, D = 1, the first rank's rows).
  const auto md_dim = static_cast<std::size_t>(model_dim);
  const double s = static_cast<double>(optex::shard_of(md_dim, model_ranks, 0).size);
  const double rows = std::ceil(static_cast<double>(parallelism) / model_ranks);
  const double sums = 8.0 * ((parallelism - 1) * history + 4 * (parallelism - 1) + 2 +
                             parallelism * (2 * history + 1));
  const double sharded_sent = 4.0 * (parallelism * s + rows * (model_dim - s)) + sums;
  const double replicated_sent = 4.0 * rows * model_dim;
  const optex::ShardMemory m = optex::shard_memory(md_dim, model_ranks, 0, o, optex::Adam{});
  md << "\nModel, d = " << model_dim << ", W = " << model_ranks
     << " (formula, nothing allocated)\n\n"
     << "| layout | history GiB / rank | total GiB / rank | GB sent / rank / round | "
        "GB on the wire / round, whole job |\n|---|---|---|---|---|\n"
     << "| sharded | " << gib(m.history) << " | " << gib(m.total()) << " | " << sharded_sent / 1e9
     << " | " << sharded_sent * model_ranks / 1e9 << " |\n"
     << "| replicated | " << gib(replicated_memory(md_dim, o).history) << " | "
     << gib(replicated_memory(md_dim, o).total()) << " | " << replicated_sent / 1e9 << " | "
     << 4.0 * parallelism * model_dim * (model_ranks - 1) / 1e9 << " |\n";
  json << "\n  ],\n  \"model\": {\"dim\": " << model_dim << ", \"ranks\": " << model_ranks
       << ", \"sharded_history_bytes\": " << m.history << ", \"sharded_total_bytes\": " << m.total()
       << ", \"replicated_total_bytes\": " << replicated_memory(md_dim, o).total()
       << ", \"sharded_sent_bytes_per_round\": " << sharded_sent
       << ", \"replicated_sent_bytes_per_round\": " << replicated_sent << "}\n}\n";
  if (world.rank() != 0) return 0;
  std::printf("%s", md.str().c_str());
  return optex_bench::write_results("sharded_scaling", markdown_path, md.str(), json_path,
                                    json.str());
}

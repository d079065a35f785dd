// optex-bench: OptEx next to what else its N workers could do, at the same budget
// of gradient evaluations per sequential round, over seeds (DESIGN.md section 5).
//
//   ./build/bench/optex-bench --preset paper --json paper.json --markdown paper.md
//   ./build/bench/optex-bench --problem sphere,rotated_ackley --dim 1000 --parallelism 2,4,8
//
// The methods and their budgets: methods.hpp. Learning-rate tuning and the
// target: experiment.hpp. Presets: presets.cpp. Output schema: report.hpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <optex/engine/iteration_info.hpp>
#include <optex/util/progress_bar.hpp>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "../output_file.hpp"
#include "command_line.hpp"
#include "experiment.hpp"
#include "methods.hpp"
#include "problem_factory.hpp"
#include "report.hpp"
#include "summary.hpp"

namespace {

using optex_bench::MethodKind;
using optex_bench::MethodSpec;
using optex_bench::Settings;
using optex_bench::Task;

std::vector<Task> build_tasks(const Settings& s) {
  std::vector<std::string> names;
  for (const std::string& p : s.problems) {
    const std::string name = s.rotated ? optex_bench::rotated_name(p) : p;
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  std::vector<Task> tasks;
  for (const std::string& name : names) {
    try {
      tasks.push_back(optex_bench::make_task(name, s.dim, s.noise));
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      if (what.starts_with("unknown problem")) {
        throw std::invalid_argument("--problem: " + what);
      }
      throw std::invalid_argument("--dim: " + std::to_string(s.dim) + " does not suit --problem " +
                                  name + " (" + what + ")");
    }
  }
  return tasks;
}

// The methods in order, vanilla first: it sets the target and the speedups.
std::vector<MethodSpec> build_methods(const Settings& s, bool quiet) {
  const std::vector<std::string>& names =
      s.methods.empty() ? optex_bench::standard_method_names() : s.methods;
  std::vector<MethodSpec> methods;
  for (const std::string& name : names) {
    MethodSpec spec;
    try {
      spec = optex_bench::parse_method(name);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--methods: ") + e.what());
    }
    if (std::any_of(methods.begin(), methods.end(),
                    [&](const MethodSpec& m) { return m.name == spec.name; })) {
      throw std::invalid_argument("--methods: '" + name + "' is listed twice");
    }
    // Before the run: evaluations=3 at N = 4 would otherwise fail every one of its runs.
    for (int n : s.parallelism) {
      try {
        optex_bench::check_method_for_parallelism(spec, n);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string("--methods: ") + e.what());
      }
    }
    methods.push_back(spec);
  }
  const auto vanilla = std::find_if(methods.begin(), methods.end(), [](const MethodSpec& m) {
    return m.kind == MethodKind::vanilla;
  });
  if (vanilla == methods.end()) {
    if (!quiet) std::cerr << "optex-bench: adding vanilla: it sets the target and the speedups\n";
    methods.insert(methods.begin(), optex_bench::parse_method("vanilla"));
  } else {
    std::rotate(methods.begin(), vanilla, vanilla + 1);
  }
  return methods;
}

// Opens an output file before the (possibly long) run, so a bad path fails first.
std::unique_ptr<optex_bench::OutputFile> open_output(const std::string& flag,
                                                     const std::string& path) {
  if (path.empty()) return nullptr;
  try {
    return std::make_unique<optex_bench::OutputFile>(flag, path);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const auto parsed = optex_bench::parse_command_line(argc, argv);
  if (const int* exit_code = std::get_if<int>(&parsed)) return *exit_code;
  const optex_bench::CommandLine& cl = std::get<optex_bench::CommandLine>(parsed);
  const Settings& settings = cl.settings;

  std::vector<Task> tasks;
  std::vector<MethodSpec> methods;
  std::unique_ptr<optex_bench::OutputFile> json, markdown;
  try {
    tasks = build_tasks(settings);
    methods = build_methods(settings, cl.quiet);
    json = open_output("--json", cl.json_path);
    markdown = open_output("--markdown", cl.markdown_path);
  } catch (const std::invalid_argument& e) {
    std::cerr << "optex-bench: error: " << e.what() << "\n";
    return 2;
  }

  const auto start = std::chrono::steady_clock::now();
  const std::int64_t total = optex_bench::count_runs(settings, tasks.size(), methods);
  std::unique_ptr<optex::ProgressBar> bar;
  if (!cl.quiet) bar = std::make_unique<optex::ProgressBar>(total);
  std::int64_t done = 0;
  const optex_bench::RunObserver observer = [&](double final_loss) {
    ++done;
    if (!bar) return;
    optex::IterationInfo info;  // the bar counts runs here, not rounds
    info.iteration = done;
    info.loss = final_loss;
    info.cosine = std::numeric_limits<double>::quiet_NaN();
    (*bar)(info);
  };
  const auto outcomes = optex_bench::run_experiment(settings, tasks, methods, observer);
  bar.reset();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const auto summary = optex_bench::summarize(settings, outcomes);
  const optex_bench::RunMetadata meta = optex_bench::describe_run(argc, argv);
  if (!cl.quiet) {
    optex_bench::write_markdown(std::cout, meta, settings, summary);
    std::fprintf(stderr, "optex-bench: %lld runs in %.1f s\n", static_cast<long long>(total),
                 seconds);
  }
  if (json) optex_bench::write_json(json->stream(), meta, settings, methods, outcomes, summary);
  if (markdown) optex_bench::write_markdown(markdown->stream(), meta, settings, summary);
  // Each file is finished on its own: one lost file does not lose the other.
  int status = 0;
  for (const auto* file : {&json, &markdown}) {
    if (!*file) continue;
    try {
      (*file)->finish();
    } catch (const std::runtime_error& e) {
      std::cerr << "optex-bench: error: " << e.what() << "\n";
      status = 1;
    }
  }
  return status;
}

// The output files: JSON in the schema shared with the Python runners
// ("optex-bench/1"), and a Markdown summary table.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "experiment.hpp"
#include "methods.hpp"
#include "settings.hpp"
#include "summary.hpp"

namespace optex_bench {

// Where and how the benchmark ran.
struct RunMetadata {
  std::string command;  // argv joined by spaces
  std::string date;     // YYYY-MM-DD, local time
  std::string machine;  // CPU model from /proc/cpuinfo and the core count
};

RunMetadata describe_run(int argc, char** argv);

// How the reported target is set, in words (for --help, JSON and Markdown).
std::string target_rule(const Settings& settings);

// Non-finite numbers are written as null; doubles in their shortest exact form.
void write_json(std::ostream& out, const RunMetadata& meta, const Settings& settings,
                const std::vector<MethodSpec>& methods, const std::vector<TaskOutcome>& tasks,
                const std::vector<SummaryRow>& summary);

void write_markdown(std::ostream& out, const RunMetadata& meta, const Settings& settings,
                    const std::vector<SummaryRow>& summary);

}  // namespace optex_bench

// optex-plan's flags, checked before anything is measured.
#pragma once

#include <optional>
#include <string>
#include <variant>

#include "optex/planning/plan.hpp"

namespace optex_plan {

struct CommandLine {
  // Everything but gradient_seconds when a problem is to be timed.
  optex::PlanRequest request;
  std::optional<double> gradient_seconds;  // --gradient-seconds
  std::string problem;                     // --problem (empty: none)
};

// The parsed command line, or the exit status to end with: 0 after --help,
// 2 after a message on stderr naming the flag that is wrong.
std::variant<CommandLine, int> parse_command_line(int argc, char** argv);

// The shipped problems --problem accepts, comma-separated.
std::string problem_names();

}  // namespace optex_plan

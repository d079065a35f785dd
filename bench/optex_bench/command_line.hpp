// The command line: CLI11 flags, a preset's defaults, explicit flags on top, and
// the checks that name the offending flag and value.
#pragma once

#include <string>
#include <variant>

#include "settings.hpp"

namespace optex_bench {

struct CommandLine {
  Settings settings;
  std::string json_path;      // empty: no JSON file
  std::string markdown_path;  // empty: no Markdown file
  bool quiet = false;         // no progress bar, no summary table on stdout
};

// The parsed command line, or the exit code to stop with (0 after --help; non-zero
// after a message on stderr that names the bad flag and its value).
std::variant<CommandLine, int> parse_command_line(int argc, char** argv);

}  // namespace optex_bench

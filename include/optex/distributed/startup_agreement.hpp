// The start-up handshake of a program that parses its command line on every
// rank (examples/distributed.cpp, bench/distributed_scaling.cpp).
//
// Every rank parses its own arguments; a rank with a bad flag, or one that
// printed --help, must not leave the others waiting in their first
// collective until the timeout. So, right after parsing, every rank calls
// agree_on_startup with what it made of its arguments, and all learn the
// same outcome in one bounded exchange:
//
//   optex::StartupStatus status;  // ok, failed (with the reason) or help
//   status.add("--iterations", iterations); ...
//   const optex::StartupOutcome outcome = optex::agree_on_startup(world, status);
//   if (!optex::report_startup(outcome, world, "my_program", app.help()))
//     return outcome.exit_code;
//
// The ranks run only if every rank parsed its arguments and they all agree
// on every setting; otherwise every rank has the same message, naming in
// rank order each rank that failed and why, or the first setting on which
// the ranks disagree and the two values.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "optex/distributed/communicator.hpp"

namespace optex {

// What one rank made of its command line.
struct StartupStatus {
  enum class Kind : std::uint8_t {
    ok,      // parsed; `settings` describe the run
    failed,  // `reason` says why
    help,    // asked for --help: nothing to run
  };
  Kind kind = Kind::ok;
  std::string reason;
  // The settings every rank must share, as (name, value) text in a fixed
  // order: the command line's values after defaults.
  std::vector<std::pair<std::string, std::string>> settings;

  void add(std::string name, std::string value);
  void add(std::string name, double value);  // the shortest text that reads back the same
  template <std::integral T>
  void add(std::string name, T value) {
    add(std::move(name), std::to_string(value));
  }
  void add(std::string name, const char* value) { add(std::move(name), std::string(value)); }
  void fail(std::string why) {
    kind = Kind::failed;
    reason = std::move(why);
  }
};

struct StartupOutcome {
  bool run = false;  // every rank parsed its arguments and the settings agree
  bool print_help =
      false;          // this rank prints its help: rank 0 if every rank asked, else each that asked
  int exit_code = 0;  // when !run: 0 when every rank asked for help, else 2
  std::string message;  // when exit_code != 0: the same text on every rank
};

// Collective over `comm`, bounded by its timeout (two all-gathers).
StartupOutcome agree_on_startup(Communicator& comm, const StartupStatus& mine);

// What a program does with the outcome on this rank: prints `help` to stdout
// when asked, the failure to stderr as "<program>: rank r of n: <message>", and
// returns whether to run (when not, the program exits with outcome.exit_code).
bool report_startup(const StartupOutcome& outcome, const Communicator& comm,
                    std::string_view program, const std::string& help);

// Collective: the first setting (in rank 0's order, at the lowest rank that
// differs) on which a rank differs from rank 0, as "ranks disagree on NAME:
// rank 0 has A, rank r has B"; empty when every rank has the same settings.
std::string first_disagreement(Communicator& comm,
                               const std::vector<std::pair<std::string, std::string>>& settings);

}  // namespace optex

// Command-line values read as numbers, shared by optex-plan and the benchmark
// runners: all of the text or nothing, and a refusal that names the flag,
// its value and what it must be ("--dim: must be an integer in [1, 100], got
// '-3'"). Header-only: the tools and the benchmarks build apart.
#pragma once

#include <cmath>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace optex::flags {

// "1e5" and "100000" alike; std::nullopt for "", "1e5x" or anything std::stod
// refuses. Infinities and NaN parse: finiteness is the caller's requirement.
inline std::optional<double> whole_number(const std::string& text) {
  std::size_t used = 0;
  double v = 0.0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size()) return std::nullopt;
  return v;
}

[[noreturn]] inline void reject(std::string_view flag, const std::string& value,
                                std::string_view requirement) {
  throw std::invalid_argument(std::string(flag) + ": " + std::string(requirement) + ", got '" +
                              value + "'");
}

// An integer in [lowest, highest], written as any number ("1e5" too).
inline long long parse_integer(std::string_view flag, const std::string& text, long long lowest,
                               long long highest) {
  const std::optional<double> v = whole_number(text);
  if (!v) reject(flag, text, "must be a number");
  if (!std::isfinite(*v) || *v != std::floor(*v) || *v < static_cast<double>(lowest) ||
      *v > static_cast<double>(highest)) {
    reject(
        flag, text,
        "must be an integer in [" + std::to_string(lowest) + ", " + std::to_string(highest) + "]");
  }
  return static_cast<long long>(*v);
}

}  // namespace optex::flags

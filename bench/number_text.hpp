// A flag value or list item read as a number: all of the text, or nothing. The
// callers say what range they accept and name the flag in their own message.
#pragma once

#include <exception>
#include <optional>
#include <string>

namespace optex_bench {

// "1e5" and "100000" alike; std::nullopt for "", "1e5x" or anything std::stod refuses.
// Infinities and NaN parse: finiteness is the caller's requirement.
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

}  // namespace optex_bench

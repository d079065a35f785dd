// The planner's numbers as text (plan_text.hpp).
#include "planning/plan_text.hpp"

#include <cmath>
#include <cstdio>
#include <string>

namespace optex::detail {

std::string number(double v) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.17g", v);
  return text;
}

// A duration for the report: 3 significant digits in s, ms or us.
std::string duration(double seconds) {
  char text[64];
  if (std::isnan(seconds)) return "-";
  if (std::isinf(seconds)) return "never";
  if (seconds >= 1.0) {
    std::snprintf(text, sizeof(text), "%.3g s", seconds);
  } else if (seconds >= 1e-3 || seconds == 0.0) {
    std::snprintf(text, sizeof(text), "%.3g ms", seconds * 1e3);
  } else {
    std::snprintf(text, sizeof(text), "%.3g us", seconds * 1e6);
  }
  return text;
}

// An interval for the report, both ends in the unit of the larger:
// "[20.1, 22.8] ms".
std::string interval(double low, double high) {
  char text[96];
  if (std::isnan(low) || std::isnan(high)) return "-";
  if (std::isinf(high)) {
    std::string bounded = "[";
    bounded += duration(low);
    bounded += ", never]";
    return bounded;
  }
  double scale = 1.0;
  const char* unit = "s";
  if (high < 1e-3 && high != 0.0) {
    scale = 1e6;
    unit = "us";
  } else if (high < 1.0) {
    scale = 1e3;
    unit = "ms";
  }
  std::snprintf(text, sizeof(text), "[%.3g, %.3g] %s", low * scale, high * scale, unit);
  return text;
}

}  // namespace optex::detail

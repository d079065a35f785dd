// The demo's verdict on one method against a reference (plain Adam, or the best
// same-budget baseline): how many times fewer sequential rounds the method needs
// to reach the target. Header-only so that a unit test
// (tests/examples/test_demo_speedup.cpp) checks exactly what the demo prints.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace optex_demo {

// Median rounds of a method that never reached the target within its budget.
inline constexpr double kNever = 1e9;

enum class Verdict {
  neither,  // neither reached the target: nothing to compare
  win,      // the method reached it in fewer rounds, or alone
  tie,      // the same rounds
  loss,     // the method needed more rounds, or never reached it
};

inline Verdict verdict(double reference_rounds, double method_rounds) {
  const bool reference_reached = reference_rounds < kNever;
  const bool method_reached = method_rounds < kNever;
  if (!reference_reached && !method_reached) return Verdict::neither;
  if (!reference_reached) return Verdict::win;
  if (!method_reached) return Verdict::loss;
  if (method_rounds < reference_rounds) return Verdict::win;
  return method_rounds > reference_rounds ? Verdict::loss : Verdict::tie;
}

// The ratio reference rounds / method rounds as the demo prints it: "2.40x" for a
// win; "0.62x loss" when the method is slower, so that a loss cannot be misread as
// a speedup; "win" / "loss" when only one of them reached the target; "-" when
// neither did. A loss is rounded down ("0.99x loss", never "1.00x loss").
inline std::string speedup_text(double reference_rounds, double method_rounds) {
  const Verdict v = verdict(reference_rounds, method_rounds);
  if (v == Verdict::neither) return "-";
  if (reference_rounds >= kNever) return "win";
  if (method_rounds >= kNever) return "loss";
  double ratio = reference_rounds / method_rounds;
  if (v == Verdict::loss) ratio = std::floor(ratio * 100.0) / 100.0;
  char text[32];
  std::snprintf(text, sizeof text, "%.2fx%s", ratio, v == Verdict::loss ? " loss" : "");
  return text;
}

}  // namespace optex_demo

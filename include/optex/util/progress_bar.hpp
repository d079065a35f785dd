// A terminal progress bar, used as a minimize() callback:
//   optex::minimize(f, x0, opt, options, stop, optex::ProgressBar(stop.max_iters));
// It draws only when the stream is a terminal (or when forced), so logs and
// CI output stay clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>

#include "optex/engine/iteration_info.hpp"

namespace optex {

class ProgressBar {
 public:
  explicit ProgressBar(std::int64_t total_iterations);
  // Draws on `out` whatever it is (for tests and for redirected logs).
  ProgressBar(std::int64_t total_iterations, std::ostream& out);
  // Ends the line if a run stopped before the total (target reached, callback).
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Never asks to stop.
  bool operator()(const IterationInfo& info);

 private:
  std::int64_t total_;
  std::ostream* out_;
  bool enabled_;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace optex

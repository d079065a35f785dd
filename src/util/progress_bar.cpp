#include "optex/util/progress_bar.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

namespace optex {

ProgressBar::ProgressBar(std::int64_t total_iterations)
    : total_(total_iterations),
      out_(&std::cerr),
      enabled_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::ProgressBar(std::int64_t total_iterations, std::ostream& out)
    : total_(total_iterations),
      out_(&out),
      enabled_(true),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() {
  if (line_open_) *out_ << std::endl;
}

bool ProgressBar::operator()(const IterationInfo& info) {
  if (!enabled_) return false;
  constexpr int kWidth = 30;
  const double fraction =
      total_ > 0 ? std::min(1.0, static_cast<double>(info.iteration) / static_cast<double>(total_))
                 : 0.0;
  const int filled = static_cast<int>(fraction * kWidth);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  char line[160];
  std::snprintf(
      line, sizeof line, "] %lld/%lld loss %.4e cos %s %.1fs",
      static_cast<long long>(info.iteration), static_cast<long long>(total_), info.loss,
      std::isnan(info.cosine) ? "  -  " : std::to_string(info.cosine).substr(0, 5).c_str(),
      seconds);
  *out_ << '\r' << '[' << std::string(static_cast<std::size_t>(filled), '#')
        << std::string(static_cast<std::size_t>(kWidth - filled), ' ') << line;
  line_open_ = info.iteration < total_;
  if (!line_open_) *out_ << '\n';
  out_->flush();
  return false;
}

}  // namespace optex

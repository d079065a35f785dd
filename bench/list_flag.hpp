// The items of a comma-separated flag value. An empty item ("sphere,,rosenbrock",
// a trailing comma) is a typo, never "nothing": it is refused with the flag and
// the item's position, and so is an item listed twice, which would run the same
// thing twice under one name.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "number_text.hpp"

namespace optex_bench {

// "--problem: item 2 of 'sphere,,rosenbrock' is empty".
inline std::vector<std::string> split_list(std::string_view flag, const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    items.push_back(text.substr(start, comma == std::string::npos ? comma : comma - start));
    if (items.back().empty()) {
      throw std::invalid_argument(std::string(flag) + ": item " + std::to_string(items.size()) +
                                  " of '" + text + "' is empty");
    }
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

// `values` are the parsed items of `text`, so that "2,2.0" counts as a repeat:
// "--parallelism: item 3 of '2,4,2' repeats item 1".
template <class T>
void refuse_repeats(std::string_view flag, const std::string& text, const std::vector<T>& values) {
  for (std::size_t k = 0; k < values.size(); ++k) {
    const auto first =
        std::find(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values[k]);
    if (first != values.begin() + static_cast<std::ptrdiff_t>(k)) {
      throw std::invalid_argument(std::string(flag) + ": item " + std::to_string(k + 1) + " of '" +
                                  text + "' repeats item " +
                                  std::to_string(first - values.begin() + 1));
    }
  }
}

// "1e3,1e4,1e6": positive whole numbers up to 1e12, no repeats (dimensions).
inline std::vector<std::size_t> dimension_list(std::string_view flag, const std::string& list) {
  std::vector<std::size_t> dims;
  for (const std::string& item : split_list(flag, list)) {
    const double v = whole_number(item).value_or(0.0);  // 0: refused below
    if (!(v >= 1.0 && v <= 1e12) || v != std::floor(v)) {
      throw std::invalid_argument(std::string(flag) + ": item '" + item + "' of '" + list +
                                  "' is not an integer in [1, 1e12]");
    }
    dims.push_back(static_cast<std::size_t>(v));
  }
  refuse_repeats(flag, list, dims);
  return dims;
}

}  // namespace optex_bench

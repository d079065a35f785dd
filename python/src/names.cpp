#include "names.hpp"

#include <charconv>
#include <system_error>

namespace optex::python {

Device parse_device(std::string_view param, std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  constexpr std::string_view kPrefix = "cuda:";
  if (text.starts_with(kPrefix)) {
    const std::string_view digits = text.substr(kPrefix.size());
    int index = -1;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (error == std::errc() && end == digits.data() + digits.size() && !digits.empty() &&
        index >= 0) {
      return Device::cuda(index);
    }
  }
  throw std::invalid_argument(std::string(param) + ": unknown device '" + std::string(text) +
                              "' (expected 'cpu', 'cuda' or 'cuda:<index>')");
}

}  // namespace optex::python

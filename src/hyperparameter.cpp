// The messages of rejected hyperparameters.
#include "optex/optimizers/hyperparameter.hpp"

#include <sstream>
#include <stdexcept>

namespace optex::detail {

void reject(std::string_view name, double value, std::string_view requirement) {
  std::ostringstream msg;
  msg << name << ": must be " << requirement << ", got " << value;
  throw std::invalid_argument(msg.str());
}

std::string_view requirement_text(Requirement requirement) {
  switch (requirement) {
    case Requirement::positive:
      return "finite and > 0";
    case Requirement::non_negative:
      return "finite and >= 0";
    case Requirement::unit_interval:
      return "in [0, 1)";
    case Requirement::flag:
      break;
  }
  return "a bool";
}

}  // namespace optex::detail

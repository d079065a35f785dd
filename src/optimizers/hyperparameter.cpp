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

std::string momentum_buffer_change(double current, double next) {
  if ((next == 0.0) == (current == 0.0)) return {};
  std::ostringstream msg;
  msg << "momentum: " << next << " cannot replace " << current
      << " (the momentum buffer exists only with non-zero momentum); start a new engine";
  return msg.str();
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

// The backend-independent parts of the communicator interface.
#include "optex/communicator.hpp"

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstring>
#include <vector>

namespace optex {

void Communicator::set_timeout(Seconds timeout) {
  if (!(std::isfinite(timeout.count()) && timeout.count() > 0.0)) {
    throw std::invalid_argument("timeout: must be positive and finite, got " +
                                std::to_string(timeout.count()) + " s");
  }
  timeout_ = timeout;
}

Communicator::NodeLocal Communicator::node_local() {
  // Fixed-size records: every rank contributes the same number of bytes.
  constexpr std::size_t kNameBytes = 256;
  std::array<char, kNameBytes> mine{};
  if (gethostname(mine.data(), kNameBytes - 1) != 0) {
    throw CommunicatorError(where("node_local") + ": gethostname failed");
  }
  std::vector<char> all(kNameBytes * static_cast<std::size_t>(size()));
  all_gather(std::span<const char>(mine), std::span<char>(all));
  NodeLocal local{0, 0};
  for (int r = 0; r < size(); ++r) {
    if (std::strncmp(all.data() + kNameBytes * static_cast<std::size_t>(r), mine.data(),
                     kNameBytes) != 0) {
      continue;
    }
    if (r < rank()) ++local.rank;
    ++local.size;
  }
  return local;
}

std::string Communicator::where(std::string_view operation) const {
  return "optex " + std::string(backend()) + " communicator, rank " + std::to_string(rank()) +
         " of " + std::to_string(size()) + ", " + std::string(operation);
}

}  // namespace optex

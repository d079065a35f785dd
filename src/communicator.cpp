// The backend-independent parts of the communicator interface.
#include "optex/communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
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

std::vector<std::string> Communicator::all_gather_text(std::string_view mine) {
  const auto ranks = static_cast<std::size_t>(size());
  const std::uint64_t length = mine.size();
  std::vector<std::uint64_t> lengths(ranks);
  all_gather(std::span<const std::uint64_t>(&length, 1), std::span<std::uint64_t>(lengths));
  std::uint64_t longest = 0;
  for (const std::uint64_t l : lengths) longest = std::max(longest, l);
  std::vector<char> padded(longest);
  std::copy(mine.begin(), mine.end(), padded.begin());
  std::vector<char> all(longest * ranks);
  all_gather(std::span<const char>(padded), std::span<char>(all));
  std::vector<std::string> texts(ranks);
  for (std::size_t r = 0; r < ranks; ++r) texts[r].assign(all.data() + r * longest, lengths[r]);
  return texts;
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

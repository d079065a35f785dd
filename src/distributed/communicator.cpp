// The backend-independent parts of the communicator interface.
#include "optex/distributed/communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace optex {

namespace {

// The floats one rank's block covers, as addresses [begin, end).
struct Region {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  std::size_t peer = 0;  // the rank the block goes to or comes from
};

// Appends the nonempty blocks of `base` ("send" or "recv") to `regions`; the
// problem when a block has no buffer or runs past the end of the address space.
std::string add_regions(const std::string& name, const float* base,
                        std::span<const std::size_t> counts, std::span<const std::size_t> offsets,
                        std::vector<Region>& regions) {
  const auto address = reinterpret_cast<std::uintptr_t>(base);
  // How many floats fit between base and the end of the address space.
  const std::uintptr_t room =
      (std::numeric_limits<std::uintptr_t>::max() - address) / sizeof(float);
  for (std::size_t s = 0; s < counts.size(); ++s) {
    if (counts[s] == 0) continue;
    const std::string count = name + "_counts[" + std::to_string(s) + "]";
    if (base == nullptr) return name + ": null with " + count + " = " + std::to_string(counts[s]);
    if (offsets[s] > room || counts[s] > room - offsets[s]) {
      return name + "_offsets[" + std::to_string(s) + "] + " + count + " = " +
             std::to_string(offsets[s]) + " + " + std::to_string(counts[s]) +
             " floats run past the end of the address space";
    }
    regions.push_back({address + offsets[s] * sizeof(float),
                       address + (offsets[s] + counts[s]) * sizeof(float), s});
  }
  return {};
}

// Receive regions must not overlap each other or a send region (send regions
// may overlap each other).
std::string overlap_problem(std::vector<Region> receives, const std::vector<Region>& sends) {
  const auto by_begin = [](const Region& a, const Region& b) { return a.begin < b.begin; };
  std::sort(receives.begin(), receives.end(), by_begin);
  for (std::size_t i = 1; i < receives.size(); ++i) {
    if (receives[i].begin < receives[i - 1].end) {
      return "the receive regions from ranks " + std::to_string(receives[i - 1].peer) + " and " +
             std::to_string(receives[i].peer) + " overlap";
    }
  }
  for (const Region& send : sends) {
    // Sorted and disjoint, the receive regions end in order too: only the
    // first one that ends after the send region begins can overlap it.
    const auto after =
        std::upper_bound(receives.begin(), receives.end(), send.begin,
                         [](std::uintptr_t address, const Region& r) { return address < r.end; });
    if (after != receives.end() && after->begin < send.end) {
      return "the receive region from rank " + std::to_string(after->peer) +
             " overlaps the send region to rank " + std::to_string(send.peer);
    }
  }
  return {};
}

}  // namespace

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

std::string Communicator::all_to_all_argument_problem(
    const float* send, std::span<const std::size_t> send_counts,
    std::span<const std::size_t> send_offsets, const float* recv,
    std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_offsets) const {
  const auto ranks = static_cast<std::size_t>(size());
  const std::pair<const char*, std::span<const std::size_t>> spans[] = {
      {"send_counts", send_counts},
      {"send_offsets", send_offsets},
      {"recv_counts", recv_counts},
      {"recv_offsets", recv_offsets}};
  for (const auto& [name, span] : spans) {
    if (span.size() != ranks) {
      return std::string(name) + ".size() must be size() = " + std::to_string(ranks) + ", got " +
             std::to_string(span.size());
    }
  }
  std::vector<Region> sends;
  std::vector<Region> receives;
  std::string problem = add_regions("send", send, send_counts, send_offsets, sends);
  if (problem.empty()) problem = add_regions("recv", recv, recv_counts, recv_offsets, receives);
  if (problem.empty()) problem = overlap_problem(std::move(receives), sends);
  return problem;
}

std::vector<std::uint64_t> Communicator::all_to_all_count_row(
    std::span<const std::size_t> send_counts, std::span<const std::size_t> recv_counts) {
  std::vector<std::uint64_t> row(send_counts.begin(), send_counts.end());
  row.insert(row.end(), recv_counts.begin(), recv_counts.end());
  return row;
}

std::string Communicator::all_to_all_count_mismatch(int size, std::span<const std::uint64_t> rows) {
  const auto ranks = static_cast<std::size_t>(size);
  const std::size_t row = 2 * ranks;
  constexpr std::size_t kShown = 4;
  std::size_t found = 0;
  std::string listed;
  for (std::size_t from = 0; from < ranks; ++from) {
    for (std::size_t to = 0; to < ranks; ++to) {
      const std::uint64_t sends = rows[from * row + to];
      const std::uint64_t expects = rows[to * row + ranks + from];
      if (sends == expects) continue;
      if (++found > kShown) continue;
      listed += (found > 1 ? "; rank " : "rank ") + std::to_string(from) + " sends rank " +
                std::to_string(to) + " " + std::to_string(sends) + " floats, rank " +
                std::to_string(to) + " expects " + std::to_string(expects);
    }
  }
  if (found == 0) return {};
  if (found > kShown) listed += "; and " + std::to_string(found - kShown) + " more";
  return "send_counts and recv_counts disagree between ranks: " + listed;
}

}  // namespace optex

// What the distributed engines (replicated and sharded) do alike so that no
// rank goes on alone: steps whose outcome every rank agrees on, the ranks'
// comparison of their configurations and states, and tell()'s first
// exchange of status and losses (DESIGN.md section 3).
#pragma once

#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "optex/distributed/communicator.hpp"
#include "optex/distributed/distributed_engine.hpp"
#include "optex/engine/coordinate_range.hpp"

namespace optex::detail {

// "ranks 2, 3" or "rank 2".
std::string name_ranks(const std::vector<int>& ranks);

// Copies a message into a fixed, zero-terminated field.
template <std::size_t N>
void put_message(char (&field)[N], std::string_view message) {
  const std::size_t n = std::min(message.size(), N - 1);
  std::memcpy(field, message.data(), n);
  std::memset(field + n, 0, N - n);
}

// The error every rank agrees on after a collective step fails somewhere.
struct StepOutcome {
  std::int32_t failed = 0;
  char message[240] = {};
};

// Throws on every rank when `mine` failed on any: the failing rank rethrows
// `error`, the others std::invalid_argument or std::runtime_error naming the
// failing ranks.
void agree_on_outcome(Communicator& comm, std::string_view what, bool invalid_argument,
                      const StepOutcome& mine, const std::exception_ptr& error);

// Runs `step` on every rank and agrees on the outcome (agree_on_outcome). A
// rank that fails alone would otherwise leave the others waiting in the next
// collective.
template <class Step>
void collectively(Communicator& comm, std::string_view what, bool invalid_argument, Step&& step) {
  StepOutcome mine;
  std::exception_ptr error;
  try {
    std::forward<Step>(step)();
  } catch (const std::exception& e) {
    error = std::current_exception();
    mine.failed = 1;
    put_message(mine.message, e.what());
  } catch (...) {
    error = std::current_exception();
    mine.failed = 1;
    put_message(mine.message, "unknown exception");
  }
  agree_on_outcome(comm, what, invalid_argument, mine, error);
}

// The ranks whose value differs from rank 0's (an all-gather of one value each).
std::vector<int> ranks_differing_from_rank0(Communicator& comm, std::uint64_t mine);

// Collective, after the ranks found that their configurations differ: names
// the first field that differs and the ranks that differ from rank 0.
std::string mismatch_text(Communicator& comm,
                          const std::vector<std::pair<std::string, std::string>>& fields,
                          const std::vector<int>& differ);

// The distributed options as the ranks compare them: a fingerprint, and the
// named fields a mismatch reports.
std::uint64_t layout_fingerprint(const DistributedOptions& d);
void add_layout_fields(const DistributedOptions& d,
                       std::vector<std::pair<std::string, std::string>>& fields);

// Where the rows of a round go: G groups of D ranks, N rows split over the groups.
struct RoundLayout {
  int rows = 1;           // N
  int groups = 1;         // G
  int data_parallel = 1;  // D
  PointRange rows_of_group(int group) const { return point_range(rows, groups, group); }
};

// tell()'s first collective: one fixed-size record per rank with its
// iteration, a hash of its `unchanged` ranges, its failures and the losses of
// its group's rows (`own_losses`; a failed row's is NaN). Throws on every rank
// the same way: RankDivergence for ranks at another iteration,
// std::invalid_argument for refused or differing ranges, RankFailure for
// failures under OnFailure::abort. Otherwise returns every row's loss (its
// group's mean, in rank order). `dim` is what the ranges are checked against.
std::vector<double> exchange_status_and_losses(Communicator& world, const RoundLayout& layout,
                                               OnFailure on_failure, std::int64_t iteration,
                                               std::size_t dim,
                                               std::span<const CoordinateRange> unchanged,
                                               std::span<const PointFailure> failures,
                                               std::span<const double> own_losses,
                                               CommunicationStats& stats);

}  // namespace optex::detail

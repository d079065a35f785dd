#include "distributed/rank_agreement.hpp"

#include <limits>
#include <sstream>

#include "optex/distributed/data_parallel.hpp"
#include "optex/distributed/startup_agreement.hpp"
#include "optex/util/random.hpp"

namespace optex::detail {
namespace {

// Per rank, at tell(): where it is, what failed, and its losses.
struct StatusHeader {
  std::int64_t iteration = 0;
  std::uint64_t unchanged = 0;  // unchanged_hash() of the rank's ranges
  std::int32_t failures = 0;
  std::int32_t failed_point = -1;
  char message[200] = {};
};

// What the ranks compare of tell()'s `unchanged`: a hash of the ranges,
// odd, and 0 where this rank refused them (`refusal` says why).
std::uint64_t unchanged_hash(std::span<const CoordinateRange> ranges, const std::string& refusal) {
  if (!refusal.empty()) return 0;
  return fnv1a64(reinterpret_cast<const unsigned char*>(ranges.data()), ranges.size_bytes()) | 1u;
}

// Every rank must commit with the same `unchanged`, or the states part: a
// rank that refused its ranges, or ranks whose ranges differ from rank 0's,
// make every rank throw, before anything changes.
void agree_on_unchanged(const std::vector<std::uint64_t>& hashes, const std::string& refusal) {
  if (!refusal.empty()) throw std::invalid_argument(refusal);
  std::vector<int> refused;
  std::vector<int> differ;
  for (std::size_t r = 0; r < hashes.size(); ++r) {
    if (hashes[r] == 0) refused.push_back(static_cast<int>(r));
    if (hashes[r] != hashes[0]) differ.push_back(static_cast<int>(r));
  }
  if (!refused.empty()) {
    throw std::invalid_argument("unchanged: coordinate ranges refused by " + name_ranks(refused) +
                                " (every rank must pass the same valid ranges); nothing was "
                                "committed");
  }
  if (!differ.empty()) {
    throw std::invalid_argument("unchanged: " + name_ranks(differ) +
                                " passed other coordinate ranges than rank 0 (every rank must "
                                "pass the same); nothing was committed");
  }
}

// The records every rank sent, read back.
class StatusRecords {
 public:
  StatusRecords(std::vector<std::byte> all, std::size_t record)
      : all_(std::move(all)), record_(record) {}
  StatusHeader header(int r) const {
    StatusHeader h;
    std::memcpy(&h, all_.data() + record_ * static_cast<std::size_t>(r), sizeof h);
    return h;
  }
  double loss(int r, int k) const {
    double v;
    std::memcpy(&v,
                all_.data() + record_ * static_cast<std::size_t>(r) + sizeof(StatusHeader) +
                    sizeof(double) * static_cast<std::size_t>(k),
                sizeof v);
    return v;
  }

 private:
  std::vector<std::byte> all_;
  std::size_t record_;
};

void throw_rank_failure(const StatusRecords& records, const std::vector<int>& failed_ranks,
                        std::int64_t iteration) {
  std::ostringstream msg;
  msg << "iteration " << iteration << ": " << name_ranks(failed_ranks)
      << " failed to evaluate their points";
  for (int r : failed_ranks) {
    const StatusHeader h = records.header(r);
    msg << "; rank " << r << ", point " << h.failed_point << ": " << h.message;
  }
  const int first = failed_ranks.front();
  throw RankFailure(msg.str(), first, records.header(first).failed_point);
}

}  // namespace

std::string name_ranks(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    if (k > 0) s += ", ";
    s += std::to_string(ranks[k]);
  }
  return s;
}

void agree_on_outcome(Communicator& comm, std::string_view what, bool invalid_argument,
                      const StepOutcome& mine, const std::exception_ptr& error) {
  std::vector<StepOutcome> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(std::span<const StepOutcome>(&mine, 1), std::span<StepOutcome>(all));
  std::vector<int> failed;
  for (int r = 0; r < comm.size(); ++r) {
    if (all[static_cast<std::size_t>(r)].failed) failed.push_back(r);
  }
  if (failed.empty()) return;
  if (error) std::rethrow_exception(error);
  const std::string msg = std::string(what) + ": " + name_ranks(failed) +
                          " failed: " + all[static_cast<std::size_t>(failed.front())].message;
  if (invalid_argument) throw std::invalid_argument(msg);
  throw std::runtime_error(msg);
}

std::vector<int> ranks_differing_from_rank0(Communicator& comm, std::uint64_t mine) {
  std::vector<std::uint64_t> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(std::span<const std::uint64_t>(&mine, 1), std::span<std::uint64_t>(all));
  std::vector<int> differ;
  for (int r = 1; r < comm.size(); ++r) {
    if (all[static_cast<std::size_t>(r)] != all[0]) differ.push_back(r);
  }
  return differ;
}

std::string mismatch_text(Communicator& comm,
                          const std::vector<std::pair<std::string, std::string>>& fields,
                          const std::vector<int>& differ) {
  std::string first = first_disagreement(comm, fields);
  if (first.empty()) first = "ranks disagree on a field this build cannot name";
  return first + " (" + name_ranks(differ) + (differ.size() == 1 ? " differs" : " differ") +
         " from rank 0)";
}

std::uint64_t layout_fingerprint(const DistributedOptions& d) {
  std::uint64_t h = mix_seed(static_cast<std::uint64_t>(d.data_parallel),
                             static_cast<std::uint64_t>(d.hash_interval));
  return mix_seed(h, static_cast<std::uint64_t>(d.on_failure));
}

void add_layout_fields(const DistributedOptions& d,
                       std::vector<std::pair<std::string, std::string>>& fields) {
  fields.emplace_back("distributed.data_parallel", std::to_string(d.data_parallel));
  fields.emplace_back("distributed.hash_interval", std::to_string(d.hash_interval));
  fields.emplace_back("distributed.on_failure",
                      d.on_failure == OnFailure::abort ? "abort" : "drop");
}

std::vector<double> exchange_status_and_losses(Communicator& world, const RoundLayout& layout,
                                               OnFailure on_failure, std::int64_t iteration,
                                               std::size_t dim,
                                               std::span<const CoordinateRange> unchanged,
                                               std::span<const PointFailure> failures,
                                               std::span<const double> own_losses,
                                               CommunicationStats& stats) {
  // One fixed-size record per rank: the header, then the losses of this
  // rank's rows (padded to the largest group: the first groups are the largest).
  const int max_rows = layout.rows_of_group(0).count;
  const std::size_t record = sizeof(StatusHeader) + sizeof(double) * max_rows;
  std::vector<std::byte> mine(record);
  StatusHeader header;
  header.iteration = iteration;
  // Checked here but refused only after the exchange: a rank that threw alone
  // would leave the others waiting in it.
  std::string refusal;
  try {
    check_coordinate_ranges(unchanged, dim, "unchanged");
  } catch (const std::invalid_argument& e) {
    refusal = e.what();
  }
  header.unchanged = unchanged_hash(unchanged, refusal);
  header.failures = static_cast<std::int32_t>(failures.size());
  if (!failures.empty()) {
    header.failed_point = failures.front().point;
    put_message(header.message, failures.front().message);
  }
  std::memcpy(mine.data(), &header, sizeof header);
  std::memcpy(mine.data() + sizeof header, own_losses.data(), own_losses.size_bytes());
  std::vector<std::byte> all(record * static_cast<std::size_t>(world.size()));
  world.all_gather_bytes(mine, all);
  stats.bytes_sent += record;
  ++stats.collectives;
  const StatusRecords records(std::move(all), record);

  // Ranks out of step (a rank skipped a tell): nothing sensible can follow.
  std::vector<int> out_of_step;
  std::vector<std::uint64_t> hashes;
  std::vector<int> failed_ranks;
  for (int r = 0; r < world.size(); ++r) {
    const StatusHeader h = records.header(r);
    if (h.iteration != records.header(0).iteration) out_of_step.push_back(r);
    hashes.push_back(h.unchanged);
    if (h.failures > 0) failed_ranks.push_back(r);
  }
  if (!out_of_step.empty()) {
    throw RankDivergence("tell: " + name_ranks(out_of_step) +
                         " at another iteration than rank 0's " +
                         std::to_string(records.header(0).iteration));
  }
  agree_on_unchanged(hashes, refusal);
  if (!failed_ranks.empty() && on_failure == OnFailure::abort) {
    throw_rank_failure(records, failed_ranks, iteration);
  }

  // Each row's loss is its group's mean. A failed row carries a NaN loss, so
  // its mean is NaN and the engine drops it on every rank like any
  // non-finite pair.
  std::vector<double> losses(static_cast<std::size_t>(layout.rows));
  const int d = layout.data_parallel;
  std::vector<double> group_losses(static_cast<std::size_t>(d));
  for (int g = 0; g < layout.groups; ++g) {
    const PointRange rows = layout.rows_of_group(g);
    for (int k = 0; k < rows.count; ++k) {
      for (int dr = 0; dr < d; ++dr) {
        group_losses[static_cast<std::size_t>(dr)] = records.loss(g * d + dr, k);
      }
      losses[static_cast<std::size_t>(rows.first + k)] = mean_in_rank_order(group_losses);
    }
  }
  return losses;
}

}  // namespace optex::detail

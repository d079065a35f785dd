// The in-process communicator: ranks are threads that meet on shared state.
//
// Every collective is a two-phase rendezvous under one mutex:
//   arrive: each rank deposits pointers to its buffers (a Contribution) and
//           waits until all ranks have; the last one to arrive checks that the
//           contributions match;
//   copy:   outside the lock, each rank reads what it needs straight from the
//           others' buffers and writes only its own;
//   depart: each rank waits until every rank has finished copying, so that no
//           buffer is freed or overwritten while another rank still reads it.
// The last rank to depart starts the next generation.
//
// A failure (timeout, mismatch, bad argument, abort, a rank that destroyed its
// communicator) poisons the world: the first failure is recorded, the waiting
// ranks are woken, and every operation still waiting for a rank, and every
// later one, throws it. (A collective that every rank has already joined
// completes: the others may be reading this rank's buffers.)
#include "optex/distributed/in_process_communicator.hpp"

#include "distributed/rank_order_reduce.hpp"
#include "distributed/seconds_text.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace optex {

namespace detail {

// What one rank brings to the collective in progress. Only the fields of the
// operation it names are set.
struct Contribution {
  std::string_view operation;
  const std::byte* bytes = nullptr;       // all_gather_bytes: mine; broadcast_bytes: data
  std::size_t size = 0;                   // bytes of mine or data; values.size() in all_reduce
  const double* values = nullptr;         // all_reduce
  ReduceOp op = ReduceOp::sum;            // all_reduce
  int root = 0;                           // broadcast_bytes
  const float* floats = nullptr;          // all_gather_floats: mine; all_to_all_floats: send
  std::span<const std::size_t> counts{};  // all_gather_floats; all_to_all_floats: send_counts
  std::span<const std::size_t> send_offsets{};  // all_to_all_floats
  std::span<const std::size_t> recv_counts{};   // all_to_all_floats
  int color = 0;                                // split
  int key = 0;                                  // split
};

struct InProcessState {
  explicit InProcessState(int world_size)
      : size(world_size),
        contributions(static_cast<std::size_t>(world_size)),
        has_arrived(static_cast<std::size_t>(world_size), 0),
        has_departed(static_cast<std::size_t>(world_size), 0),
        handed_out(static_cast<std::size_t>(world_size), 0) {}

  const int size;
  std::mutex mutex;
  std::condition_variable changed;

  // The collective in progress; `generation` counts the completed ones.
  std::uint64_t generation = 0;
  int arrived = 0;
  int departed = 0;
  std::vector<Contribution> contributions;
  std::vector<char> has_arrived;
  std::vector<char> has_departed;
  // Set by the last rank to arrive when the contributions disagree.
  bool mismatched = false;
  // split: the new world of each color, created by its first rank to look.
  std::map<int, std::shared_ptr<InProcessState>> split_worlds;

  // Non-empty once the world is poisoned: why.
  std::string failure;
  std::vector<char> handed_out;
};

}  // namespace detail

namespace {

using State = detail::InProcessState;
using detail::Contribution;

using detail::seconds_text;

// "rank 3" or "ranks 2, 3": the ranks whose flag is not set.
std::string missing_ranks(const std::vector<char>& flags) {
  std::vector<int> missing;
  for (std::size_t r = 0; r < flags.size(); ++r) {
    if (!flags[r]) missing.push_back(static_cast<int>(r));
  }
  std::string text = missing.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < missing.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(missing[i]);
  }
  return text;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
  }
  return "unknown";
}

std::string counts_text(std::span<const std::size_t> counts) {
  constexpr std::size_t kShown = 8;
  std::string text = "[";
  for (std::size_t i = 0; i < counts.size() && i < kShown; ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(counts[i]);
  }
  if (counts.size() > kShown) text += ", ...";
  return text + "]";
}

// "" when every rank's `field` equals rank 0's; otherwise which ranks passed
// what, e.g. "root differs between ranks: rank 0 passed 0, rank 2 passed 1".
template <class Text>
std::string disagreement(const std::vector<Contribution>& all, std::string_view field, Text text,
                         std::string_view verb = "passed") {
  const std::string first = text(all[0]);
  std::string listed;
  for (std::size_t r = 1; r < all.size(); ++r) {
    const std::string value = text(all[r]);
    if (value != first) {
      listed += ", rank " + std::to_string(r) + " " + std::string(verb) + " " + value;
    }
  }
  if (listed.empty()) return {};
  return std::string(field) + " differs between ranks: rank 0 " + std::string(verb) + " " + first +
         listed;
}

// Checked by the last rank to arrive: "" when the contributions match.
std::string find_mismatch(const std::vector<Contribution>& all) {
  const std::string operation_differs = disagreement(
      all, "the operation", [](const Contribution& c) { return std::string(c.operation); },
      "called");
  if (!operation_differs.empty()) return operation_differs;
  const std::string_view operation = all[0].operation;
  const auto size_text = [](const Contribution& c) { return std::to_string(c.size); };
  if (operation == "all_gather_bytes") return disagreement(all, "mine.size()", size_text);
  if (operation == "all_reduce") {
    std::string differs = disagreement(all, "values.size()", size_text);
    if (differs.empty()) {
      differs = disagreement(
          all, "op", [](const Contribution& c) { return std::string(reduce_op_name(c.op)); });
    }
    return differs;
  }
  if (operation == "broadcast_bytes") {
    std::string differs =
        disagreement(all, "root", [](const Contribution& c) { return std::to_string(c.root); });
    if (differs.empty()) differs = disagreement(all, "data.size()", size_text);
    return differs;
  }
  if (operation == "all_gather_floats") {
    return disagreement(all, "counts", [](const Contribution& c) { return counts_text(c.counts); });
  }
  if (operation == "all_to_all_floats") {
    std::vector<std::uint64_t> rows;
    for (const Contribution& c : all) {
      const std::vector<std::uint64_t> row =
          Communicator::all_to_all_count_row(c.counts, c.recv_counts);
      rows.insert(rows.end(), row.begin(), row.end());
    }
    return Communicator::all_to_all_count_mismatch(static_cast<int>(all.size()), rows);
  }
  return {};
}

std::chrono::steady_clock::time_point deadline_after(Communicator::Seconds timeout) {
  // Clamped so that a huge (but finite) timeout cannot overflow the clock.
  constexpr Communicator::Seconds kLongest{1e9};
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::min(timeout, kLongest));
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<State> state, int rank)
      : state_(std::move(state)), rank_(rank) {}

  // A rank that goes away can never join another collective: fail the others
  // now instead of letting them wait out their timeouts.
  ~InProcessCommunicator() override {
    std::lock_guard lock(state_->mutex);
    poison(*state_, "rank " + std::to_string(rank_) + " left (its communicator was destroyed)");
  }

  InProcessCommunicator(const InProcessCommunicator&) = delete;
  InProcessCommunicator& operator=(const InProcessCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  std::string_view backend() const override { return "in-process"; }

  void all_gather_bytes(std::span<const std::byte> mine, std::span<std::byte> all) override {
    constexpr std::string_view kOperation = "all_gather_bytes";
    const std::size_t n = mine.size();
    if (all.size() != n * static_cast<std::size_t>(size())) {
      bad_argument(kOperation, "all.size() must be size() * mine.size() = " +
                                   std::to_string(n * static_cast<std::size_t>(size())) + ", got " +
                                   std::to_string(all.size()));
    }
    const auto& contributions = arrive({.operation = kOperation, .bytes = mine.data(), .size = n});
    for (int r = 0; r < size(); ++r) {
      std::byte* to = all.data() + n * static_cast<std::size_t>(r);
      const std::byte* from = contributions[static_cast<std::size_t>(r)].bytes;
      if (n > 0 && to != from) std::memmove(to, from, n);
    }
    depart(kOperation);
  }

  void all_reduce(std::span<double> values, ReduceOp op) override {
    constexpr std::string_view kOperation = "all_reduce";
    if (op != ReduceOp::sum && op != ReduceOp::min && op != ReduceOp::max) {
      bad_argument(kOperation, "op: unknown ReduceOp " + std::to_string(static_cast<int>(op)));
    }
    const auto& contributions =
        arrive({.operation = kOperation, .size = values.size(), .values = values.data(), .op = op});
    // Rank order on every rank: identical bits everywhere. The result waits in
    // a copy because the others still read `values` until everyone departs.
    const double* first = contributions[0].values;
    std::vector<double> result(first, first + values.size());
    for (int r = 1; r < size(); ++r) {
      const double* other = contributions[static_cast<std::size_t>(r)].values;
      for (std::size_t i = 0; i < result.size(); ++i) {
        result[i] = detail::combine(result[i], other[i], op);
      }
    }
    depart(kOperation);
    std::copy(result.begin(), result.end(), values.begin());
  }

  void broadcast_bytes(std::span<std::byte> data, int root) override {
    constexpr std::string_view kOperation = "broadcast_bytes";
    if (root < 0 || root >= size()) {
      bad_argument(kOperation, "root: must be in [0, " + std::to_string(size()) + "), got " +
                                   std::to_string(root));
    }
    const auto& contributions =
        arrive({.operation = kOperation, .bytes = data.data(), .size = data.size(), .root = root});
    if (rank_ != root && !data.empty()) {
      std::memcpy(data.data(), contributions[static_cast<std::size_t>(root)].bytes, data.size());
    }
    depart(kOperation);
  }

  void barrier() override {
    constexpr std::string_view kOperation = "barrier";
    arrive({.operation = kOperation});
    depart(kOperation);
  }

  void all_gather_floats(const float* mine, float* all,
                         std::span<const std::size_t> counts) override {
    constexpr std::string_view kOperation = "all_gather_floats";
    if (counts.size() != static_cast<std::size_t>(size())) {
      bad_argument(kOperation, "counts.size() must be size() = " + std::to_string(size()) +
                                   ", got " + std::to_string(counts.size()));
    }
    std::size_t total = 0;
    for (const std::size_t c : counts) total += c;
    const std::size_t own = counts[static_cast<std::size_t>(rank_)];
    if (mine == nullptr && own > 0) {
      bad_argument(kOperation, "mine: null with counts[" + std::to_string(rank_) +
                                   "] = " + std::to_string(own));
    }
    if (all == nullptr && total > 0) {
      bad_argument(kOperation, "all: null with " + std::to_string(total) + " floats to receive");
    }
    const auto& contributions = arrive({.operation = kOperation, .floats = mine, .counts = counts});
    std::size_t offset = 0;
    for (int r = 0; r < size(); ++r) {
      const std::size_t n = counts[static_cast<std::size_t>(r)];
      const float* from = contributions[static_cast<std::size_t>(r)].floats;
      // In place, the own slice is already where it belongs.
      if (n > 0 && all + offset != from) std::memmove(all + offset, from, n * sizeof(float));
      offset += n;
    }
    depart(kOperation);
  }

  void all_to_all_floats(const float* send, std::span<const std::size_t> send_counts,
                         std::span<const std::size_t> send_offsets, float* recv,
                         std::span<const std::size_t> recv_counts,
                         std::span<const std::size_t> recv_offsets) override {
    constexpr std::string_view kOperation = "all_to_all_floats";
    const std::string problem = all_to_all_argument_problem(send, send_counts, send_offsets, recv,
                                                            recv_counts, recv_offsets);
    if (!problem.empty()) bad_argument(kOperation, problem);
    const auto& contributions = arrive({.operation = kOperation,
                                        .floats = send,
                                        .counts = send_counts,
                                        .send_offsets = send_offsets,
                                        .recv_counts = recv_counts});
    // Every rank copies what the others address to it (the counts agree).
    const auto me = static_cast<std::size_t>(rank_);
    for (std::size_t s = 0; s < contributions.size(); ++s) {
      const Contribution& sender = contributions[s];
      if (recv_counts[s] == 0) continue;
      std::memcpy(recv + recv_offsets[s], sender.floats + sender.send_offsets[me],
                  recv_counts[s] * sizeof(float));
    }
    depart(kOperation);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    constexpr std::string_view kOperation = "split";
    // MPI reserves negative colors (MPI_UNDEFINED); the backends agree.
    if (color < 0) bad_argument(kOperation, "color: must be >= 0, got " + std::to_string(color));
    const auto& contributions = arrive({.operation = kOperation, .color = color, .key = key});
    // The members of this color ordered by (key, rank) are the new ranks.
    std::vector<std::pair<int, int>> members;  // (key, rank)
    for (int r = 0; r < size(); ++r) {
      const Contribution& c = contributions[static_cast<std::size_t>(r)];
      if (c.color == color) members.emplace_back(c.key, r);
    }
    std::sort(members.begin(), members.end());
    const auto new_rank = static_cast<int>(
        std::find(members.begin(), members.end(), std::pair{key, rank_}) - members.begin());
    std::shared_ptr<State> world;
    {
      std::lock_guard lock(state_->mutex);
      std::shared_ptr<State>& shared = state_->split_worlds[color];
      if (!shared) shared = std::make_shared<State>(static_cast<int>(members.size()));
      shared->handed_out[static_cast<std::size_t>(new_rank)] = 1;
      world = shared;
    }
    depart(kOperation);
    auto communicator = std::make_unique<InProcessCommunicator>(std::move(world), new_rank);
    communicator->set_timeout(timeout());
    return communicator;
  }

  void abort(std::string_view reason) override {
    std::lock_guard lock(state_->mutex);
    poison(*state_, "rank " + std::to_string(rank_) + " aborted: " + std::string(reason));
  }

 private:
  static void poison(State& state, std::string why) {
    if (!state.failure.empty()) return;  // the first failure is the cause
    state.failure = std::move(why);
    state.changed.notify_all();
  }

  [[noreturn]] void throw_failure(std::string_view operation) const {
    throw CommunicatorError(where(operation) + ": " + state_->failure);
  }

  // A bad argument on one rank: the others would otherwise wait for it until
  // their timeout.
  [[noreturn]] void bad_argument(std::string_view operation, const std::string& what) {
    {
      std::lock_guard lock(state_->mutex);
      poison(*state_, "rank " + std::to_string(rank_) + " passed a bad argument to " +
                          std::string(operation) + ": " + what);
    }
    throw std::invalid_argument(where(operation) + ": " + what);
  }

  // Deposits `mine` and waits until every rank has. The returned
  // contributions stay valid and unchanged until this rank departs.
  const std::vector<Contribution>& arrive(const Contribution& mine) {
    State& s = *state_;
    const auto me = static_cast<std::size_t>(rank_);
    std::unique_lock lock(s.mutex);
    if (!s.failure.empty()) throw_failure(mine.operation);
    s.contributions[me] = mine;
    s.has_arrived[me] = 1;
    if (++s.arrived == s.size) {
      const std::string mismatch = find_mismatch(s.contributions);
      if (!mismatch.empty()) {
        s.mismatched = true;
        poison(s, mismatch);
      }
      s.changed.notify_all();
    } else if (!s.changed.wait_until(lock, deadline_after(timeout()),
                                     [&] { return s.arrived == s.size || !s.failure.empty(); })) {
      const std::string what =
          missing_ranks(s.has_arrived) + " did not arrive within " + seconds_text(timeout());
      poison(s, "rank " + std::to_string(rank_) + " timed out in " + std::string(mine.operation) +
                    ": " + what);
      throw CommunicatorTimeout(where(mine.operation) + ": " + what);
    }
    // Once all have arrived, the collective completes unless they mismatched:
    // a later abort cannot stop it, the others already read our buffers.
    if (s.arrived != s.size || s.mismatched) throw_failure(mine.operation);
    return s.contributions;
  }

  // Waits until every rank has finished copying. A poisoned world does not
  // cut this wait short: the others are still reading this rank's buffers,
  // and they run no user code before they depart.
  void depart(std::string_view operation) {
    State& s = *state_;
    std::unique_lock lock(s.mutex);
    s.has_departed[static_cast<std::size_t>(rank_)] = 1;
    if (++s.departed == s.size) {
      ++s.generation;
      s.arrived = 0;
      s.departed = 0;
      std::fill(s.has_arrived.begin(), s.has_arrived.end(), 0);
      std::fill(s.has_departed.begin(), s.has_departed.end(), 0);
      s.split_worlds.clear();
      s.changed.notify_all();
      return;
    }
    const std::uint64_t generation = s.generation;
    if (!s.changed.wait_until(lock, deadline_after(timeout()),
                              [&] { return s.generation != generation; })) {
      const std::string what = missing_ranks(s.has_departed) + " did not finish copying within " +
                               seconds_text(timeout());
      poison(s, "rank " + std::to_string(rank_) + " timed out in " + std::string(operation) + ": " +
                    what);
      throw CommunicatorTimeout(where(operation) + ": " + what);
    }
  }

  std::shared_ptr<State> state_;
  int rank_;
};

}  // namespace

InProcessWorld::InProcessWorld(int size) {
  if (size < 1) throw std::invalid_argument("size: must be >= 1, got " + std::to_string(size));
  state_ = std::make_shared<State>(size);
}

int InProcessWorld::size() const { return state_->size; }

std::unique_ptr<Communicator> InProcessWorld::communicator(int rank) {
  if (rank < 0 || rank >= state_->size) {
    throw std::invalid_argument("rank: must be in [0, " + std::to_string(state_->size) + "), got " +
                                std::to_string(rank));
  }
  {
    std::lock_guard lock(state_->mutex);
    char& handed_out = state_->handed_out[static_cast<std::size_t>(rank)];
    if (handed_out) {
      throw std::invalid_argument("rank: the communicator of rank " + std::to_string(rank) +
                                  " was already handed out");
    }
    handed_out = 1;
  }
  return std::make_unique<InProcessCommunicator>(state_, rank);
}

std::unique_ptr<Communicator> local_communicator() { return InProcessWorld(1).communicator(0); }

}  // namespace optex

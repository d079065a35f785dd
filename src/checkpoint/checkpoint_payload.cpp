// The checkpoint payload both ways: write_payload in field order, read_payload
// in the same order, checking the structure as it reads and the values with
// validate() once it has read everything.
#include "checkpoint/checkpoint_payload.hpp"

#include <cstddef>
#include <map>
#include <string>
#include <utility>

#include "optex/engine/adaptive_split.hpp"
#include "optex/util/random.hpp"

namespace optex::detail {
namespace {

// Far beyond any engine, small enough that products with it cannot overflow.
constexpr std::size_t kMaxDim = std::size_t{1} << 40;

// Where each field of the snapshot lies in the file, so that validate()'s
// refusal can name the byte of the bad value.
class FieldLocations {
 public:
  // A scalar field at byte `at`.
  void scalar(SnapshotField field, int index, std::string name, std::size_t at) {
    where_[{field, index}] = {std::move(name), at, 0};
  }
  // An array whose u64 count is at byte `at`, its elements of `element_size`
  // bytes right after it.
  void array(SnapshotField field, int index, std::string name, std::size_t at,
             std::size_t element_size) {
    where_[{field, index}] = {std::move(name), at, element_size};
  }

  [[noreturn]] void fail(const Reader& r, const InvalidSnapshot& e) const {
    const auto found = where_.find({e.field(), e.index()});
    if (found == where_.end()) r.fail(e.what());
    const Where& w = found->second;
    const std::size_t byte = e.element() && w.element_size > 0
                                 ? w.at + sizeof(std::uint64_t) + *e.element() * w.element_size
                                 : w.at;
    r.fail_at(w.name, byte, e.what());
  }

 private:
  struct Where {
    std::string name;
    std::size_t at;
    std::size_t element_size;  // 0 for a scalar
  };
  std::map<std::pair<SnapshotField, int>, Where> where_;
};

void require_count(const Reader& r, std::string_view field, std::size_t at, std::size_t count,
                   std::size_t expected, const std::string& because) {
  if (count != expected) {
    r.fail_at(field, at,
              "holds " + std::to_string(count) + " elements, expected " + std::to_string(expected) +
                  " (" + because + ")");
  }
}

// A counted array of exactly `expected` elements: a count that the earlier
// fields contradict means the rest of the file cannot be parsed.
template <class T>
std::vector<T> get_exactly(Reader& r, FieldLocations& where, SnapshotField field,
                           const std::string& name, std::size_t expected,
                           const std::string& because, int index = -1) {
  const std::size_t at = r.offset();
  where.array(field, index, name, at, sizeof(T));
  std::vector<T> v = r.get_vector<T>(name, expected);
  require_count(r, name, at, v.size(), expected, because);
  return v;
}

template <class T>
T get_scalar(Reader& r, FieldLocations& where, SnapshotField field, const std::string& name) {
  where.scalar(field, -1, name, r.offset());
  return r.get<T>(name);
}

// The optimizer state: formats 1 and 2 kept two arrays (SGD's buffer or
// Adam's m, and Adam's v); later formats a slot count and that many arrays,
// each either empty or one value per coordinate.
void read_state(Reader& r, std::uint32_t version, std::size_t d, FieldLocations& where,
                EngineSnapshot& s) {
  s.state.step = get_scalar<std::int64_t>(r, where, SnapshotField::step, "optimizer state step");
  const std::size_t slots_at = r.offset();
  const std::size_t slots = version >= 3 ? r.get<std::uint8_t>("optimizer state slots") : 2;
  if (slots > kMaxStateSlots) {
    r.fail_at("optimizer state slots", slots_at,
              std::to_string(slots) + ": more optimizer state slots than this build knows (" +
                  std::to_string(kMaxStateSlots) + ")");
  }
  for (std::size_t j = 0; j < slots; ++j) {
    const std::string name = "optimizer state slot " + std::to_string(j);
    const std::size_t at = r.offset();
    where.array(SnapshotField::slot, static_cast<int>(j), name, at, sizeof(float));
    s.state.slots[j] = r.get_vector<float>(name, d);
    if (!s.state.slots[j].empty()) {
      require_count(r, name, at, s.state.slots[j].size(), d, "the iterate's dimension");
    }
  }
}

// The history, sized by the validated options: at most 4096 slots.
void read_history(Reader& r, std::size_t d, FieldLocations& where, EngineSnapshot& s) {
  const auto cap = static_cast<std::size_t>(s.options.history);
  const std::size_t size_at = r.offset();
  s.history_size = get_scalar<std::uint64_t>(r, where, SnapshotField::history_size, "history size");
  if (s.history_size > cap) {
    r.fail_at("history size", size_at,
              "is " + std::to_string(s.history_size) + ", more than the capacity " +
                  std::to_string(cap) + " (options.history)");
  }
  s.history_next =
      get_scalar<std::uint64_t>(r, where, SnapshotField::history_next, "history next slot");
  const auto size = static_cast<std::size_t>(s.history_size);
  s.points =
      get_exactly<float>(r, where, SnapshotField::points, "history points", size * d, "size x d");
  s.gradients = get_exactly<float>(r, where, SnapshotField::gradients, "history gradients",
                                   size * d, "size x d");
  s.squared_distances =
      get_exactly<double>(r, where, SnapshotField::squared_distances, "history squared distances",
                          cap * cap, "capacity x capacity");
  s.squared_norms = get_exactly<double>(r, where, SnapshotField::squared_norms,
                                        "history squared norms", cap, "capacity");
  s.gradient_gram =
      get_exactly<double>(r, where, SnapshotField::gradient_gram, "history gradient inner products",
                          cap * cap, "capacity x capacity");
}

// The adaptive strategy's state and the last step's length (format 4; before
// it, the state of a new engine).
void read_round_state(Reader& r, std::uint32_t version, FieldLocations& where, EngineSnapshot& s) {
  if (version < 4) {
    const AdaptiveSplit fresh(s.options.parallelism, s.options.evaluations_per_point);
    s.split_evaluations = fresh.evaluations_per_point();
    s.split_noise = fresh.noise();
    s.split_rounds_since_measured = fresh.rounds_since_measured();
    s.last_step_norm = 0.0;
    return;
  }
  where.scalar(SnapshotField::adaptive_split, -1, "adaptive split", r.offset());
  s.split_evaluations = r.get<std::int32_t>("adaptive split evaluations");
  s.split_noise = r.get<double>("adaptive split noise");
  s.split_rounds_since_measured = r.get<std::int64_t>("adaptive split rounds since measured");
  s.last_step_norm =
      get_scalar<double>(r, where, SnapshotField::last_step_norm, "last step length");
  if (version >= 6) {  // before: no verified mode, so no window
    where.scalar(SnapshotField::window, -1, "verified window", r.offset());
    s.window_carried = r.get<std::int32_t>("verified window carried steps");
    s.window_first_slot = r.get<std::uint64_t>("verified window first slot");
  }
}

}  // namespace

void PayloadPieces::add(const Writer& w) {
  const std::vector<char>& bytes = buffers_.emplace_back(w.bytes());
  pieces_.push_back({bytes.data(), bytes.size()});
}

std::uint64_t PayloadPieces::size() const {
  std::uint64_t n = 0;
  for (const std::span<const char> piece : pieces_) n += piece.size();
  return n;
}

std::uint64_t PayloadPieces::checksum() const {
  std::uint64_t h = fnv1a64(nullptr, 0);
  for (const std::span<const char> piece : pieces_) {
    h = fnv1a64(reinterpret_cast<const unsigned char*>(piece.data()), piece.size(), h);
  }
  return h;
}

void write_payload(const EngineSnapshot& s, PayloadPieces& out) {
  // Each array: its count into the current buffer, then its elements in place.
  Writer w;
  const auto array = [&](const auto& values) {
    w.put<std::uint64_t>(values.size());
    out.add(w);
    w = Writer();
    out.add_in_place(std::span(values));
  };
  put_options(w, s.options);
  put_optimizer_ranges(w, s.optimizer);
  array(s.iterate);
  w.put(s.state.step);
  w.put<std::uint8_t>(kMaxStateSlots);
  for (const std::vector<float>& slot : s.state.slots) array(slot);
  w.put(s.lengthscale);
  w.put(s.rng);
  w.put(s.iteration);
  w.put(s.evaluations);
  w.put(s.history_size);
  w.put(s.history_next);
  array(s.points);
  array(s.gradients);
  array(s.squared_distances);
  array(s.squared_norms);
  array(s.gradient_gram);
  w.put(s.split_evaluations);
  w.put(s.split_noise);
  w.put(s.split_rounds_since_measured);
  w.put(s.last_step_norm);
  w.put(s.window_carried);  // format 6
  w.put(s.window_first_slot);
  out.add(w);
}

EngineSnapshot read_payload(Reader& r, std::uint32_t version) {
  EngineSnapshot s;
  FieldLocations where;
  const std::size_t options_at = r.offset();
  where.scalar(SnapshotField::options, -1, "options", options_at);
  s.options = get_options(r, version);
  // Before anything is sized by them: parallelism and history are bounded here.
  try {
    s.options.validate();
  } catch (const std::invalid_argument& e) {
    r.fail_at("options", options_at, e.what());
  }

  where.scalar(SnapshotField::optimizer, -1, "optimizer", r.offset());
  std::vector<std::size_t> step_offsets_at;
  s.optimizer = version >= 3 ? get_optimizer_ranges(r, kMaxDim, version, &step_offsets_at)
                             : OptimizerRanges(get_optimizer(r));
  for (std::size_t k = 0; k < step_offsets_at.size(); ++k) {
    where.scalar(SnapshotField::step_offset, static_cast<int>(k),
                 "optimizer range " + std::to_string(k) + " step_offset", step_offsets_at[k]);
  }
  const std::size_t iterate_at = r.offset();
  where.array(SnapshotField::iterate, -1, "iterate", iterate_at, sizeof(float));
  s.iterate = r.get_vector<float>("iterate", kMaxDim);
  const std::size_t d = s.iterate.size();
  if (d == 0) r.fail_at("iterate", iterate_at, "is empty (the dimension must be >= 1)");

  read_state(r, version, d, where, s);
  s.lengthscale = get_scalar<double>(r, where, SnapshotField::lengthscale, "lengthscale");
  s.rng = r.get<std::uint64_t>("random state");
  s.iteration = get_scalar<std::int64_t>(r, where, SnapshotField::iteration, "iteration");
  s.evaluations = get_scalar<std::int64_t>(r, where, SnapshotField::evaluations, "evaluations");
  read_history(r, d, where, s);
  read_round_state(r, version, where, s);
  if (!r.at_end()) {
    r.fail_at("end of payload", r.offset(),
              "trailing bytes after the payload (" + std::to_string(r.remaining()) + ")");
  }
  try {
    validate(s);
  } catch (const InvalidSnapshot& e) {
    where.fail(r, e);
  }
  return s;
}

}  // namespace optex::detail

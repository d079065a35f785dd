// read_contents: the payload's fields in file order, each checked as it is read.
#include "checkpoint_contents.hpp"

#include <cmath>
#include <cstddef>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "optex/adaptive_split.hpp"
#include "optex/magnitude_bound.hpp"
#include "optex/optimizer.hpp"

namespace optex::detail {
namespace {

// Far beyond any engine, small enough that products with it cannot overflow.
constexpr std::size_t kMaxDim = std::size_t{1} << 40;

template <class T>
std::string show(T v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// Refuses the first element of `values` (which start at byte `at`) that is not
// `ok`, naming it with `name(i)` and saying what it must be.
template <class T, class Ok>
void check_values(const Reader& r, std::size_t at, const std::vector<T>& values,
                  const std::function<std::string(std::size_t)>& name, Ok ok,
                  const std::string& requirement) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!ok(values[i])) {
      r.fail(name(i) + " is " + show(values[i]) + " (" + requirement + "; byte " +
             std::to_string(at + i * sizeof(T)) + ")");
    }
  }
}

// "<what> 3, element 17" for element i of rows of length d.
std::function<std::string(std::size_t)> row_element(std::string what, std::size_t d) {
  return [what = std::move(what), d](std::size_t i) {
    return what + " " + std::to_string(i / d) + ", element " + std::to_string(i % d);
  };
}
// "<what> (3, 5)" for element i of an n x n matrix.
std::function<std::string(std::size_t)> matrix_entry(std::string what, std::size_t n) {
  return [what = std::move(what), n](std::size_t i) {
    return what + " (" + std::to_string(i / n) + ", " + std::to_string(i % n) + ")";
  };
}

// The offset of a counted array's first element, given the offset of its count.
std::size_t elements_at(std::size_t count_at) { return count_at + sizeof(std::uint64_t); }

void require_count(const Reader& r, std::string_view field, std::size_t at, std::size_t count,
                   std::size_t expected, const std::string& because) {
  if (count != expected) {
    r.fail_at(field, at,
              "holds " + std::to_string(count) + " elements, expected " + std::to_string(expected) +
                  " (" + because + ")");
  }
}

bool finite(double v) { return std::isfinite(v); }
bool finite_non_negative(double v) { return std::isfinite(v) && v >= 0.0; }

// The adaptive strategy's state and the last step's length (format 4).
void read_round_state(Reader& r, CheckpointContents& c) {
  c.has_round_state = true;
  const std::size_t split_at = r.offset();
  c.split_evaluations = r.get<std::int32_t>("adaptive split evaluations");
  c.split_noise = r.get<double>("adaptive split noise");
  c.split_rounds_since_measured = r.get<std::int64_t>("adaptive split rounds since measured");
  try {
    AdaptiveSplit(c.options.parallelism, c.options.evaluations_per_point)
        .restore(c.split_evaluations, c.split_noise, c.split_rounds_since_measured);
  } catch (const std::invalid_argument& e) {
    r.fail_at("adaptive split", split_at, e.what());
  }
  const std::size_t step_at = r.offset();
  c.last_step_norm = r.get<double>("last step length");
  if (!(std::isfinite(c.last_step_norm) || std::isnan(c.last_step_norm)) ||
      c.last_step_norm < 0.0) {
    r.fail_at("last step length", step_at,
              "is " + show(c.last_step_norm) + " (must be >= 0 and finite, or NaN)");
  }
}

}  // namespace

CheckpointContents read_contents(Reader& r, std::uint32_t version) {
  CheckpointContents c;
  const std::size_t options_at = r.offset();
  c.options = get_options(r, version);
  // Before anything is sized by them: parallelism and history are bounded here.
  try {
    c.options.validate();
  } catch (const std::invalid_argument& e) {
    r.fail_at("options", options_at, e.what());
  }

  const std::size_t optimizer_at = r.offset();
  const OptimizerRanges stored =
      version >= 3 ? get_optimizer_ranges(r, kMaxDim) : OptimizerRanges(get_optimizer(r));
  const std::size_t iterate_at = r.offset();
  c.iterate = r.get_vector<float>("iterate", kMaxDim);
  const std::size_t d = c.iterate.size();
  if (d == 0) r.fail_at("iterate", iterate_at, "is empty (the dimension must be >= 1)");
  try {
    c.optimizer = stored.for_dimension(d);
  } catch (const std::invalid_argument& e) {
    r.fail_at("optimizer", optimizer_at, std::string("invalid content: ") + e.what());
  }
  const std::string bounded = "must be finite and at most " + show(magnitude_bound(d)) +
                              " in magnitude for d = " + std::to_string(d);
  const auto within = [bound = magnitude_bound(d)](float v) { return within_bound(v, bound); };
  check_values(
      r, elements_at(iterate_at), c.iterate,
      [](std::size_t i) { return "iterate element " + std::to_string(i); }, within, bounded);

  // The optimizer state: formats 1 and 2 kept two arrays, SGD's buffer or Adam's m, and
  // Adam's v.
  const std::size_t step_at = r.offset();
  c.state.step = r.get<std::int64_t>("optimizer state step");
  if (c.state.step < 0) {
    r.fail_at("optimizer state step", step_at,
              "is " + std::to_string(c.state.step) + " (must be >= 0)");
  }
  const std::size_t slots_at = r.offset();
  const std::size_t slots = version >= 3 ? r.get<std::uint8_t>("optimizer state slots") : 2;
  if (slots > kMaxStateSlots) {
    r.fail_at("optimizer state slots", slots_at,
              std::to_string(slots) + ": more optimizer state slots than this build knows (" +
                  std::to_string(kMaxStateSlots) + ")");
  }
  std::array<std::size_t, kMaxStateSlots> slot_at{};
  for (std::size_t j = 0; j < slots; ++j) {
    const std::string field = "optimizer state slot " + std::to_string(j);
    slot_at[j] = r.offset();
    c.state.slots[j] = r.get_vector<float>(field, d);
    if (!c.state.slots[j].empty()) {
      require_count(r, field, slot_at[j], c.state.slots[j].size(), d, "the iterate's dimension");
    }
  }
  if (c.state.used() != c.optimizer->state_slots()) {
    r.fail_at("optimizer state slots", slots_at,
              "optimizer state does not match the optimizer (slots in use " +
                  std::to_string(c.state.used().bits) + ", the optimizer keeps " +
                  std::to_string(c.optimizer->state_slots().bits) + ")");
  }
  std::size_t begin = 0;
  for (const OptimizerRange& range : c.optimizer->ranges()) {
    for (int j = 0; j < kMaxStateSlots; ++j) {
      const std::vector<float>& slot = c.state.slots[static_cast<std::size_t>(j)];
      if (slot.empty()) continue;
      const bool non_negative = slot_is_non_negative(range.optimizer, j);
      const std::string name = "optimizer state " + slot_name(range.optimizer, j) + " (slot " +
                               std::to_string(j) + "), element ";
      for (std::size_t i = begin; i < begin + range.size; ++i) {
        const float v = slot[i];
        if (!std::isfinite(v) || (non_negative && v < 0.0f)) {
          r.fail(name + std::to_string(i) + " is " + show(v) + " (must be finite" +
                 (non_negative ? " and >= 0: a second moment" : "") + "; byte " +
                 std::to_string(elements_at(slot_at[static_cast<std::size_t>(j)]) +
                                i * sizeof(float)) +
                 ")");
        }
      }
    }
    begin += range.size;
  }

  const std::size_t lengthscale_at = r.offset();
  c.lengthscale = r.get<double>("lengthscale");
  if (!(std::isfinite(c.lengthscale) && c.lengthscale > 0.0)) {
    r.fail_at("lengthscale", lengthscale_at,
              "is " + show(c.lengthscale) + " (lengthscale is not positive and finite)");
  }
  c.rng = r.get<std::uint64_t>("random state");
  for (auto [field, counter] :
       {std::pair{"iteration", &c.iteration}, std::pair{"evaluations", &c.evaluations}}) {
    const std::size_t at = r.offset();
    *counter = r.get<std::int64_t>(field);
    if (*counter < 0) r.fail_at(field, at, "is " + std::to_string(*counter) + " (must be >= 0)");
  }

  // The history, sized by the validated options: at most 4096 slots.
  const auto cap = static_cast<std::size_t>(c.options.history);
  const std::size_t size_at = r.offset();
  c.history_size = r.get<std::uint64_t>("history size");
  if (c.history_size > cap) {
    r.fail_at("history size", size_at,
              "is " + std::to_string(c.history_size) + ", more than the capacity " +
                  std::to_string(cap) + " (options.history)");
  }
  const std::size_t next_at = r.offset();
  c.history_next = r.get<std::uint64_t>("history next slot");
  if (c.history_next >= cap || (c.history_size < cap && c.history_next != c.history_size)) {
    r.fail_at("history next slot", next_at,
              "history ring position is inconsistent: next slot " + std::to_string(c.history_next) +
                  " with " + std::to_string(c.history_size) + " pairs in a ring of " +
                  std::to_string(cap));
  }
  const auto size = static_cast<std::size_t>(c.history_size);
  const std::size_t points_at = r.offset();
  c.points = r.get_vector<float>("history points", size * d);
  require_count(r, "history points", points_at, c.points.size(), size * d, "size x d");
  const std::size_t gradients_at = r.offset();
  c.gradients = r.get_vector<float>("history gradients", size * d);
  require_count(r, "history gradients", gradients_at, c.gradients.size(), size * d, "size x d");
  const std::size_t distances_at = r.offset();
  c.squared_distances = r.get_vector<double>("history squared distances", cap * cap);
  require_count(r, "history squared distances", distances_at, c.squared_distances.size(), cap * cap,
                "capacity x capacity");
  const std::size_t norms_at = r.offset();
  c.squared_norms = r.get_vector<double>("history squared norms", cap);
  require_count(r, "history squared norms", norms_at, c.squared_norms.size(), cap, "capacity");
  const std::size_t gram_at = r.offset();
  c.gradient_gram = r.get_vector<double>("history gradient inner products", cap * cap);
  require_count(r, "history gradient inner products", gram_at, c.gradient_gram.size(), cap * cap,
                "capacity x capacity");
  if (version >= 4) read_round_state(r, c);
  if (!r.at_end()) {
    r.fail_at("end of payload", r.offset(),
              "trailing bytes after the payload (" + std::to_string(r.remaining()) + ")");
  }

  check_values(r, elements_at(points_at), c.points, row_element("history point", d), within,
               bounded);
  check_values(r, elements_at(gradients_at), c.gradients, row_element("history gradient", d),
               within, bounded);
  check_values(r, elements_at(distances_at), c.squared_distances,
               matrix_entry("history squared distance", cap), finite_non_negative,
               "must be finite and >= 0");
  check_values(
      r, elements_at(norms_at), c.squared_norms,
      [](std::size_t i) { return "history squared norm " + std::to_string(i); },
      finite_non_negative, "must be finite and >= 0");
  check_values(r, elements_at(gram_at), c.gradient_gram,
               matrix_entry("history gradient inner product", cap), finite, "must be finite");
  return c;
}

}  // namespace optex::detail

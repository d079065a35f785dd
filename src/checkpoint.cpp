// The checkpoint file: everything that determines the rest of a run.
//
// Layout (little-endian):
//   magic "OPTEXCKP" | u32 format version | u64 payload bytes | payload | u64 FNV-1a of payload
// The payload is a flat sequence of fields, written by CheckpointAccess::payload
// below and read in the same order by read_contents (checkpoint_contents.cpp;
// encodings in serialization.hpp):
//   options | optimizer (formats 1, 2: one; 3: the ranges) | iterate |
//   optimizer state (step, then formats 1, 2: two moment arrays; 3: a u8
//   slot count and that many arrays) | lengthscale | random state |
//   iteration | evaluations | history (size, next slot, points, gradients,
//   distances, norms, gradient Gram)
// load() checks its arguments, then reads and checks the whole file (framing,
// then every field and value) before it builds anything, and builds a fresh
// Engine, so a bad file leaves nothing half-loaded behind. save() replaces the
// file atomically (atomic_file.hpp).
#include <bit>
#include <cstring>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint_contents.hpp"
#include "optex/detail/atomic_file.hpp"
#include "optex/detail/engine_backend.hpp"
#include "optex/detail/file_path.hpp"
#include "optex/detail/regular_file.hpp"
#include "optex/engine.hpp"
#include "serialization.hpp"

static_assert(std::endian::native == std::endian::little,
              "the checkpoint format is little-endian; add byte swapping for this platform");

namespace optex {
namespace {

using detail::Reader;
using detail::Writer;

constexpr char kMagic[8] = {'O', 'P', 'T', 'E', 'X', 'C', 'K', 'P'};
// 2 added the device and history precision; 3 the optimizer ranges and the
// state slots (RmsProp keeps three buffers); 4 the evaluations per point, the
// strategy, the safeguards and their state.
constexpr std::uint32_t kFormatVersion = 4;

std::uint64_t checksum(const std::vector<char>& bytes, std::size_t begin, std::size_t end) {
  return fnv1a64(reinterpret_cast<const unsigned char*>(bytes.data()) + begin, end - begin);
}

}  // namespace

// An argument of load() that cannot be honoured (as opposed to a bad file).
struct LoadArgumentError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

namespace {

// load()'s own arguments, checked before the file is opened: their faults are
// never blamed on a file.
void check_load_arguments(const std::string& path, std::optional<Device> device,
                          std::optional<Precision> precision) {
  detail::check_file_path("path", path);
  if (device) {
    Options o;  // the device's own checks, without the history precision's
    o.device = *device;
    o.validate();
    if (device->is_cuda() && device->index >= cuda_device_count()) {
      throw LoadArgumentError("device: " + device->name() +
                              " is not available (this process sees " +
                              std::to_string(cuda_device_count()) +
                              " CUDA device(s)); pass another device to Engine::load");
    }
  }
  if (precision) {
    Options o;
    o.device = Device::cuda(0);  // whether the value is a Precision at all
    o.history_precision = *precision;
    o.validate();
    if (device) {  // both given: the pair must work
      o.device = *device;
      o.validate();
    }
  }
}

}  // namespace

// Reaches into the engine and its history to save and restore every member.
struct CheckpointAccess {
  static std::vector<char> payload(const Engine& e) {
    Writer w;
    detail::put_options(w, e.options_);
    detail::put_optimizer_ranges(w, e.optimizer_);
    w.put_vector(e.iterate());  // host copies on a device engine
    const OptimizerState& state = e.optimizer_state();
    w.put(state.step);
    w.put<std::uint8_t>(kMaxStateSlots);
    for (const std::vector<float>& slot : state.slots) w.put_vector(slot);
    w.put(e.lengthscale_);
    w.put(e.rng_.state());
    w.put(e.iteration_);
    w.put(e.evaluations_);
    const GradientHistory& h = e.history();
    w.put<std::uint64_t>(h.size_);
    w.put<std::uint64_t>(h.next_);
    w.put_vector(h.points_, h.size_ * h.dim_);
    w.put_vector(h.gradients_, h.size_ * h.dim_);
    w.put_vector(h.squared_distances_);
    w.put_vector(h.squared_norms_);
    w.put_vector(h.gradient_gram_);
    w.put<std::int32_t>(e.split_rule_.evaluations_per_point());
    w.put(e.split_rule_.noise());
    w.put<std::int64_t>(e.split_rule_.rounds_since_measured());
    w.put(e.last_step_norm_);
    return w.bytes();
  }

  // Builds the engine from contents that read_contents has checked in full.
  static Engine restore(const Reader& r, detail::CheckpointContents c, std::optional<Device> device,
                        std::optional<Precision> precision) {
    Options options = c.options;
    if (device) {
      options.device = *device;
      // bf16 values are exact in fp32: a bf16 history moves to the CPU unchanged.
      if (!device->is_cuda()) options.history_precision = Precision::fp32;
    } else if (options.device.is_cuda() && options.device.index >= cuda_device_count()) {
      r.fail("saved on " + options.device.name() + ", which is not available (this process sees " +
             std::to_string(cuda_device_count()) +
             " CUDA device(s)); pass a device to Engine::load to resume elsewhere");
    }
    if (precision) options.history_precision = *precision;
    // The caller's choice, not the file's content, decides this failure.
    if (options.history_precision != Precision::fp32 && !options.device.is_cuda()) {
      throw LoadArgumentError(std::string("history_precision: ") +
                              precision_name(options.history_precision) +
                              " storage is available on CUDA devices only, got device cpu");
    }
    const std::size_t d = c.iterate.size();
    const auto cap = static_cast<std::size_t>(options.history);
    Engine e = [&] {
      try {
        return Engine(c.iterate, *c.optimizer, options);
      } catch (const std::bad_alloc&) {
        r.fail("an engine of parallelism " + std::to_string(options.parallelism) + ", history " +
               std::to_string(cap) + " and dimension " + std::to_string(d) +
               " does not fit in memory");
      }
    }();
    GradientHistory h(cap, d);
    std::copy(c.points.begin(), c.points.end(), h.points_.begin());
    std::copy(c.gradients.begin(), c.gradients.end(), h.gradients_.begin());
    h.squared_distances_ = std::move(c.squared_distances);
    h.squared_norms_ = std::move(c.squared_norms);
    h.gradient_gram_ = std::move(c.gradient_gram);
    h.size_ = static_cast<std::size_t>(c.history_size);
    h.next_ = static_cast<std::size_t>(c.history_next);
    e.backend_->restore(c.state, h);
    e.lengthscale_ = c.lengthscale;
    e.rng_.set_state(c.rng);
    e.iteration_ = c.iteration;
    e.evaluations_ = c.evaluations;
    if (c.has_round_state) {
      e.split_rule_.restore(c.split_evaluations, c.split_noise, c.split_rounds_since_measured);
      e.last_step_norm_ = c.last_step_norm;
    }
    return e;
  }
};

void Engine::save(const std::string& path) const {
  detail::check_file_path("path", path);
  if (pending_) {
    throw std::runtime_error(
        "save: a batch is pending (ask() without tell()); save before ask() "
        "or after tell()");
  }
  const std::vector<char> payload = CheckpointAccess::payload(*this);
  Writer header;
  for (char c : kMagic) header.put(c);
  header.put(kFormatVersion);
  header.put<std::uint64_t>(payload.size());
  const std::uint64_t sum =
      fnv1a64(reinterpret_cast<const unsigned char*>(payload.data()), payload.size());

  // Readers see the old file or the new one, never a torn one (atomic_file.hpp).
  const std::span<const char> pieces[] = {
      header.bytes(), payload, {reinterpret_cast<const char*>(&sum), sizeof sum}};
  detail::write_file_atomically("checkpoint", path, pieces);
}

Engine Engine::load(const std::string& path, std::optional<Device> device,
                    std::optional<Precision> history_precision) {
  check_load_arguments(path, device, history_precision);
  const std::vector<char> file = detail::read_regular_file("checkpoint", path);
  constexpr std::size_t kHeader = sizeof kMagic + sizeof(std::uint32_t) + sizeof(std::uint64_t);
  Reader header(file.data(), file.size(), path);
  if (file.size() < kHeader + sizeof(std::uint64_t))
    header.fail("too short to be an optex checkpoint");
  if (std::memcmp(file.data(), kMagic, sizeof kMagic) != 0)
    header.fail("not an optex checkpoint (bad magic number)");
  for (std::size_t i = 0; i < sizeof kMagic; ++i) header.get<char>("magic number");
  const auto version = header.get<std::uint32_t>("format version");
  if (version < 1 || version > kFormatVersion) {
    header.fail("format version " + std::to_string(version) +
                " is not supported (this build reads 1 to " + std::to_string(kFormatVersion) + ")");
  }
  const auto payload_size = header.get<std::uint64_t>("payload size");
  if (payload_size != file.size() - kHeader - sizeof(std::uint64_t)) {
    header.fail("size mismatch: the header announces " + std::to_string(payload_size) +
                " payload bytes, the file holds " +
                std::to_string(file.size() - kHeader - sizeof(std::uint64_t)) +
                " (truncated or appended to)");
  }
  std::uint64_t stored = 0;
  std::memcpy(&stored, file.data() + file.size() - sizeof stored, sizeof stored);
  if (stored != checksum(file, kHeader, file.size() - sizeof stored))
    header.fail("checksum mismatch (corrupted)");
  Reader payload(file.data() + kHeader, static_cast<std::size_t>(payload_size), path, kHeader);
  detail::CheckpointContents contents = detail::read_contents(payload, version);
  try {
    return CheckpointAccess::restore(payload, std::move(contents), device, history_precision);
  } catch (const LoadArgumentError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    payload.fail(std::string("invalid content: ") + e.what());
  }
}

}  // namespace optex

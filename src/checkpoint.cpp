// The checkpoint file: everything that determines the rest of a run.
//
// Layout (little-endian):
//   magic "OPTEXCKP" | u32 format version | u64 payload bytes | payload | u64 FNV-1a of payload
// The payload is a flat sequence of fields written and read in the same order
// by the two functions below (encodings in serialization.hpp):
//   options | optimizer (formats 1, 2: one; 3: the ranges) | iterate |
//   optimizer state (step, then formats 1, 2: two moment arrays; 3: a u8
//   slot count and that many arrays) | lengthscale | random state |
//   iteration | evaluations | history (size, next slot, points, gradients,
//   distances, norms, gradient Gram)
// load() reads and checks the whole file before it builds anything, and
// builds a fresh Engine, so a bad file leaves nothing half-loaded behind.
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "optex/detail/engine_backend.hpp"
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
// state slots (RmsProp keeps three buffers).
constexpr std::uint32_t kFormatVersion = 3;

std::uint64_t checksum(const std::vector<char>& bytes, std::size_t begin, std::size_t end) {
  return fnv1a64(reinterpret_cast<const unsigned char*>(bytes.data()) + begin, end - begin);
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("checkpoint '" + path + "': cannot open for reading");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

// An argument of load() that cannot be honoured (as opposed to a bad file).
struct LoadArgumentError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

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
    return w.bytes();
  }

  static Engine restore(Reader& r, std::uint32_t version, std::optional<Device> device,
                        std::optional<Precision> precision) {
    Options options = detail::get_options(r, version);
    if (device) {
      options.device = *device;
      // bf16 values are exact in fp32: a bf16 history moves to the CPU unchanged.
      if (!device->is_cuda()) options.history_precision = Precision::fp32;
    }
    if (precision) options.history_precision = *precision;
    // The caller's choices, not the file's content, decide these failures.
    if (options.history_precision != Precision::fp32 && !options.device.is_cuda()) {
      throw LoadArgumentError(std::string("history_precision: ") +
                              precision_name(options.history_precision) +
                              " storage is available on CUDA devices only, got device cpu");
    }
    if (options.device.is_cuda() && options.device.index >= cuda_device_count()) {
      throw LoadArgumentError("device: " + options.device.name() +
                              " is not available (this process sees " +
                              std::to_string(cuda_device_count()) +
                              " CUDA device(s)); pass another device to Engine::load");
    }
    constexpr std::size_t kMaxDim = std::size_t{1} << 40;
    OptimizerRanges optimizer = version >= 3 ? detail::get_optimizer_ranges(r, kMaxDim)
                                             : OptimizerRanges(detail::get_optimizer(r));
    std::vector<float> x = r.get_vector<float>(kMaxDim);
    // The constructor validates options, optimizer and iterate like any input.
    Engine e(x, optimizer, options);
    const std::size_t d = x.size();
    const auto cap = static_cast<std::size_t>(options.history);
    OptimizerState state;
    state.step = r.get<std::int64_t>();
    // Formats 1 and 2 kept two arrays, SGD's buffer or Adam's m, and Adam's v.
    const std::size_t slots = version >= 3 ? r.get<std::uint8_t>() : 2;
    if (slots > kMaxStateSlots) r.fail("more optimizer state slots than this build knows");
    for (std::size_t j = 0; j < slots; ++j) state.slots[j] = r.get_vector<float>(d);
    if (state.used() != e.optimizer_.state_slots() || state.step < 0) {
      r.fail("optimizer state does not match the optimizer");
    }

    const double lengthscale = r.get<double>();
    if (!(lengthscale > 0.0)) r.fail("lengthscale is not positive");
    const auto rng = r.get<std::uint64_t>();
    const auto iteration = r.get<std::int64_t>();
    const auto evaluations = r.get<std::int64_t>();
    GradientHistory h(cap, d);
    const auto size = r.get<std::uint64_t>();
    const auto next = r.get<std::uint64_t>();
    if (size > cap || next >= cap || (size < cap && next != size))
      r.fail("history ring position is inconsistent");
    auto points = r.get_vector<float>(cap * d);
    auto gradients = r.get_vector<float>(cap * d);
    auto distances = r.get_vector<double>(cap * cap);
    auto norms = r.get_vector<double>(cap);
    auto gram = r.get_vector<double>(cap * cap);
    if (points.size() != size * d || gradients.size() != size * d ||
        distances.size() != cap * cap || norms.size() != cap || gram.size() != cap * cap) {
      r.fail("history arrays have the wrong sizes");
    }
    if (!r.at_end()) r.fail("trailing bytes after the payload");

    std::copy(points.begin(), points.end(), h.points_.begin());
    std::copy(gradients.begin(), gradients.end(), h.gradients_.begin());
    h.squared_distances_ = std::move(distances);
    h.squared_norms_ = std::move(norms);
    h.gradient_gram_ = std::move(gram);
    h.size_ = static_cast<std::size_t>(size);
    h.next_ = static_cast<std::size_t>(next);
    e.backend_->restore(state, h);
    e.lengthscale_ = lengthscale;
    e.rng_.set_state(rng);
    e.iteration_ = iteration;
    e.evaluations_ = evaluations;
    return e;
  }
};

void Engine::save(const std::string& path) const {
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

  // Write beside the target and rename, so a crash never leaves a torn file.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("checkpoint '" + path + "': cannot open for writing");
    out.write(header.bytes().data(), static_cast<std::streamsize>(header.bytes().size()));
    out.write(payload.data(), static_cast<std::streamsize>(payload.size()));
    out.write(reinterpret_cast<const char*>(&sum), sizeof sum);
    if (!out.flush()) throw std::runtime_error("checkpoint '" + path + "': write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("checkpoint '" + path + "': rename failed: " + ec.message());
}

Engine Engine::load(const std::string& path, std::optional<Device> device,
                    std::optional<Precision> history_precision) {
  const std::vector<char> file = read_file(path);
  constexpr std::size_t kHeader = sizeof kMagic + sizeof(std::uint32_t) + sizeof(std::uint64_t);
  Reader header(file.data(), file.size(), path);
  if (file.size() < kHeader + sizeof(std::uint64_t))
    header.fail("too short to be an optex checkpoint");
  if (std::memcmp(file.data(), kMagic, sizeof kMagic) != 0)
    header.fail("not an optex checkpoint (bad magic number)");
  for (std::size_t i = 0; i < sizeof kMagic; ++i) header.get<char>();
  const auto version = header.get<std::uint32_t>();
  if (version < 1 || version > kFormatVersion) {
    header.fail("format version " + std::to_string(version) +
                " is not supported (this build reads 1 to " + std::to_string(kFormatVersion) + ")");
  }
  const auto payload_size = header.get<std::uint64_t>();
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
  Reader payload(file.data() + kHeader, static_cast<std::size_t>(payload_size), path);
  try {
    return CheckpointAccess::restore(payload, version, device, history_precision);
  } catch (const LoadArgumentError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    payload.fail(std::string("invalid content: ") + e.what());
  }
}

}  // namespace optex

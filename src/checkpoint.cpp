// The checkpoint file: everything that determines the rest of a run.
//
// Layout (little-endian):
//   magic "OPTEXCKP" | u32 format version | u64 payload bytes | payload | u64 FNV-1a of payload
// The payload is a flat sequence of fields written and read in the same order
// by the two functions below. load() reads and checks the whole file before
// it builds anything, and builds a fresh Engine, so a bad file leaves nothing
// half-loaded behind.
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "optex/detail/configuration_fingerprint.hpp"
#include "optex/detail/engine_backend.hpp"
#include "optex/engine.hpp"

static_assert(std::endian::native == std::endian::little,
              "the checkpoint format is little-endian; add byte swapping for this platform");

namespace optex {
namespace {

constexpr char kMagic[8] = {'O', 'P', 'T', 'E', 'X', 'C', 'K', 'P'};
constexpr std::uint32_t kFormatVersion = 2;  // 2 added the device and history precision

class Writer {
 public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const char*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  template <class T>
  void put_vector(std::span<const T> v) {
    put<std::uint64_t>(v.size());
    const auto* p = reinterpret_cast<const char*>(v.data());
    bytes_.insert(bytes_.end(), p, p + v.size() * sizeof(T));
  }
  template <class T>
  void put_vector(const std::vector<T>& v, std::size_t count) {
    put_vector(std::span<const T>(v.data(), count));
  }
  template <class T>
  void put_vector(const std::vector<T>& v) {
    put_vector(v, v.size());
  }
  const std::vector<char>& bytes() const { return bytes_; }

 private:
  std::vector<char> bytes_;
};

class Reader {
 public:
  Reader(const char* data, std::size_t size, std::string path)
      : data_(data), size_(size), path_(std::move(path)) {}
  template <class T>
  T get() {
    T v;
    need(sizeof(T));
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // Reads a counted array, refusing counts the remaining bytes cannot hold.
  template <class T>
  std::vector<T> get_vector(std::size_t max_count) {
    const auto count = get<std::uint64_t>();
    if (count > max_count || count > (size_ - pos_) / sizeof(T))
      fail("an array length is out of range");
    std::vector<T> v(static_cast<std::size_t>(count));
    if (!v.empty()) std::memcpy(v.data(), data_ + pos_, v.size() * sizeof(T));
    pos_ += v.size() * sizeof(T);
    return v;
  }
  bool at_end() const { return pos_ == size_; }
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("checkpoint '" + path_ + "': " + why);
  }

 private:
  void need(std::size_t n) const {
    if (size_ - pos_ < n) fail("truncated payload");
  }
  const char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::string path_;
};

std::uint64_t checksum(const std::vector<char>& bytes, std::size_t begin, std::size_t end) {
  return fnv1a64(reinterpret_cast<const unsigned char*>(bytes.data()) + begin, end - begin);
}

void put_options(Writer& w, const Options& o) {
  w.put<std::int32_t>(o.parallelism);
  w.put<std::int32_t>(o.history);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.kernel));
  w.put(o.lengthscale);
  w.put(o.noise);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.input_scaling));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.warmup));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.lengthscale_selection));
  w.put<std::int32_t>(o.selection_interval);
  w.put_vector(o.lengthscale_grid);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.proxy));
  w.put(o.seed);
  // Format 2.
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.device.kind));
  w.put<std::int32_t>(o.device.index);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.history_precision));
}

Options get_options(Reader& r, std::uint32_t version) {
  Options o;
  o.parallelism = r.get<std::int32_t>();
  o.history = r.get<std::int32_t>();
  o.kernel = static_cast<Kernel>(r.get<std::uint8_t>());
  o.lengthscale = r.get<double>();
  o.noise = r.get<double>();
  o.input_scaling = static_cast<InputScaling>(r.get<std::uint8_t>());
  o.warmup = static_cast<Warmup>(r.get<std::uint8_t>());
  o.lengthscale_selection = static_cast<LengthscaleSelection>(r.get<std::uint8_t>());
  o.selection_interval = r.get<std::int32_t>();
  o.lengthscale_grid = r.get_vector<double>(1 << 16);
  o.proxy = static_cast<Proxy>(r.get<std::uint8_t>());
  o.seed = r.get<std::uint64_t>();
  if (version >= 2) {  // format 1 predates devices: CPU, fp32
    o.device.kind = static_cast<Device::Kind>(r.get<std::uint8_t>());
    o.device.index = r.get<std::int32_t>();
    o.history_precision = static_cast<Precision>(r.get<std::uint8_t>());
  }
  return o;
}

void put_optimizer(Writer& w, const Optimizer& opt) {
  w.put<std::uint8_t>(static_cast<std::uint8_t>(opt.index()));
  if (const auto* s = std::get_if<Sgd>(&opt)) {
    w.put(s->lr);
    w.put(s->momentum);
    w.put<std::uint8_t>(s->nesterov);
    w.put(s->weight_decay);
  } else {
    const auto& a = std::get<Adam>(opt);
    w.put(a.lr);
    w.put(a.beta1);
    w.put(a.beta2);
    w.put(a.eps);
    w.put(a.weight_decay);
    w.put<std::uint8_t>(a.decoupled_weight_decay);
  }
}

Optimizer get_optimizer(Reader& r) {
  const auto tag = r.get<std::uint8_t>();
  if (tag == 0) {
    Sgd s;
    s.lr = r.get<double>();
    s.momentum = r.get<double>();
    s.nesterov = r.get<std::uint8_t>() != 0;
    s.weight_decay = r.get<double>();
    return s;
  }
  if (tag != 1) r.fail("unknown optimizer tag " + std::to_string(tag));
  Adam a;
  a.lr = r.get<double>();
  a.beta1 = r.get<double>();
  a.beta2 = r.get<double>();
  a.eps = r.get<double>();
  a.weight_decay = r.get<double>();
  a.decoupled_weight_decay = r.get<std::uint8_t>() != 0;
  return a;
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("checkpoint '" + path + "': cannot open for reading");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

std::uint64_t detail::configuration_fingerprint(const Options& options, const Optimizer& optimizer,
                                                std::size_t dim) {
  Options shared = options;
  shared.device.index = 0;  // one GPU per rank: the index may differ
  Writer w;
  put_options(w, shared);
  put_optimizer(w, optimizer);
  w.put<std::uint64_t>(dim);
  return checksum(w.bytes(), 0, w.bytes().size());
}

// An argument of load() that cannot be honoured (as opposed to a bad file).
struct LoadArgumentError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Reaches into the engine and its history to save and restore every member.
struct CheckpointAccess {
  static std::vector<char> payload(const Engine& e) {
    Writer w;
    put_options(w, e.options_);
    put_optimizer(w, e.optimizer_);
    w.put_vector(e.iterate());  // host copies on a device engine
    const OptimizerState& state = e.optimizer_state();
    w.put(state.step);
    w.put_vector(state.first_moment);
    w.put_vector(state.second_moment);
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
    Options options = get_options(r, version);
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
    Optimizer optimizer = get_optimizer(r);
    std::vector<float> x = r.get_vector<float>(std::size_t{1} << 40);
    // The constructor validates options, optimizer and iterate like any input.
    Engine e(x, optimizer, options);
    const std::size_t d = x.size();
    const auto cap = static_cast<std::size_t>(options.history);
    OptimizerState state;
    state.step = r.get<std::int64_t>();
    state.first_moment = r.get_vector<float>(d);
    state.second_moment = r.get_vector<float>(d);
    const OptimizerState fresh = init_state(optimizer, d);
    if (state.first_moment.size() != fresh.first_moment.size() ||
        state.second_moment.size() != fresh.second_moment.size() || state.step < 0) {
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

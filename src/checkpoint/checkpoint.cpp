// The checkpoint file: an EngineSnapshot (engine_snapshot.hpp), framed.
//
// Layout (little-endian):
//   magic "OPTEXCKP" | u32 format version | u64 payload bytes | payload | u64 FNV-1a of payload
// The payload is the snapshot's fields in one order, written by write_payload
// and read by read_payload (checkpoint_payload.cpp; encodings in
// serialization.hpp), which validates what it read as from_snapshot() would.
// load() checks its arguments, then reads and checks the whole file (framing,
// then every field and value) before it builds anything, and builds a fresh
// Engine, so a bad file leaves nothing half-loaded behind. save() replaces the
// file atomically (atomic_file.hpp).
#include <bit>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_payload.hpp"
#include "checkpoint/serialization.hpp"
#include "engine/resumed_options.hpp"
#include "optex/checkpoint/atomic_file.hpp"
#include "optex/checkpoint/file_path.hpp"
#include "optex/checkpoint/regular_file.hpp"
#include "optex/engine/engine.hpp"

static_assert(std::endian::native == std::endian::little,
              "the checkpoint format is little-endian; add byte swapping for this platform");

namespace optex {
namespace {

using detail::Reader;
using detail::Writer;

constexpr char kMagic[8] = {'O', 'P', 'T', 'E', 'X', 'C', 'K', 'P'};
// 2 added the device and history precision; 3 the optimizer ranges and the
// state slots (RmsProp keeps three buffers); 4 the evaluations per point, the
// strategy, the safeguards and their state; 5 each range's step offset; 6 the
// verified mode, its tolerance and window; 7 the proxy distances.
constexpr std::uint32_t kFormatVersion = 7;

std::uint64_t checksum(const std::vector<char>& bytes, std::size_t begin, std::size_t end) {
  return fnv1a64(reinterpret_cast<const unsigned char*>(bytes.data()) + begin, end - begin);
}

}  // namespace

void Engine::save(const std::string& path) const {
  detail::check_file_path("path", path);
  if (pending_) {
    throw std::runtime_error(
        "save: a batch is pending (ask() without tell()); save before ask() "
        "or after tell()");
  }
  const EngineSnapshot state = snapshot();
  detail::PayloadPieces payload;
  detail::write_payload(state, payload);
  Writer header;
  for (char c : kMagic) header.put(c);
  header.put(kFormatVersion);
  header.put<std::uint64_t>(payload.size());
  const std::uint64_t sum = payload.checksum();

  // Readers see the old file or the new one, never a torn one (atomic_file.hpp).
  std::vector<std::span<const char>> pieces{header.bytes()};
  pieces.insert(pieces.end(), payload.pieces().begin(), payload.pieces().end());
  pieces.push_back({reinterpret_cast<const char*>(&sum), sizeof sum});
  detail::write_file_atomically("checkpoint", path, pieces);
}

namespace detail {

EngineSnapshot read_checkpoint(const std::string& path, std::uint32_t* format_version) {
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
  if (format_version != nullptr) *format_version = version;
  return detail::read_payload(payload, version);
}

}  // namespace detail

Engine Engine::load(const std::string& path, std::optional<Device> device,
                    std::optional<Precision> history_precision) {
  // The arguments first, so that their faults are never blamed on a file.
  detail::check_file_path("path", path);
  detail::check_resume_arguments(device, history_precision);
  EngineSnapshot state = detail::read_checkpoint(path);
  // The caller's choice, not the file's content, decides a failure here.
  const Options options = detail::resumed_options(state.options, device, history_precision);
  const auto fail = [&](const std::string& why) {
    throw std::runtime_error("checkpoint '" + path + "': " + why);
  };
  if (const std::string why = detail::unavailable_device(options); !why.empty()) {
    fail("saved on " + why + "; pass a device to Engine::load to resume elsewhere");
  }
  try {
    return from_validated_snapshot(std::move(state), options);
  } catch (const std::invalid_argument& e) {
    fail(std::string("invalid content: ") + e.what());
  }
  throw std::logic_error("unreachable");
}

}  // namespace optex

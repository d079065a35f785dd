// The payload of a checkpoint: the serialisation of an EngineSnapshot
// (engine_snapshot.hpp), written and read in one field order
// (docs/DESIGN.md section 6; encodings in serialization.hpp). Private to the
// library: checkpoint.cpp frames it (magic, version, size, checksum).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "checkpoint/serialization.hpp"
#include "optex/engine/engine_snapshot.hpp"

namespace optex::detail {

// A payload as pieces to write one after the other: the small fields in
// buffers of their own, the arrays in place in the snapshot they were
// written from, which must outlive the pieces. Saving thus makes no second
// copy of the history.
class PayloadPieces {
 public:
  PayloadPieces() = default;
  PayloadPieces(const PayloadPieces&) = delete;  // the pieces point into buffers_
  PayloadPieces& operator=(const PayloadPieces&) = delete;

  // Appends what `w` holds (copied).
  void add(const Writer& w);
  // Appends `values` in place, without their count (write it to a Writer first).
  template <class T>
  void add_in_place(std::span<const T> values) {
    pieces_.push_back({reinterpret_cast<const char*>(values.data()), values.size_bytes()});
  }

  std::span<const std::span<const char>> pieces() const { return pieces_; }
  std::uint64_t size() const;
  std::uint64_t checksum() const;  // FNV-1a over the pieces, in order

 private:
  std::deque<std::vector<char>> buffers_;  // a deque: adding never moves a buffer
  std::vector<std::span<const char>> pieces_;
};

// The payload of `snapshot` in the current format (7): options | optimizer
// ranges (each with its step offset) | iterate | optimizer state (step, a u8
// slot count, the slots) | lengthscale | random state | iteration |
// evaluations | history (size, next slot, points, gradients, distances,
// norms, gradient Gram) | adaptive split state | last step length | verified
// window.
void write_payload(const EngineSnapshot& snapshot, PayloadPieces& out);

// Reads a payload of format `version` (1 to 7) to its end, then validates the
// snapshot it holds (validate in engine_snapshot.hpp). Every count is
// checked against the bytes left before anything is allocated for it, and
// against the options and the iterate; fields an older format lacks take the
// values a new engine has (step offsets 0, a fresh adaptive state). Throws
// std::runtime_error naming the field, its byte offset and the first bad value.
EngineSnapshot read_payload(Reader& r, std::uint32_t version);

// The snapshot in the checkpoint file at `path` (the format of Engine::save),
// its framing checked and every field validated as read_payload does; throws
// std::runtime_error naming the path, the field and the reason. The file's
// format version goes to *format_version where given.
EngineSnapshot read_checkpoint(const std::string& path, std::uint32_t* format_version = nullptr);

}  // namespace optex::detail

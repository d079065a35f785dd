// The byte encoding shared by checkpoints (checkpoint.cpp) and the
// distributed engine's configuration fingerprint
// (configuration_fingerprint.cpp): one writer and one reader, and the
// encodings of Options and of the optimizer ranges. Little-endian; every
// array is a u64 count followed by its elements.
//
// Private to the library (src/): the file format is documented in
// checkpoint.cpp and docs/DESIGN.md section 6.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "optex/engine/options.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"

namespace optex::detail {

// The text of a value in a message: integers as integers, doubles in the
// shortest form that reads back the same.
template <class T>
std::string value_text(const T& v) {
  if constexpr (std::is_floating_point_v<T>) {
    char text[32];
    const auto result = std::to_chars(text, text + sizeof text, v);
    return std::string(text, result.ptr);
  } else {
    return std::to_string(+v);
  }
}

class Writer {
 public:
  // A named value, as a labelled writer records it.
  struct Field {
    std::string name;
    std::string value;
  };
  // A labelled writer also records the name and text of every value put
  // with a name (the configuration fingerprint's, to say which field differs).
  explicit Writer(bool labelled = false) : labelled_(labelled) {}

  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const char*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  // `text`: how to show the value (default: value_text).
  template <class T>
  void put(const T& v, std::string_view name, std::string text = {}) {
    put(v);
    if (labelled_) fields_.push_back({std::string(name), text.empty() ? value_text(v) : text});
  }
  void put_vector(const std::vector<double>& v, std::string_view name) {
    put_vector(v);
    if (!labelled_) return;
    std::string text = "[";
    for (std::size_t k = 0; k < v.size(); ++k) text += (k > 0 ? ", " : "") + value_text(v[k]);
    fields_.push_back({std::string(name), text + "]"});
  }
  const std::vector<Field>& fields() const { return fields_; }
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
  bool labelled_ = false;
  std::vector<Field> fields_;
};

// Reads what Writer wrote. Every read names the field it reads, and every
// failure is a std::runtime_error "checkpoint '<path>': <field> at byte <n>:
// <why>", n counting from the start of the file.
class Reader {
 public:
  // `size` bytes at `data`, which start at byte `offset` of the file at `path`.
  Reader(const char* data, std::size_t size, std::string path, std::size_t offset = 0)
      : data_(data), size_(size), path_(std::move(path)), offset_(offset) {}
  template <class T>
  T get(std::string_view field) {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    need(field, sizeof(T));
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // A flag stored as one byte: 0 or 1, anything else is refused.
  bool get_flag(std::string_view field) {
    const std::size_t at = offset();
    const auto b = get<std::uint8_t>(field);
    if (b > 1) fail_at(field, at, "a flag holds " + std::to_string(b) + " (expected 0 or 1)");
    return b != 0;
  }
  // Reads a counted array, refusing a count above `max_count` or more
  // elements than the remaining bytes hold, before anything is allocated.
  template <class T>
  std::vector<T> get_vector(std::string_view field, std::size_t max_count) {
    const std::size_t at = offset();
    const auto count = get<std::uint64_t>(field);
    if (count > max_count) {
      fail_at(field, at,
              "holds " + std::to_string(count) + " elements, more than the " +
                  std::to_string(max_count) + " it may");
    }
    if (count > remaining() / sizeof(T)) {
      fail_at(field, at,
              "announces " + std::to_string(count) + " elements of " + std::to_string(sizeof(T)) +
                  " bytes, but only " + std::to_string(remaining()) + " bytes remain");
    }
    std::vector<T> v(static_cast<std::size_t>(count));
    if (!v.empty()) std::memcpy(v.data(), data_ + pos_, v.size() * sizeof(T));
    pos_ += v.size() * sizeof(T);
    return v;
  }
  bool at_end() const { return pos_ == size_; }
  std::size_t remaining() const { return size_ - pos_; }
  // The file offset of the next byte to read.
  std::size_t offset() const { return offset_ + pos_; }
  const std::string& path() const { return path_; }
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("checkpoint '" + path_ + "': " + why);
  }
  [[noreturn]] void fail_at(std::string_view field, std::size_t at, const std::string& why) const {
    fail(std::string(field) + " at byte " + std::to_string(at) + ": " + why);
  }

 private:
  void need(std::string_view field, std::size_t n) const {
    if (size_ - pos_ < n) {
      fail_at(field, offset(),
              "truncated payload (needs " + std::to_string(n) + " bytes, " +
                  std::to_string(size_ - pos_) + " remain)");
    }
  }
  const char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::string path_;
  std::size_t offset_;
};

// Options: every field, in the order of format `version` (1 has no device
// and history precision: CPU, fp32). Read as stored: the caller validates.
void put_options(Writer& w, const Options& o);
Options get_options(Reader& r, std::uint32_t version);

// One optimizer: its checkpoint tag, then its hyperparameters in declaration
// order (a double as 8 bytes, a bool as one byte). Formats 1 and 2 stored
// the single optimizer of an engine exactly so.
// `name` prefixes the names of its fields ("optimizer[1].lr").
void put_optimizer(Writer& w, const Optimizer& optimizer, std::string_view name = "optimizer");
Optimizer get_optimizer(Reader& r);

// Format 3: a u32 count, then per range its u64 size and its optimizer;
// format 5 adds the range's i64 step offset after its size (earlier formats
// read 0). `step_offsets_at`, when given, receives the file offset of each
// range's step offset (formats 5 and later).
void put_optimizer_ranges(Writer& w, const OptimizerRanges& ranges);
OptimizerRanges get_optimizer_ranges(Reader& r, std::size_t dim_limit, std::uint32_t version,
                                     std::vector<std::size_t>* step_offsets_at = nullptr);

}  // namespace optex::detail

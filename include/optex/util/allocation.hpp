// Buffers whose size comes from the caller (d, T0, N) say what they were for when
// they cannot be had. std::bad_alloc carries no message, and a byte count that
// overflows std::size_t would wrap to a small buffer, so:
//   - checked_bytes computes the size first and refuses one that no buffer can
//     have (more than PTRDIFF_MAX bytes) with std::length_error (Python ValueError);
//   - allocate_or_explain turns a std::bad_alloc into std::runtime_error (Python
//     RuntimeError; a subclass of std::bad_alloc would reach Python as a bare
//     MemoryError), naming what was asked for and the byte count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

namespace optex::detail {

// The bytes of prod(counts) elements of `element_bytes` each. `what` names the
// parameters ("history: 4096 points of dimension 1048576"), `contents` the
// buffers ("fp32 points and gradients").
inline std::size_t checked_bytes(const std::string& what, const std::string& contents,
                                 std::initializer_list<std::size_t> counts,
                                 std::size_t element_bytes) {
  constexpr auto kLargest = static_cast<std::size_t>(PTRDIFF_MAX);  // std::vector's bound
  for (const std::size_t c : counts) {
    if (c == 0) return 0;
  }
  std::size_t bytes = element_bytes;
  for (const std::size_t c : counts) {
    if (bytes > kLargest / c) {
      throw std::length_error(what + " need more than " + std::to_string(kLargest) + " bytes (" +
                              contents + "): no buffer can be that large");
    }
    bytes *= c;
  }
  return bytes;
}

// Returns allocate(), which allocates `bytes` in all, or throws std::runtime_error
// "<what> need <bytes> bytes (<contents>); allocation failed".
template <class Allocate>
decltype(auto) allocate_or_explain(const std::string& what, const std::string& contents,
                                   std::size_t bytes, Allocate&& allocate) {
  try {
    return std::forward<Allocate>(allocate)();
  } catch (const std::bad_alloc&) {
    throw std::runtime_error(what + " need " + std::to_string(bytes) + " bytes (" + contents +
                             "); allocation failed");
  }
}

}  // namespace optex::detail

// The manifest of a sharded checkpoint (src/sharded/sharded_checkpoint.cpp): its
// text, written by rank 0 once every slice file is in place, and its strict
// reader. Private to the library.
//
// Format 2, one "<key> <values>" line each, single spaces, canonical decimal
// numbers, nothing after the last line:
//
//   optex sharded checkpoint 2
//   ranks <W>
//   dim <d>
//   token <16 lowercase hex digits: the save's, in its slice files' names>
//   iteration <t>
//   ranges <k> <size_1> ... <size_k>
//   tag <r> <u64>              one per rank, in rank order
//   check <16 hex digits>      fnv1a64 of every byte before this line
//
// Format 1 (read only) has "generation <a|b>" for the token and no check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace optex::detail {

inline constexpr int kShardedManifestFormat = 2;
inline constexpr std::size_t kTokenDigits = 16;

struct ShardedManifest {
  int version = kShardedManifestFormat;
  int ranks = 0;
  std::size_t dim = 0;
  std::string suffix;  // of the slice files: the token (format 2), a or b (format 1)
  std::int64_t iteration = 0;
  std::vector<std::size_t> range_sizes;  // the whole vector's optimizer ranges
  std::vector<std::uint64_t> tags;       // per rank: binds its slice file
  std::uint64_t content = 0;             // format 2: fnv1a64 of the lines before the tags
};

// Rank r's slice file beside the manifest at `path`.
std::string shard_path(const std::string& path, int rank, int ranks, std::string_view suffix);

std::uint64_t hash_text(std::string_view text);
// `v` as kTokenDigits lowercase hex digits.
std::string hex(std::uint64_t v);

// Format 2: the slice file of rank r (its tag `slice`) bound to the
// manifest's ranks, d, token, iteration and ranges (`content`).
std::uint64_t bound_tag(std::uint64_t content, int rank, std::uint64_t slice);

// The lines before the tags (format 2), and the whole text.
std::string manifest_head(const ShardedManifest& m);
std::string manifest_text(const ShardedManifest& m);

// Parses `text`, read from `path`; std::runtime_error naming the path and
// the line for anything but a well-formed manifest of format 1 or 2.
ShardedManifest parse_manifest(const std::string& path, std::string_view text);

// The bytes of the regular file at `path` (std::runtime_error otherwise).
std::string read_text(const std::string& path);
// The manifest at `path`, if there is a valid one.
std::optional<ShardedManifest> try_read_manifest(const std::string& path);

}  // namespace optex::detail

// The sharded checkpoint's manifest: its text and its strict reader
// (sharded_manifest.hpp).
#include "sharded/sharded_manifest.hpp"

#include <algorithm>
#include <charconv>
#include <stdexcept>

#include "optex/checkpoint/regular_file.hpp"
#include "optex/util/random.hpp"

namespace optex::detail {
namespace {

constexpr std::string_view kHeaderPrefix = "optex sharded checkpoint ";
constexpr int kFormat = kShardedManifestFormat;
constexpr int kMaxRanks = 1 << 20;

// is exactly its key and values separated by single spaces; a number is its
// canonical decimal (digits only, no sign, no leading zero); anything else
// throws naming the path and the line.
class ManifestReader {
 public:
  ManifestReader(const std::string& path, std::string_view text) : path_(path), text_(text) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("sharded checkpoint '" + path_ + "': line " + std::to_string(line_) +
                             ": " + why);
  }
  // The next line, whole.
  std::string_view raw(std::string_view expected) {
    ++line_;
    start_ = at_;
    if (at_ == text_.size()) fail("missing (expected " + std::string(expected) + "): truncated");
    const std::size_t end = text_.find('\n', at_);
    if (end == std::string_view::npos) fail("truncated: the line does not end");
    const std::string_view line = text_.substr(at_, end - at_);
    at_ = end + 1;
    return line;
  }
  // The values of the next line, which must be `key` and `count` values
  // (at least `count` when `at_least`).
  std::vector<std::string_view> line(std::string_view key, std::size_t count,
                                     bool at_least = false) {
    std::string expected(1, '\'');  // built up: GCC 12 misreads "'" + key + "'" (-Wrestrict)
    expected.append(key).push_back('\'');
    const std::string_view text = raw(expected);
    std::vector<std::string_view> fields;
    std::size_t from = 0;
    while (true) {
      const std::size_t space = text.find(' ', from);
      fields.push_back(
          text.substr(from, space == std::string_view::npos ? text.npos : space - from));
      if (space == std::string_view::npos) break;
      from = space + 1;
    }
    if (fields[0] != key) fail("expected '" + std::string(key) + "', got '" + quoted(text) + "'");
    for (std::string_view f : fields) {
      if (f.empty())
        fail(std::string(key) +
             ": fields are separated by single spaces, with none before or after");
    }
    fields.erase(fields.begin());
    if (fields.size() < count || (!at_least && fields.size() > count)) {
      fail(std::string(key) + ": " + std::to_string(fields.size()) + " values, expected " +
           (at_least ? "at least " : "") + std::to_string(count));
    }
    return fields;
  }
  template <class T>
  T number(std::string_view field, const std::string& what, T lo, T hi) {
    std::uint64_t v = 0;
    const bool digits =
        !field.empty() && std::ranges::all_of(field, [](char c) { return c >= '0' && c <= '9'; });
    const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), v);
    if (!digits || (field.size() > 1 && field[0] == '0') || error != std::errc() ||
        end != field.data() + field.size()) {
      fail(what + ": '" + quoted(field) + "' is not a number (decimal digits only)");
    }
    if (v < static_cast<std::uint64_t>(lo) || v > static_cast<std::uint64_t>(hi)) {
      fail(what + ": " + std::string(field) + " is out of range [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]");
    }
    return static_cast<T>(v);
  }
  std::uint64_t hex_number(std::string_view field, const std::string& what) {
    std::uint64_t v = 0;
    const bool ok = field.size() == kTokenDigits && std::ranges::all_of(field, [](char c) {
                      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                    });
    if (!ok) fail(what + ": '" + quoted(field) + "' is not 16 lowercase hexadecimal digits");
    std::from_chars(field.data(), field.data() + field.size(), v, 16);
    return v;
  }
  // The header line: the format's version.
  int header() {
    if (text_.empty()) {
      ++line_;
      fail("not a sharded optex checkpoint: the file is empty");
    }
    const std::string_view text = raw("the header");
    for (int version : {1, kFormat}) {
      if (text == std::string(kHeaderPrefix) + std::to_string(version)) return version;
    }
    fail("not a sharded optex checkpoint (or a format this build cannot read): '" + quoted(text) +
         "'");
  }
  // The bytes before the line just read.
  std::string_view before_line() const { return text_.substr(0, start_); }
  void end() {
    ++line_;
    if (at_ != text_.size()) fail("unexpected text after the last line");
  }

 private:
  static std::string quoted(std::string_view text) {
    std::string s(text.substr(0, 60));
    for (char& c : s) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
    }
    return text.size() > 60 ? s + "..." : s;
  }

  std::string path_;
  std::string_view text_;
  std::size_t at_ = 0;
  std::size_t start_ = 0;
  int line_ = 0;
};

}  // namespace

std::string shard_path(const std::string& path, int rank, int ranks, std::string_view suffix) {
  return path + ".shard-" + std::to_string(rank) + "-of-" + std::to_string(ranks) + "." +
         std::string(suffix);
}

std::uint64_t hash_text(std::string_view text) {
  return fnv1a64(reinterpret_cast<const unsigned char*>(text.data()), text.size());
}

std::string hex(std::uint64_t v) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string s(kTokenDigits, '0');
  for (std::size_t i = 0; i < kTokenDigits; ++i)
    s[kTokenDigits - 1 - i] = kHex[(v >> (4 * i)) & 0xF];
  return s;
}

// Format 2: the slice file of rank r bound to the manifest's ranks, d, token,
// iteration and ranges.
std::uint64_t bound_tag(std::uint64_t content, int rank, std::uint64_t slice) {
  return mix_seed(mix_seed(content, static_cast<std::uint64_t>(rank)), slice);
}

// The lines before the tags (format 2).
std::string manifest_head(const ShardedManifest& m) {
  std::string s = std::string(kHeaderPrefix) + std::to_string(kFormat) + "\nranks " +
                  std::to_string(m.ranks) + "\ndim " + std::to_string(m.dim) + "\ntoken " +
                  m.suffix + "\niteration " + std::to_string(m.iteration) + "\nranges " +
                  std::to_string(m.range_sizes.size());
  for (std::size_t size : m.range_sizes) s += ' ' + std::to_string(size);
  return s + '\n';
}

std::string manifest_text(const ShardedManifest& m) {
  std::string s = manifest_head(m);
  for (int r = 0; r < m.ranks; ++r)
    s += "tag " + std::to_string(r) + ' ' + std::to_string(m.tags[static_cast<std::size_t>(r)]) +
         '\n';
  return s + "check " + hex(hash_text(s)) + '\n';
}

ShardedManifest parse_manifest(const std::string& path, std::string_view text) {
  ManifestReader r(path, text);
  ShardedManifest m;
  m.version = r.header();
  m.ranks = r.number(r.line("ranks", 1)[0], "ranks", 1, kMaxRanks);
  m.dim = r.number<std::size_t>(r.line("dim", 1)[0], "dim", 1, std::size_t{1} << 48);
  if (m.version == 1) {
    m.suffix = std::string(r.line("generation", 1)[0]);
    if (m.suffix != "a" && m.suffix != "b") r.fail("generation: must be a or b");
  } else {
    const std::string_view token = r.line("token", 1)[0];
    r.hex_number(token, "token");
    m.suffix = std::string(token);
  }
  m.iteration = r.number<std::int64_t>(r.line("iteration", 1)[0], "iteration", 0, INT64_MAX);
  const std::vector<std::string_view> ranges = r.line("ranges", 1, true);
  const auto count = r.number<std::size_t>(ranges[0], "ranges", 1, m.dim);
  if (ranges.size() != count + 1) {
    r.fail("ranges: " + std::to_string(ranges.size() - 1) + " sizes, expected " +
           std::to_string(count));
  }
  std::size_t total = 0;
  for (std::size_t k = 0; k < count; ++k) {
    m.range_sizes.push_back(r.number<std::size_t>(ranges[k + 1], "range size", 1, m.dim - total));
    total += m.range_sizes.back();
  }
  if (total != m.dim) r.fail("ranges: sizes add up to " + std::to_string(total) + ", not dim");
  for (int k = 0; k < m.ranks; ++k) {
    const std::vector<std::string_view> tag = r.line("tag", 2);
    if (k == 0 && m.version != 1) m.content = hash_text(r.before_line());
    if (r.number(tag[0], "tag rank", 0, m.ranks - 1) != k) r.fail("tags out of order");
    m.tags.push_back(r.number<std::uint64_t>(tag[1], "tag", 0, UINT64_MAX));
  }
  if (m.version != 1) {
    const std::uint64_t stored = r.hex_number(r.line("check", 1)[0], "check");
    const std::uint64_t computed = hash_text(r.before_line());
    if (stored != computed) {
      r.fail("check: the manifest's checksum " + hex(stored) + " is not that of its content (" +
             hex(computed) + "): it was altered or damaged");
    }
  }
  r.end();
  return m;
}

std::string read_text(const std::string& path) {
  const std::vector<char> bytes = detail::read_regular_file("sharded checkpoint", path);
  return std::string(bytes.begin(), bytes.end());
}

// The manifest at `path`, if there is a valid one.
std::optional<ShardedManifest> try_read_manifest(const std::string& path) {
  try {
    return parse_manifest(path, read_text(path));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace optex::detail

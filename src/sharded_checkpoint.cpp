// Checkpoints of a sharded run: one Engine checkpoint per rank (its slice)
// beside a manifest at the path the caller names.
//
//   <path>                      the manifest (text): ranks, d, the generation
//                               in use, the iteration, the whole ranges' sizes,
//                               and a tag per rank binding its slice file
//   <path>.shard-<r>-of-<W>.<g> rank r's slice, g = a or b
//
// save() writes the generation the manifest does not name, and only when every
// rank has written its file does rank 0 replace the manifest atomically: a
// failure anywhere leaves the manifest naming the previous, complete set.
// load() reads the manifest on every rank, each rank its slice file, checks
// each file's tag and that the ranks hold the same shared state.
#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "checkpoint_payload.hpp"
#include "optex/detail/atomic_file.hpp"
#include "optex/detail/file_path.hpp"
#include "optex/detail/regular_file.hpp"
#include "optex/random.hpp"
#include "rank_agreement.hpp"
#include "sharded_engine_parts.hpp"

namespace optex {
namespace {

using detail::collectively;

constexpr const char* kManifestHeader = "optex sharded checkpoint 1";

struct Manifest {
  int ranks = 0;
  std::size_t dim = 0;
  char generation = 'a';
  std::int64_t iteration = 0;
  std::vector<std::size_t> range_sizes;  // the whole vector's optimizer ranges
  std::vector<std::uint64_t> tags;       // per rank: slice_tag of its file
};

std::string shard_path(const std::string& path, int rank, int ranks, char generation) {
  return path + ".shard-" + std::to_string(rank) + "-of-" + std::to_string(ranks) + "." +
         generation;
}

// Binds a slice file to its checkpoint: the shared state and the slice's iterate.
std::uint64_t slice_tag(const Engine& engine) {
  const std::span<const float> x = engine.iterate();
  return mix_seed(detail::shared_state_hash(engine),
                  fnv1a64(reinterpret_cast<const unsigned char*>(x.data()), x.size_bytes()));
}

std::string manifest_text(const Manifest& m) {
  std::ostringstream out;
  out << kManifestHeader << "\nranks " << m.ranks << "\ndim " << m.dim << "\ngeneration "
      << m.generation << "\niteration " << m.iteration << "\nranges " << m.range_sizes.size();
  for (std::size_t size : m.range_sizes) out << ' ' << size;
  for (int r = 0; r < m.ranks; ++r)
    out << "\ntag " << r << ' ' << m.tags[static_cast<std::size_t>(r)];
  out << '\n';
  return out.str();
}

// Reads one "<key> <values...>" line; anything else throws naming the line.
class ManifestReader {
 public:
  ManifestReader(const std::string& path, const std::vector<char>& bytes)
      : path_(path), in_(std::string(bytes.begin(), bytes.end())) {}
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("sharded checkpoint '" + path_ + "': line " + std::to_string(line_) +
                             ": " + why);
  }
  std::istringstream line(const std::string& key) {
    std::string text;
    ++line_;
    if (!std::getline(in_, text)) fail("missing (expected '" + key + "'): truncated");
    std::istringstream fields(text);
    std::string got;
    if (!(fields >> got) || got != key) fail("expected '" + key + "', got '" + text + "'");
    return fields;
  }
  template <class T>
  T number(std::istringstream& fields, const std::string& what, T lo, T hi) {
    T v{};
    if (!(fields >> v) || v < lo || v > hi) fail(what + ": not a number in range");
    return v;
  }
  void header() {
    std::string text;
    ++line_;
    if (!std::getline(in_, text) || text != kManifestHeader) fail("not a sharded optex checkpoint");
  }
  void end() {
    std::string rest;
    if (in_ >> rest) fail("unexpected text after the last tag");
  }

 private:
  std::string path_;
  std::istringstream in_;
  int line_ = 0;
};

Manifest read_manifest(const std::string& path) {
  ManifestReader r(path, detail::read_regular_file("sharded checkpoint", path));
  Manifest m;
  r.header();
  auto ranks = r.line("ranks");
  m.ranks = r.number(ranks, "ranks", 1, 1 << 20);
  auto dim = r.line("dim");
  m.dim = r.number<std::size_t>(dim, "dim", 1, std::size_t{1} << 48);
  auto generation = r.line("generation");
  std::string g;
  if (!(generation >> g) || (g != "a" && g != "b")) r.fail("generation: must be a or b");
  m.generation = g[0];
  auto iteration = r.line("iteration");
  m.iteration = r.number<std::int64_t>(iteration, "iteration", 0, INT64_MAX);
  auto ranges = r.line("ranges");
  const auto count = r.number<std::size_t>(ranges, "ranges", 1, m.dim);
  std::size_t total = 0;
  for (std::size_t k = 0; k < count; ++k) {
    m.range_sizes.push_back(r.number<std::size_t>(ranges, "range size", 1, m.dim - total));
    total += m.range_sizes.back();
  }
  if (total != m.dim) r.fail("ranges: sizes add up to " + std::to_string(total) + ", not dim");
  for (int k = 0; k < m.ranks; ++k) {
    auto tag = r.line("tag");
    if (r.number(tag, "tag rank", 0, m.ranks - 1) != k) r.fail("tags out of order");
    m.tags.push_back(r.number<std::uint64_t>(tag, "tag", 0, UINT64_MAX));
  }
  r.end();
  return m;
}

// One rank's part of the whole optimizer ranges: each of its slice's ranges
// at its offset in the whole vector. Trivially copyable, so the ranks can
// exchange them as bytes.
struct Piece {
  std::uint64_t offset = 0;
  OptimizerRange range;
};
static_assert(std::is_trivially_copyable_v<Piece>);

// Collective: the whole vector's ranges from the slices' (each rank read its
// own from its file) and the sizes in the manifest.
OptimizerRanges whole_ranges(const Engine& slice, const Manifest& m, Communicator& comm) {
  std::vector<Piece> mine;
  std::size_t at = slice.shard().offset;
  for (const OptimizerRange& r : slice.optimizer_ranges().ranges()) {
    mine.push_back({at, r});
    at += r.size;
  }
  const std::vector<std::string> all = comm.all_gather_text(
      std::string_view(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(Piece)));
  std::vector<Piece> pieces;
  for (const std::string& bytes : all) {
    for (std::size_t k = 0; k + sizeof(Piece) <= bytes.size(); k += sizeof(Piece)) {
      Piece p;
      std::memcpy(&p, bytes.data() + k, sizeof p);
      pieces.push_back(p);
    }
  }
  std::vector<OptimizerRange> whole;
  std::size_t offset = 0;
  for (std::size_t size : m.range_sizes) {
    const auto first = std::find_if(pieces.begin(), pieces.end(),
                                    [&](const Piece& p) { return p.offset == offset; });
    if (first == pieces.end()) {
      throw std::runtime_error("sharded checkpoint: no slice file holds the range at coordinate " +
                               std::to_string(offset) + " the manifest names");
    }
    whole.push_back({size, first->range.optimizer, first->range.step_offset});
    offset += size;
  }
  return OptimizerRanges(std::move(whole));
}

}  // namespace

void ShardedEngine::save(const std::string& path) {
  collectively(*world_, "ShardedEngine::save", true, [&] {
    detail::check_file_path("path", path);
    if (engine_.pending()) {
      throw std::runtime_error(
          "save: a batch is pending (ask() without tell()); save after tell()");
    }
  });
  if (!detail::ranks_differing_from_rank0(
           *world_, fnv1a64(reinterpret_cast<const unsigned char*>(path.data()), path.size()))
           .empty()) {
    throw std::invalid_argument(
        "path: the ranks passed different paths; every rank must pass the "
        "same");
  }
  // The generation the manifest does not name (a without a readable one).
  char generation = 'a';
  if (rank() == 0) {
    try {
      generation = read_manifest(path).generation == 'a' ? 'b' : 'a';
    } catch (const std::exception&) {
    }
  }
  world_->broadcast(std::span<char>(&generation, 1), 0);
  collectively(*world_, "ShardedEngine::save", false,
               [&] { engine_.save(shard_path(path, rank(), world_size(), generation)); });
  Manifest m;
  m.ranks = world_size();
  m.dim = shard_.dim;
  m.generation = generation;
  m.iteration = engine_.iteration();
  for (const OptimizerRange& r : optimizer_.ranges()) m.range_sizes.push_back(r.size);
  m.tags.resize(static_cast<std::size_t>(world_size()));
  const std::uint64_t tag = slice_tag(engine_);
  world_->all_gather(std::span<const std::uint64_t>(&tag, 1), std::span<std::uint64_t>(m.tags));
  collectively(*world_, "ShardedEngine::save", false, [&] {
    if (rank() != 0) return;
    const std::string text = manifest_text(m);
    const std::span<const char> pieces[] = {{text.data(), text.size()}};
    detail::write_file_atomically("sharded checkpoint", path, pieces);
  });
}

ShardedEngine ShardedEngine::load(const std::string& path, Communicator& communicator,
                                  DistributedOptions distributed) {
  Manifest m;
  CoordinateShard shard;
  collectively(communicator, "ShardedEngine::load", false, [&] {
    detail::check_file_path("path", path);
    m = read_manifest(path);
    if (m.ranks != communicator.size()) {
      throw std::runtime_error("sharded checkpoint '" + path + "': saved by " +
                               std::to_string(m.ranks) + " ranks, loaded by " +
                               std::to_string(communicator.size()) +
                               " (a sharded checkpoint resumes on the same number of ranks)");
    }
    shard = shard_of(m.dim, m.ranks, communicator.rank());
  });
  Parts parts;
  parts.stats = std::make_unique<CommunicationStats>();
  parts.sums = std::make_unique<CommunicatorSums>(communicator, parts.stats.get());
  shard.sums = parts.sums.get();
  collectively(communicator, "ShardedEngine::load", false, [&] {
    const std::string file = shard_path(path, communicator.rank(), m.ranks, m.generation);
    EngineSnapshot snapshot = detail::read_checkpoint(file);
    const auto fail = [&](const std::string& why) {
      throw std::runtime_error("sharded checkpoint '" + file + "': " + why);
    };
    if (snapshot.iterate.size() != shard.size || snapshot.iteration != m.iteration) {
      fail("holds " + std::to_string(snapshot.iterate.size()) + " coordinates at iteration " +
           std::to_string(snapshot.iteration) + ", the manifest expects " +
           std::to_string(shard.size) + " at iteration " + std::to_string(m.iteration));
    }
    try {
      parts.engine.emplace(Engine::from_snapshot(std::move(snapshot), shard));
    } catch (const std::invalid_argument& e) {
      fail(std::string("invalid content: ") + e.what());
    }
    if (slice_tag(*parts.engine) != m.tags[static_cast<std::size_t>(communicator.rank())]) {
      fail("does not belong to this checkpoint (its tag differs from the manifest's)");
    }
  });
  parts.optimizer = whole_ranges(*parts.engine, m, communicator);
  return ShardedEngine(std::move(parts), communicator, distributed);
}

}  // namespace optex

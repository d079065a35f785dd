// Checkpoints of a sharded run: one Engine checkpoint per rank (its slice)
// beside a manifest at the path the caller names (DESIGN.md section 6).
//
//   <path>                           the manifest (text, format 2): ranks, d,
//                                    the save's token, the iteration, the
//                                    whole ranges' sizes, a tag per rank
//                                    binding its slice file, and a checksum
//                                    of every line before it
//   <path>.shard-<r>-of-<W>.<token>  rank r's slice; the token (16 hex digits,
//                                    64 bits of the OS's entropy drawn by rank
//                                    0) is new for every save
//
// A save is atomic as a set: every rank writes its slice under the save's own
// token (each file atomically), and only when every rank has written does
// rank 0 replace the manifest atomically, naming exactly those files. No other
// save writes to them, so whichever manifest lands last names a complete set,
// and a failure anywhere leaves the manifest naming the previous one. After
// its manifest is in place, rank 0 removes the files of the set it replaced:
// a manifest seen at the path before this save's rename can never be there
// again (every token is written once), so nothing can name them any more.
// Rank 0 holds a lock on the directory (flock, best effort) from reading the
// manifest it replaces to removing its files, so that two saves to one path
// know exactly what each replaced. A save that fails removes the slice files
// it wrote. What can be left behind: the files of a save that crashed before
// its manifest landed, or, where the directory cannot be locked, of a save
// whose manifest a concurrent save replaced unseen; never a file a manifest
// names. Format 1 (generations a and b, `<path>.shard-<r>-of-<W>.<a|b>`) is
// still read.
//
// load() reads the manifest on rank 0 and gives every rank its bytes; every
// rank parses it strictly (each line exactly its key and values, single
// spaces, canonical numbers, the checksum), reads its slice file, checks its
// tag, and the ranks check the whole ranges against every slice and compare
// their shared state. A load that finds the files of a manifest gone because a
// save replaced it meanwhile reads the new manifest and tries again.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "checkpoint/checkpoint_payload.hpp"
#include "distributed/rank_agreement.hpp"
#include "optex/checkpoint/atomic_file.hpp"
#include "optex/checkpoint/file_path.hpp"
#include "optex/checkpoint/regular_file.hpp"
#include "optex/util/random.hpp"
#include "sharded/sharded_engine_parts.hpp"
#include "sharded/sharded_manifest.hpp"

namespace optex {
namespace {

using detail::bound_tag;
using detail::collectively;
using detail::hash_text;
using detail::hex;
using detail::kTokenDigits;
using detail::parse_manifest;
using detail::read_text;
using detail::shard_path;
using detail::try_read_manifest;
using Manifest = detail::ShardedManifest;

constexpr int kLoadAttempts = 16;
constexpr auto kLockPatience = std::chrono::seconds(10);

// A save's token: 64 bits of the OS's entropy, mixed with the clock, the
// process and a counter in case the entropy source repeats itself.
std::string new_token() {
  static std::atomic<std::uint64_t> counter{0};
  std::random_device device;
  const std::uint64_t entropy = (std::uint64_t{device()} << 32) ^ device();
  const auto now = static_cast<std::uint64_t>(
      std::chrono::high_resolution_clock::now().time_since_epoch().count());
  return hex(mix_seed(entropy, mix_seed(now ^ (static_cast<std::uint64_t>(::getpid()) << 32),
                                        counter.fetch_add(1))));
}

// Format 1's tag, and format 2's before it is bound to the manifest: the
// shared state and the slice's iterate.
std::uint64_t slice_tag(const Engine& engine) {
  const std::span<const float> x = engine.iterate();
  return mix_seed(detail::shared_state_hash(engine),
                  fnv1a64(reinterpret_cast<const unsigned char*>(x.data()), x.size_bytes()));
}

// Whether the manifest at `path` is certainly not `text` (nothing there, or
// something else): then no manifest names the files of the save that wrote
// `text`, and none ever will.
bool certainly_not(const std::string& path, const std::string& text) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno == ENOENT || errno == ENOTDIR;
  if (!S_ISREG(st.st_mode)) return true;
  try {
    return read_text(path) != text;
  } catch (const std::exception&) {
    return false;  // cannot tell: keep the files
  }
}

void remove_quietly(const std::string& file) {
  std::error_code ignored;
  std::filesystem::remove(file, ignored);
}

// Removes the slice files a manifest names (format 1: both generations).
void remove_set(const std::string& path, const Manifest& m) {
  std::vector<std::string> suffixes{m.suffix};
  if (m.version == 1) suffixes = {"a", "b"};
  for (const std::string& suffix : suffixes) {
    for (int r = 0; r < m.ranks; ++r) remove_quietly(shard_path(path, r, m.ranks, suffix));
  }
}

// An exclusive flock on the directory of `path`, held while it lives; none
// when the file system has no such locks or another holder keeps it past
// `patience` (the rules of save() keep every manifest's files without it).
class DirectoryLock {
 public:
  DirectoryLock(const std::string& path, std::chrono::duration<double> patience) {
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    const std::filesystem::path dir = parent.empty() ? std::filesystem::path(".") : parent;
    fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) return;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(patience);
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK || std::chrono::steady_clock::now() > deadline) {
        ::close(fd_);
        fd_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }

 private:
  int fd_ = -1;
};

// One rank's part of the whole optimizer ranges: each of its slice's ranges
// at its offset in the whole vector. Trivially copyable, so the ranks can
// exchange them as bytes.
struct Piece {
  std::uint64_t offset = 0;
  OptimizerRange range;
};
static_assert(std::is_trivially_copyable_v<Piece>);

// The whole vector's ranges from the slices' (each rank read its own from its
// file, `all` holds every rank's pieces) and the sizes in the manifest;
// refused unless cutting them to this rank's slice gives its ranges exactly.
OptimizerRanges whole_ranges(const Engine& slice, const Manifest& m,
                             const std::vector<std::string>& all, const std::string& path) {
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
      throw std::runtime_error("sharded checkpoint '" + path +
                               "': no slice file holds the range at coordinate " +
                               std::to_string(offset) + " the manifest names");
    }
    whole.push_back({size, first->range.optimizer, first->range.step_offset});
    offset += size;
  }
  OptimizerRanges ranges(std::move(whole));
  if (!(slice_ranges(ranges, slice.shard().offset, slice.shard().size) ==
        slice.optimizer_ranges())) {
    throw std::runtime_error("sharded checkpoint '" + path +
                             "': the manifest's ranges do not cut into the ranges of the slice "
                             "at coordinate " +
                             std::to_string(slice.shard().offset));
  }
  return ranges;
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
  if (!detail::ranks_differing_from_rank0(*world_, hash_text(path)).empty()) {
    throw std::invalid_argument(
        "path: the ranks passed different paths; every rank must pass the "
        "same");
  }
  std::array<char, kTokenDigits> token{};
  if (rank() == 0) std::ranges::copy(new_token(), token.begin());
  world_->broadcast(std::span<char>(token), 0);

  Manifest m;
  m.ranks = world_size();
  m.dim = shard_.dim;
  m.suffix = std::string(token.data(), token.size());
  m.iteration = engine_.iteration();
  for (const OptimizerRange& r : optimizer_.ranges()) m.range_sizes.push_back(r.size);

  // Every rank its slice. A failure anywhere: each rank removes the file it
  // wrote (rank 0 writes the manifest only after every rank has written and
  // sent its tag, so no manifest names it).
  const std::string mine = shard_path(path, rank(), world_size(), m.suffix);
  bool wrote = false;
  try {
    collectively(*world_, "ShardedEngine::save", false, [&] {
      engine_.save(mine);
      wrote = true;
    });
  } catch (...) {
    if (wrote) remove_quietly(mine);
    throw;
  }
  m.content = hash_text(manifest_head(m));
  m.tags.resize(static_cast<std::size_t>(world_size()));
  const std::uint64_t tag = bound_tag(m.content, rank(), slice_tag(engine_));
  world_->all_gather(std::span<const std::uint64_t>(&tag, 1), std::span<std::uint64_t>(m.tags));

  // Rank 0 replaces the manifest, under the directory lock, knowing what it replaces.
  const std::string text = rank() == 0 ? manifest_text(m) : std::string();
  std::optional<DirectoryLock> lock;
  std::optional<Manifest> replaced;
  try {
    collectively(*world_, "ShardedEngine::save", false, [&] {
      if (rank() != 0) return;
      // Waiting at most half the time the other ranks wait for rank 0.
      lock.emplace(path,
                   std::min<std::chrono::duration<double>>(kLockPatience, world_->timeout() / 2));
      replaced = try_read_manifest(path);
      const std::span<const char> pieces[] = {{text.data(), text.size()}};
      detail::write_file_atomically("sharded checkpoint", path, pieces);
    });
  } catch (...) {
    // The other ranks cannot know whether the manifest landed; rank 0 removes
    // the new set unless it is named.
    if (rank() == 0 && certainly_not(path, text)) remove_set(path, m);
    throw;
  }
  if (rank() != 0) return;
  // The manifest seen before the rename can never be at the path again.
  if (replaced && replaced->suffix != m.suffix) remove_set(path, *replaced);
  // Without the lock a concurrent save may have replaced ours already.
  if (certainly_not(path, text)) remove_set(path, m);
}

ShardedEngine ShardedEngine::load(const std::string& path, Communicator& communicator,
                                  DistributedOptions distributed) {
  for (int attempt = 1;; ++attempt) {
    // Rank 0 reads the manifest and every rank parses the same bytes.
    std::string text;
    collectively(communicator, "ShardedEngine::load", false, [&] {
      detail::check_file_path("path", path);
      if (communicator.rank() == 0) text = read_text(path);
    });
    std::uint64_t size = text.size();
    communicator.broadcast(std::span<std::uint64_t>(&size, 1), 0);
    text.resize(size);
    communicator.broadcast(std::span<char>(text), 0);
    Manifest m;
    CoordinateShard shard;
    collectively(communicator, "ShardedEngine::load", false, [&] {
      m = parse_manifest(path, text);
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
    try {
      collectively(communicator, "ShardedEngine::load", false, [&] {
        const std::string file = shard_path(path, communicator.rank(), m.ranks, m.suffix);
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
        std::uint64_t tag = slice_tag(*parts.engine);
        if (m.version != 1) tag = bound_tag(m.content, communicator.rank(), tag);
        if (tag != m.tags[static_cast<std::size_t>(communicator.rank())]) {
          fail("does not belong to this checkpoint (its tag differs from the manifest's)");
        }
      });
    } catch (const CommunicatorError&) {
      throw;
    } catch (const std::exception&) {
      // A save may have replaced the manifest since it was read, and removed
      // these files: then read the new one.
      char again = 0;
      if (communicator.rank() == 0 && attempt < kLoadAttempts) {
        try {
          again = read_text(path) != text ? 1 : 0;
        } catch (const std::exception&) {
        }
      }
      communicator.broadcast(std::span<char>(&again, 1), 0);
      if (again != 0) continue;
      throw;
    }
    std::vector<Piece> mine;
    std::size_t at = parts.engine->shard().offset;
    for (const OptimizerRange& r : parts.engine->optimizer_ranges().ranges()) {
      mine.push_back({at, r});
      at += r.size;
    }
    const std::vector<std::string> all = communicator.all_gather_text(
        std::string_view(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(Piece)));
    collectively(communicator, "ShardedEngine::load", false,
                 [&] { parts.optimizer = whole_ranges(*parts.engine, m, all, path); });
    return ShardedEngine(std::move(parts), communicator, distributed);
  }
}

}  // namespace optex

// Checkpoints: a restored run continues bit-identically (DESIGN.md section 6),
// and a missing, truncated, corrupted or foreign file is refused with a clear
// std::runtime_error that leaves any existing engine alone.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "optex/engine/batch.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/options.hpp"
#include "optex/estimator/covariance.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/util/random.hpp"
#include "support/engine_equality.hpp"
#include "support/scratch_directory.hpp"

namespace {

namespace fs = std::filesystem;
using optex::Adam;
using optex::Batch;
using optex::Engine;
using optex::IterationInfo;
using optex::Optimizer;
using optex::OptimizerState;
using optex::Options;
using optex::Sgd;
using ::testing::HasSubstr;

// ---- helpers ------------------------------------------------------------------

// A non-quadratic objective with coupled coordinates.
double Objective(std::span<const float> x, std::span<float> g) {
  const std::size_t d = x.size();
  double f = 0.0;
  for (std::size_t i = 0; i < d; ++i) {
    const double xi = x[i];
    const double next = i + 1 < d ? static_cast<double>(x[i + 1]) : 0.0;
    const double prev = i > 0 ? static_cast<double>(x[i - 1]) : 0.0;
    f += (1.0 + static_cast<double>(i % 3)) * xi * xi + 0.05 * xi * xi * xi * xi + 0.3 * xi * next;
    g[i] = static_cast<float>(2.0 * (1.0 + static_cast<double>(i % 3)) * xi + 0.2 * xi * xi * xi +
                              0.3 * (prev + next));
  }
  return f;
}

std::vector<float> Start(std::size_t d, std::uint64_t seed) {
  optex::SplitMix64 rng(seed);
  std::vector<float> x(d);
  for (float& v : x) v = static_cast<float>(rng.uniform(-1.5, 1.5));
  return x;
}

using optex::test::BitEqual;
using optex::test::SameBits;
using optex::test::SameEngine;
using optex::test::StateBitEqual;

void Step(Engine& e) {
  Batch& b = e.ask();
  for (int i = 0; i < b.size(); ++i) b.loss(i) = Objective(b.point(i), b.grad(i));
  e.tell(b);
}

std::vector<char> ReadBytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void WriteBytes(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The layout of src/checkpoint/checkpoint.cpp: 8-byte magic, u32 version, u64 payload
// size, payload, u64 FNV-1a of the payload.
constexpr std::size_t kHeader = 8 + 4 + 8;
constexpr std::size_t kTrailer = 8;
// The payload's options with an empty lengthscale grid (format 7): 94 bytes through
// the tolerance, then the proxy distances (u8), the last field that format 7 added.
constexpr std::size_t kOptionsBytes = 95;
constexpr std::size_t kProxyDistances = kHeader + 94;

// Recomputes the checksum after a deliberate edit of the payload.
void FixChecksum(std::vector<char>& bytes) {
  const std::uint64_t sum =
      optex::fnv1a64(reinterpret_cast<const unsigned char*>(bytes.data()) + kHeader,
                     bytes.size() - kHeader - kTrailer);
  std::memcpy(bytes.data() + bytes.size() - kTrailer, &sum, sizeof sum);
}

class Checkpoint : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return scratch_.path(name); }
  std::vector<std::string> Names() const { return scratch_.names(); }

  optex::test::ScratchDirectory scratch_{"optex_test_checkpoint"};
  const fs::path& dir_ = scratch_.dir();

  // A saved engine a few iterations in, its file's bytes, and the engine.
  std::vector<char> SavedBytes(Engine& e, const std::string& name) {
    const std::string p = Path(name);
    e.save(p);
    return ReadBytes(p);
  }

  // Expects load() of `bytes` to throw std::runtime_error mentioning `needle`,
  // with `existing` untouched by the failed assignment.
  void ExpectLoadFails(const std::vector<char>& bytes, const std::string& needle) {
    const std::string p = Path("bad_" + std::to_string(bad_files_++) + ".ckpt");
    WriteBytes(p, bytes);
    ExpectLoadFailsAt(p, needle);
  }
  void ExpectLoadFailsAt(const std::string& p, const std::string& needle) {
    Engine existing(Start(6, 1), Adam{.lr = 0.05}, Options{});
    Step(existing);
    Step(existing);
    Engine twin(Start(6, 1), Adam{.lr = 0.05}, Options{});
    Step(twin);
    Step(twin);
    try {
      existing = Engine::load(p);
      ADD_FAILURE() << "load() accepted a bad file (" << needle << ")";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr(needle));
      EXPECT_THAT(e.what(), HasSubstr("checkpoint"));
    }
    EXPECT_TRUE(SameEngine(existing, twin));
    // It still runs.
    Step(existing);
    Step(twin);
    EXPECT_TRUE(SameEngine(existing, twin));
  }

  int bad_files_ = 0;
};

// ---- round trips ------------------------------------------------------------------

struct RoundTrip {
  std::string name;
  optex::OptimizerRanges optimizer;
  bool reference;
  int history;
  int before;  // iterations before the save
  optex::LengthscaleSelection selection = optex::LengthscaleSelection::leave_one_out;
  int selection_interval = 1;
  optex::Proxy proxy = optex::Proxy::gp;
  std::vector<double> grid = {};
  optex::Covariance kernel = optex::Covariance::matern52;
  optex::ProxyDistances distances = optex::ProxyDistances::direct;
};

Options OptionsOf(const RoundTrip& c) {
  Options o = c.reference ? Options::reference(4) : Options{};
  o.parallelism = 4;
  o.history = c.history;
  o.seed = 2718;
  if (!c.reference) {
    o.lengthscale_selection = c.selection;
    o.selection_interval = c.selection_interval;
  }
  o.proxy = c.proxy;
  if (!c.grid.empty()) o.lengthscale_grid = c.grid;
  if (!c.reference) o.kernel = c.kernel;
  o.proxy_distances = c.distances;
  return o;
}

std::vector<RoundTrip> RoundTrips() {
  const Optimizer sgd = Sgd{.lr = 0.02, .momentum = 0.9, .nesterov = true};
  const Optimizer adam = Adam{.lr = 0.03};
  using optex::LengthscaleSelection;
  // history 6 with N = 4: the ring has wrapped after two iterations.
  return {
      {"sgd_default_wrapped", sgd, false, 6, 5},
      {"sgd_plain_wrapped", Sgd{.lr = 0.02}, false, 6, 5},
      {"adamw_reference_wrapped", optex::adamw(0.03, 0.1), true, 6, 5},
      {"sgd_default_not_full", sgd, false, 50, 3},
      {"adam_default_wrapped", adam, false, 6, 5},
      {"adam_default_not_full", adam, false, 50, 3},
      {"sgd_reference_wrapped", sgd, true, 6, 5},
      {"sgd_reference_not_full", sgd, true, 50, 3},
      {"adam_reference_wrapped", adam, true, 6, 5},
      {"adam_reference_not_full", adam, true, 50, 3},
      {"adam_fresh", adam, false, 32, 0},
      // Every kind, every state slot, and hyperparameters per range (d = 12).
      {"rmsprop_centered_momentum_wrapped",
       optex::RmsProp{.lr = 0.01, .weight_decay = 0.01, .momentum = 0.5, .centered = true}, false,
       6, 5},
      {"lion_reference_wrapped", optex::Lion{.lr = 0.01, .weight_decay = 0.1}, true, 6, 5},
      {"adamw_ranges",
       optex::OptimizerRanges{{7, optex::adamw(0.03, 0.1)}, {5, optex::adamw(0.01, 0.0)}}, false, 6,
       5},
      {"sgd_ranges_mixed_momentum",
       optex::OptimizerRanges{{3, Sgd{.lr = 0.02}},
                              {4, Sgd{.lr = 0.01, .momentum = 0.9, .nesterov = true}},
                              {5, Sgd{.lr = 0.03, .weight_decay = 0.1}}},
       false, 6, 5},
      {"adam_after_warmup", adam, false, 32, 1},
      // The saved lengthscale is used between selections.
      {"adam_selection_every_3", adam, false, 10, 4, LengthscaleSelection::leave_one_out, 3},
      {"adam_marginal_likelihood", adam, false, 10, 4, LengthscaleSelection::marginal_likelihood},
      {"sgd_target", sgd, false, 8, 3, LengthscaleSelection::leave_one_out, 1,
       optex::Proxy::target},
      {"adam_last_gradient", adam, false, 8, 3, LengthscaleSelection::leave_one_out, 1,
       optex::Proxy::last_gradient},
      // A custom selection grid and another kernel travel with the options.
      {"adam_custom_grid_rbf",
       adam,
       false,
       10,
       4,
       LengthscaleSelection::leave_one_out,
       1,
       optex::Proxy::gp,
       {0.3, 1.0, 3.0},
       optex::Covariance::rbf},
      // The proxy distances travel with the options: where they apply (SGD with
      // momentum, one range) and where the engine falls back to direct (Adam).
      {"sgd_coefficients_wrapped",
       sgd,
       false,
       6,
       5,
       LengthscaleSelection::leave_one_out,
       1,
       optex::Proxy::gp,
       {},
       optex::Covariance::matern52,
       optex::ProxyDistances::coefficients},
      {"adam_coefficients_wrapped",
       adam,
       false,
       6,
       5,
       LengthscaleSelection::leave_one_out,
       1,
       optex::Proxy::gp,
       {},
       optex::Covariance::matern52,
       optex::ProxyDistances::coefficients},
  };
}

TEST_F(Checkpoint, ARestoredRunContinuesBitIdentically) {
  constexpr int kAfter = 6;
  for (const RoundTrip& c : RoundTrips()) {
    SCOPED_TRACE(c.name);
    const Options o = OptionsOf(c);
    const std::vector<float> x0 = Start(12, 9);
    Engine uninterrupted(x0, c.optimizer, o);
    Engine saved(x0, c.optimizer, o);
    uninterrupted.set_gradient_oracle(Objective);
    saved.set_gradient_oracle(Objective);
    for (int t = 0; t < c.before; ++t) {
      Step(uninterrupted);
      Step(saved);
    }
    if (c.history == 6 && c.before == 5) {
      ASSERT_EQ(saved.history().size(), 6u);  // full and wrapped
    }
    const std::string p = Path(c.name + ".ckpt");
    saved.save(p);
    Engine restored = Engine::load(p);
    restored.set_gradient_oracle(Objective);  // functions are not saved
    ASSERT_TRUE(SameEngine(restored, uninterrupted));
    EXPECT_EQ(restored.dim(), x0.size());
    EXPECT_EQ(restored.options().history, o.history);
    EXPECT_EQ(restored.options().warmup, o.warmup);
    EXPECT_EQ(restored.options().input_scaling, o.input_scaling);
    EXPECT_EQ(restored.options().proxy, o.proxy);
    EXPECT_EQ(restored.options().proxy_distances, c.distances);
    EXPECT_EQ(restored.options().seed, o.seed);
    EXPECT_EQ(restored.options().kernel, o.kernel);
    EXPECT_EQ(restored.options().lengthscale_grid, o.lengthscale_grid);
    EXPECT_EQ(restored.options().lengthscale_selection, o.lengthscale_selection);
    EXPECT_EQ(restored.options().selection_interval, o.selection_interval);
    EXPECT_EQ(restored.optimizer_ranges(), c.optimizer.for_dimension(x0.size()));
    // Saving the restored engine writes the same bytes.
    EXPECT_EQ(SavedBytes(restored, c.name + ".again"), ReadBytes(p));

    for (int t = 0; t < kAfter; ++t) {
      SCOPED_TRACE("iteration " + std::to_string(c.before + t));
      Batch& a = uninterrupted.ask();
      Batch& b = restored.ask();
      for (int i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(SameBits(a.point(i), b.point(i))) << "point " << i;
        ASSERT_EQ(a.seed(i), b.seed(i));
        a.loss(i) = Objective(a.point(i), a.grad(i));
        b.loss(i) = Objective(b.point(i), b.grad(i));
      }
      const IterationInfo ia = uninterrupted.tell(a);
      const IterationInfo& ib = restored.tell(b);
      ASSERT_TRUE(SameEngine(restored, uninterrupted));
      EXPECT_TRUE(SameBits(ia.cosine, ib.cosine) ||
                  (std::isnan(ia.cosine) && std::isnan(ib.cosine)));
      EXPECT_TRUE(SameBits(ia.lengthscale, ib.lengthscale));
    }
  }
}

// Checkpoint and continue several times in a row; every restore is exact.
TEST_F(Checkpoint, RepeatedCheckpointsStayOnTheTrajectory) {
  const Options o = OptionsOf({"", Adam{.lr = 0.03}, false, 6, 0});
  const std::vector<float> x0 = Start(20, 4);
  Engine uninterrupted(x0, Adam{.lr = 0.03}, o);
  Engine hopping(x0, Adam{.lr = 0.03}, o);
  const std::string p = Path("hop.ckpt");
  for (int t = 0; t < 10; ++t) {
    hopping.save(p);
    hopping = Engine::load(p);
    Step(hopping);
    Step(uninterrupted);
    ASSERT_TRUE(SameEngine(hopping, uninterrupted)) << "iteration " << t;
  }
}

TEST_F(Checkpoint, SaveLeavesNoTemporaryFileBehind) {
  Engine e(Start(5, 2), Sgd{.lr = 0.01}, Options{});
  Step(e);
  e.save(Path("a.ckpt"));
  e.save(Path("a.ckpt"));  // overwrite
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(names, ::testing::ElementsAre("a.ckpt"));
}

// ---- refused saves ----------------------------------------------------------------

TEST_F(Checkpoint, SaveWhilePendingThrows) {
  Engine e(Start(5, 2), Adam{.lr = 0.01}, Options{});
  Step(e);
  Batch& b = e.ask();
  const std::string p = Path("pending.ckpt");
  try {
    e.save(p);
    FAIL() << "save() between ask() and tell() succeeded";
  } catch (const std::runtime_error& err) {
    EXPECT_THAT(err.what(), HasSubstr("pending"));
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  // The iteration can still be completed, and then saved.
  for (int i = 0; i < b.size(); ++i) b.loss(i) = Objective(b.point(i), b.grad(i));
  e.tell(b);
  EXPECT_NO_THROW(e.save(p));
}

TEST_F(Checkpoint, SaveIntoAMissingDirectoryThrows) {
  Engine e(Start(5, 2), Adam{.lr = 0.01}, Options{});
  try {
    e.save(Path("no/such/dir/x.ckpt"));
    FAIL() << "save() into a missing directory succeeded";
  } catch (const std::runtime_error& err) {
    EXPECT_THAT(err.what(), HasSubstr(Path("no/such/dir/x.ckpt")));
    EXPECT_THAT(err.what(), HasSubstr("No such file or directory"));
  }
  EXPECT_THAT(Names(), ::testing::IsEmpty());
}

// A NUL byte would silently cut the name: "run.ckpt\0evil" must not write run.ckpt. An
// empty path names no file (it used to leave ".tmp" in the working directory).
TEST_F(Checkpoint, PathsThatNameNoFileAreRefusedBeforeTheFileSystemIsTouched) {
  Engine e(Start(5, 2), Adam{.lr = 0.01}, Options{});
  Step(e);
  const std::string nul = Path("run.ckpt") + std::string(1, '\0') + "evil";
  for (const std::string& path : {nul, std::string()}) {
    try {
      e.save(path);
      ADD_FAILURE() << "save() accepted a path that names no file";
    } catch (const std::invalid_argument& err) {
      EXPECT_THAT(err.what(), HasSubstr("path"));
    }
  }
  EXPECT_THAT(Names(), ::testing::IsEmpty());
  EXPECT_FALSE(fs::exists(".tmp"));
  e.save(Path("run.ckpt"));
  for (const std::string& path : {Path("run.ckpt") + std::string(1, '\0') + "x", std::string()}) {
    try {
      (void)Engine::load(path);
      ADD_FAILURE() << "load() accepted a path that names no file";
    } catch (const std::invalid_argument& err) {
      EXPECT_THAT(err.what(), HasSubstr("path"));
    }
  }
}

// Saving through a symbolic link writes its target and keeps the link (DESIGN.md
// section 6); a fifo, a directory or a device at the path is refused and left as it was.
TEST_F(Checkpoint, SaveFollowsLinksAndReplacesOnlyRegularFiles) {
  Engine e(Start(5, 2), Adam{.lr = 0.01}, Options{});
  Step(e);
  e.save(Path("target.ckpt"));
  fs::create_symlink("target.ckpt", dir_ / "latest.ckpt");
  Step(e);
  e.save(Path("latest.ckpt"));
  EXPECT_TRUE(fs::is_symlink(dir_ / "latest.ckpt"));
  EXPECT_TRUE(SameEngine(Engine::load(Path("target.ckpt")), e));

  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  fs::create_directory(dir_ / "dir");
  for (const auto& [name, kind] : {std::pair{"fifo", "fifo"}, std::pair{"dir", "directory"}}) {
    try {
      e.save(Path(name));
      ADD_FAILURE() << "save() replaced a " << kind;
    } catch (const std::runtime_error& err) {
      EXPECT_THAT(err.what(), HasSubstr(Path(name)));
      EXPECT_THAT(err.what(), HasSubstr(kind));
    }
  }
  EXPECT_TRUE(fs::is_fifo(Path("fifo")));
  EXPECT_TRUE(fs::is_directory(Path("dir")));
  EXPECT_THAT(Names(),
              ::testing::UnorderedElementsAre("target.ckpt", "latest.ckpt", "fifo", "dir"));
}

// Two processes saving to one path, each 50 times, while a third loads it: every load
// finds a whole checkpoint of one of them (each writer has its own temporary file).
TEST_F(Checkpoint, ConcurrentSavesFromTwoProcessesNeverTearTheFile) {
  const std::string p = Path("shared.ckpt");
  Engine first(Start(40, 2), Adam{.lr = 0.01}, Options{});
  Engine second(Start(70, 3), Sgd{.lr = 0.01}, Options{});
  Step(first);
  Step(second);
  first.save(p);
  std::vector<pid_t> writers;
  for (const Engine* e : {&first, &second}) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int failures = 0;
      for (int i = 0; i < 50; ++i) {
        try {
          e->save(p);
        } catch (const std::exception&) {
          ++failures;
        }
      }
      ::_exit(failures == 0 ? 0 : 1);
    }
    writers.push_back(pid);
  }
  int loads = 0;
  for (bool writing = true; writing || loads < 20; ++loads) {
    try {
      const Engine seen = Engine::load(p);
      EXPECT_TRUE(SameEngine(seen, seen.dim() == first.dim() ? first : second));
    } catch (const std::exception& err) {
      ADD_FAILURE() << "load " << loads << " failed: " << err.what();
    }
    int status = 0;
    writing = false;
    for (pid_t pid : writers) writing |= ::waitpid(pid, &status, WNOHANG) == 0;
  }
  for (pid_t pid : writers) {
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  EXPECT_THAT(Names(), ::testing::ElementsAre("shared.ckpt"));
}

// ---- refused loads ----------------------------------------------------------------

class BadCheckpoint : public Checkpoint {
 protected:
  void SetUp() override {
    Checkpoint::SetUp();
    Engine e(Start(6, 3), Adam{.lr = 0.05}, Options{});
    for (int t = 0; t < 4; ++t) Step(e);
    good_ = SavedBytes(e, "good.ckpt");
    ASSERT_GT(good_.size(), kHeader + kTrailer + 100);
    // The file as written is accepted.
    ASSERT_NO_THROW((void)Engine::load(Path("good.ckpt")));
  }
  std::vector<char> good_;
};

TEST_F(BadCheckpoint, MissingFile) {
  ExpectLoadFailsAt(Path("does_not_exist.ckpt"), "cannot open");
}

// What is not a regular file is refused before it is read: a fifo would block, /dev/zero
// never end, a directory fail with a stream's internal message. Each load runs in a child
// process under an alarm, so that a regression fails instead of hanging.
TEST_F(BadCheckpoint, OnlyRegularFilesAreLoaded) {
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  fs::create_directory(dir_ / "dir");
  for (const auto& [path, kind] :
       {std::pair{Path("fifo"), "fifo"}, std::pair{Path("dir"), "directory"},
        std::pair{std::string("/dev/zero"), "character device"}}) {
    SCOPED_TRACE(path);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::alarm(10);
      try {
        (void)Engine::load(path);
      } catch (const std::runtime_error& err) {
        const std::string what = err.what();
        const bool named = what.find(path) != std::string::npos &&
                           what.find(std::string("is a ") + kind) != std::string::npos;
        ::_exit(named ? 0 : 2);
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(4);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << (WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                : "exit status " + std::to_string(WEXITSTATUS(status)));
  }
  EXPECT_TRUE(fs::is_fifo(Path("fifo")));
}

TEST_F(BadCheckpoint, TruncatedFile) {
  const std::size_t n = good_.size();
  // Shorter than header + checksum: refused as too short.
  for (std::size_t cut :
       {std::size_t{0}, std::size_t{5}, std::size_t{12}, kHeader + kTrailer - 1}) {
    SCOPED_TRACE(cut);
    ExpectLoadFails({good_.begin(), good_.begin() + static_cast<std::ptrdiff_t>(cut)}, "too short");
  }
  // Longer: the header's payload size gives the truncation away.
  for (std::size_t cut : {kHeader + kTrailer, kHeader + 40, n / 2, n - kTrailer, n - 1}) {
    SCOPED_TRACE(cut);
    ExpectLoadFails({good_.begin(), good_.begin() + static_cast<std::ptrdiff_t>(cut)}, "truncated");
  }
}

TEST_F(BadCheckpoint, AppendedBytes) {
  std::vector<char> bytes = good_;
  bytes.push_back('x');
  ExpectLoadFails(bytes, "appended");
}

TEST_F(BadCheckpoint, OneFlippedByteFailsTheChecksum) {
  const std::size_t payload = good_.size() - kHeader - kTrailer;
  for (std::size_t at : {std::size_t{0}, std::size_t{1}, payload / 3, payload / 2, payload - 1}) {
    SCOPED_TRACE(at);
    std::vector<char> bytes = good_;
    bytes[kHeader + at] = static_cast<char>(bytes[kHeader + at] ^ 0x10);
    ExpectLoadFails(bytes, "checksum");
  }
  // A flipped bit in the stored checksum itself.
  std::vector<char> bytes = good_;
  bytes[bytes.size() - 3] = static_cast<char>(bytes[bytes.size() - 3] ^ 0x01);
  ExpectLoadFails(bytes, "checksum");
}

TEST_F(BadCheckpoint, ForeignFiles) {
  optex::SplitMix64 rng(5);
  std::vector<char> noise(good_.size());
  for (char& c : noise) c = static_cast<char>(rng.next() & 0xFF);
  ExpectLoadFails(noise, "magic");
  const std::string text =
      "This is a plain text file that happens to be long enough to look like a header.\n";
  ExpectLoadFails({text.begin(), text.end()}, "magic");
  ExpectLoadFails({'h', 'i', '\n'}, "too short");
  // The right length but a damaged magic number.
  std::vector<char> bytes = good_;
  bytes[0] = 'X';
  ExpectLoadFails(bytes, "magic");
}

TEST_F(BadCheckpoint, WrongVersion) {
  for (std::uint32_t version : {0u, 8u, 0xFFFFFFFFu}) {
    SCOPED_TRACE(version);
    std::vector<char> bytes = good_;
    std::memcpy(bytes.data() + 8, &version, sizeof version);
    ExpectLoadFails(bytes, "version");
    ExpectLoadFails(bytes, std::to_string(version));
  }
}

// The optimizer ranges and the state slots of format 7, edited one field at a time in a
// well-formed file (checksum fixed): each is refused naming what is wrong. Offsets for
// good_ (Adam, d = 6, an empty lengthscale grid): the options take 95 payload bytes, then
// the range count (u32), the range's size (u64) and step offset (i64), the optimizer tag
// (u8) and Adam's five doubles and one flag, then the iterate (u64 count + 6 floats), the
// step (i64) and the slot count (u8).
TEST_F(BadCheckpoint, InvalidRangesAndSlotsWithAValidChecksum) {
  constexpr std::size_t kCount = kHeader + kOptionsBytes;
  constexpr std::size_t kSize = kCount + 4;
  constexpr std::size_t kOffset = kSize + 8;
  constexpr std::size_t kTag = kOffset + 8;
  constexpr std::size_t kFlag = kTag + 1 + 5 * 8;
  constexpr std::size_t kSlots = kFlag + 1 + 8 + 6 * 4 + 8;
  constexpr std::size_t kStep = kSlots - 8;
  const auto edited = [&](std::size_t at, auto value) {
    std::vector<char> bytes = good_;
    std::memcpy(bytes.data() + at, &value, sizeof value);
    FixChecksum(bytes);
    return bytes;
  };
  {
    std::uint64_t size = 0;
    std::memcpy(&size, good_.data() + kSize, sizeof size);
    ASSERT_EQ(size, 6u);  // the offsets above hold
    ASSERT_EQ(static_cast<int>(good_[kTag]), static_cast<int>(Adam::checkpoint_tag));
    ASSERT_EQ(static_cast<int>(good_[kSlots]), optex::kMaxStateSlots);
    std::int64_t step = 0;
    std::memcpy(&step, good_.data() + kStep, sizeof step);
    ASSERT_GT(step, 0);
  }
  ExpectLoadFails(edited(kCount, std::uint32_t{0}), "ranges");
  ExpectLoadFails(edited(kCount, std::uint32_t{0xFFFFFFFFu}), "ranges");
  ExpectLoadFails(edited(kSize, std::uint64_t{5}), "add up to");
  ExpectLoadFails(edited(kSize, std::uint64_t{0}), "size");
  ExpectLoadFails(edited(kTag, std::uint8_t{99}), "unknown optimizer tag 99");
  ExpectLoadFails(edited(kFlag, std::uint8_t{2}), "flag");
  ExpectLoadFails(edited(kSlots, std::uint8_t{4}), "slots");
  // A step offset below zero, or beyond the state's step (a range that joined later
  // than the state's last step), names the range's field.
  ExpectLoadFails(edited(kOffset, std::int64_t{-1}), "optimizer range 0 step_offset");
  ExpectLoadFails(edited(kOffset, std::numeric_limits<std::int64_t>::min()),
                  "optimizer range 0 step_offset");
  std::int64_t step = 0;
  std::memcpy(&step, good_.data() + kStep, sizeof step);
  ExpectLoadFails(edited(kOffset, step + 1), "optimizer range 0 step_offset");
  ExpectLoadFails(edited(kOffset, std::numeric_limits<std::int64_t>::max()),
                  "optimizer range 0 step_offset");
  // An SGD tag over Adam's fields: the doubles read as SGD's, then the rest is misaligned.
  ExpectLoadFails(edited(kTag, std::uint8_t{Sgd::checkpoint_tag}), "checkpoint");
}

// Ranges of two kinds, or a state whose slots are not the optimizer's, are refused.
TEST_F(Checkpoint, RangesOfMixedKindsAndForeignStatesAreRefused) {
  // Two Adam ranges; the second range's tag becomes RmsProp's, whose fields take the same
  // bytes (five doubles, then one flag), so the file still parses.
  const optex::OptimizerRanges ranges{{2, Adam{.lr = 0.01}}, {4, Adam{.lr = 0.02}}};
  Engine e(Start(6, 3), ranges, Options{});
  Step(e);
  std::vector<char> bytes = SavedBytes(e, "two.ckpt");
  constexpr std::size_t kSecondTag = kHeader + kOptionsBytes + 4 + 8 + 8 + 1 + 5 * 8 + 1 + 8 + 8;
  ASSERT_EQ(static_cast<int>(bytes[kSecondTag]), static_cast<int>(Adam::checkpoint_tag));
  bytes[kSecondTag] = static_cast<char>(optex::RmsProp::checkpoint_tag);
  FixChecksum(bytes);
  ExpectLoadFails(bytes, "optimizer kind");
}

// ---- files of earlier formats ----------------------------------------------------

// Format 4 is format 5 without the ranges' step offsets: such a file loads with every
// offset 0, as the run that wrote it had, and continues like the engine it was.
TEST_F(Checkpoint, ReadsFormatFourWithStepOffsetsOfZero) {
  const optex::OptimizerRanges ranges{{2, Adam{.lr = 0.01}}, {4, optex::adamw(0.02, 0.1)}};
  Engine e(Start(6, 3), ranges, Options{});
  for (int t = 0; t < 3; ++t) Step(e);
  std::vector<char> bytes = SavedBytes(e, "six.ckpt");
  // Format 7 less what formats 5 to 7 added, from the end: the verified window (i32 and
  // u64 after the last step's length), each range's step offset (Options{} takes 95 bytes,
  // the range count, then per range: size, step offset, tag, Adam's five doubles and one
  // flag), the options' proxy distances (u8, their last byte), and their mode (u8) and
  // tolerance (f64), the 9 bytes before it.
  const auto erase = [&](std::size_t at, std::size_t count) {
    bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                bytes.begin() + static_cast<std::ptrdiff_t>(at + count));
  };
  erase(bytes.size() - kTrailer - 12, 12);
  constexpr std::size_t kRange = 8 + 8 + 1 + 5 * 8 + 1;
  constexpr std::size_t kFirstOffset = kHeader + kOptionsBytes + 4 + 8;
  for (const std::size_t at : {kFirstOffset + kRange, kFirstOffset}) {
    std::int64_t offset = -1;
    std::memcpy(&offset, bytes.data() + at, sizeof offset);
    ASSERT_EQ(offset, 0);
    erase(at, 8);
  }
  ASSERT_EQ(bytes[kProxyDistances], 0);  // ProxyDistances::direct
  erase(kProxyDistances, 1);
  ASSERT_EQ(bytes[kHeader + 85], 0);  // Mode::approximate
  erase(kHeader + 85, 9);
  const std::uint32_t four = 4;
  std::memcpy(bytes.data() + 8, &four, sizeof four);
  const std::uint64_t payload = bytes.size() - kHeader - kTrailer;
  std::memcpy(bytes.data() + 12, &payload, sizeof payload);
  FixChecksum(bytes);
  WriteBytes(Path("four.ckpt"), bytes);

  Engine old = Engine::load(Path("four.ckpt"));
  ASSERT_TRUE(SameEngine(old, e));
  EXPECT_EQ(old.optimizer_ranges(), ranges.for_dimension(6));
  for (int t = 0; t < 3; ++t) {
    Step(old);
    Step(e);
  }
  EXPECT_TRUE(SameEngine(old, e));
}

// Format 6 is format 7 without the options' proxy distances: such a file loads with
// ProxyDistances::direct, the only way the run that wrote it had, whatever the engine
// that saves the file chose, and continues like that engine.
TEST_F(Checkpoint, ReadsFormatSixWithDirectProxyDistances) {
  const Optimizer sgd = Sgd{.lr = 0.02, .momentum = 0.9};
  Options o;
  o.proxy_distances = optex::ProxyDistances::coefficients;
  Engine e(Start(6, 3), sgd, o);
  for (int t = 0; t < 3; ++t) Step(e);
  std::vector<char> bytes = SavedBytes(e, "seven.ckpt");
  ASSERT_EQ(bytes[kProxyDistances], 1);  // ProxyDistances::coefficients
  bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(kProxyDistances));
  const std::uint32_t six = 6;
  std::memcpy(bytes.data() + 8, &six, sizeof six);
  const std::uint64_t payload = bytes.size() - kHeader - kTrailer;
  std::memcpy(bytes.data() + 12, &payload, sizeof payload);
  FixChecksum(bytes);
  WriteBytes(Path("six.ckpt"), bytes);

  Engine old = Engine::load(Path("six.ckpt"));
  EXPECT_EQ(old.options().proxy_distances, optex::ProxyDistances::direct);
  // Re-saved, it is the format 7 file of the saved engine with direct distances.
  std::vector<char> expected = ReadBytes(Path("seven.ckpt"));
  expected[kProxyDistances] = 0;
  FixChecksum(expected);
  EXPECT_EQ(SavedBytes(old, "six.again"), expected);
  // It continues as the saved engine's state with direct distances does.
  optex::EngineSnapshot snapshot = e.snapshot();
  snapshot.options.proxy_distances = optex::ProxyDistances::direct;
  Engine twin = Engine::from_snapshot(std::move(snapshot));
  ASSERT_TRUE(SameEngine(old, twin));
  for (int t = 0; t < 3; ++t) {
    Step(old);
    Step(twin);
  }
  EXPECT_TRUE(SameEngine(old, twin));
}

// A proxy distances byte beyond the enumeration is refused naming the field, in a
// file whose checksum is valid.
TEST_F(BadCheckpoint, AProxyDistancesValueOutsideTheEnumIsRefused) {
  ASSERT_EQ(good_[kProxyDistances], 0);  // Options{}: ProxyDistances::direct
  for (const std::uint8_t value : {std::uint8_t{2}, std::uint8_t{255}}) {
    SCOPED_TRACE(static_cast<int>(value));
    std::vector<char> bytes = good_;
    bytes[kProxyDistances] = static_cast<char>(value);
    FixChecksum(bytes);
    ExpectLoadFails(bytes, "proxy_distances");
    ExpectLoadFails(bytes, "options at byte " + std::to_string(kHeader));
    ExpectLoadFails(bytes, "got " + std::to_string(value));
  }
}

// Offsets are saved: a run whose ranges joined late resumes with them, bit for bit.
TEST_F(Checkpoint, StepOffsetsAreSavedAndRestored) {
  Engine e(Start(6, 3), optex::OptimizerRanges{{2, Adam{.lr = 0.01}}, {4, Adam{.lr = 0.02}}},
           Options{});
  for (int t = 0; t < 3; ++t) Step(e);
  const std::int64_t step = e.optimizer_state().step;
  e.set_optimizer(optex::OptimizerRanges{{2, Adam{.lr = 0.01}, 1}, {4, Adam{.lr = 0.02}, step}});
  Step(e);
  e.save(Path("offsets.ckpt"));
  Engine resumed = Engine::load(Path("offsets.ckpt"));
  EXPECT_EQ(resumed.optimizer_ranges()[0].step_offset, 1);
  EXPECT_EQ(resumed.optimizer_ranges()[1].step_offset, step);
  for (int t = 0; t < 3; ++t) {
    Step(resumed);
    Step(e);
    ASSERT_TRUE(SameEngine(resumed, e)) << "iteration " << t;
  }
}

// Files that optex 0.1.0 wrote in format 2, in tests/data, with the values they hold in a
// text file beside each (hexadecimal floats): Options{} with N = 3, T0 = 8, seed 5, d = 7,
// five iterations on the objective above.
struct OldFile {
  const char* name;
  Optimizer optimizer;  // what the engine ran
};

std::string DataPath(const std::string& name) {
  return std::string(OPTEX_TEST_DATA_DIR) + "/" + name;
}

// "key v1 v2 ..." lines of the text file, values as written.
std::map<std::string, std::vector<std::string>> ReadValues(const std::string& path) {
  std::ifstream in(path);
  std::map<std::string, std::vector<std::string>> values;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key, word;
    words >> key;
    while (words >> word) values[key].push_back(word);
  }
  return values;
}

std::vector<float> Floats(const std::vector<std::string>& words) {
  std::vector<float> out;
  for (const std::string& w : words) out.push_back(std::strtof(w.c_str(), nullptr));
  return out;
}

// A format 2 file loads as the one-range engine it was, with the state in the
// optimizer's slots (SGD's buffer in slot 0; Adam's m in 0 and v in 1), every value as
// written; re-saved (format 3) and reloaded it is the same engine, and both continue alike.
TEST_F(Checkpoint, ReadsFormatTwoFilesOfTheFirstRelease) {
  for (const OldFile& f :
       {OldFile{"format2-adam", Adam{.lr = 0.05, .weight_decay = 0.01}},
        OldFile{"format2-sgd-nesterov", Sgd{.lr = 0.02, .momentum = 0.9, .nesterov = true}}}) {
    SCOPED_TRACE(f.name);
    const auto values = ReadValues(DataPath(std::string(f.name) + ".txt"));
    ASSERT_EQ(values.count("x"), 1u) << "the values file is missing";
    Engine old = Engine::load(DataPath(std::string(f.name) + ".ckpt"));
    EXPECT_EQ(old.device(), optex::Device::cpu());
    EXPECT_EQ(old.optimizer_ranges(), optex::OptimizerRanges(f.optimizer).for_dimension(7));
    EXPECT_EQ(old.options().parallelism, 3);
    EXPECT_EQ(old.options().history, 8);
    EXPECT_EQ(old.options().seed, 5u);
    EXPECT_EQ(old.iteration(), std::stoll(values.at("iteration")[0]));
    EXPECT_EQ(old.evaluations(), std::stoll(values.at("evaluations")[0]));
    EXPECT_EQ(old.rng_state(), std::stoull(values.at("rng")[0]));
    EXPECT_EQ(old.history().size(), std::stoull(values.at("history")[0]));
    EXPECT_TRUE(
        SameBits(old.lengthscale(), std::strtod(values.at("lengthscale")[0].c_str(), nullptr)));
    EXPECT_TRUE(BitEqual(old.iterate(), Floats(values.at("x"))));
    const OptimizerState& state = old.optimizer_state();
    EXPECT_EQ(state.step, std::stoll(values.at("step")[0]));
    EXPECT_TRUE(BitEqual(state.slots[0], Floats(values.at("m"))));
    EXPECT_TRUE(BitEqual(state.slots[1],
                         Floats(values.count("v") ? values.at("v") : std::vector<std::string>{})));
    EXPECT_TRUE(state.slots[2].empty());

    old.save(Path("format3.ckpt"));
    Engine again = Engine::load(Path("format3.ckpt"));
    ASSERT_TRUE(SameEngine(again, old));
    for (int t = 0; t < 3; ++t) {
      Step(old);
      Step(again);
    }
    EXPECT_TRUE(SameEngine(again, old));
    EXPECT_GT(old.iteration(), std::stoll(values.at("iteration")[0]));
  }
}

// The same run today: SGD's formulas did not change, so five iterations from the same start
// give the first release's engine bit for bit (the GP, the selection and the history with
// it). Adam's did: its coefficients now follow PyTorch's rounding (docs/DESIGN.md section 9),
// which moves the last bits. The first release always committed from the last point.
TEST_F(Checkpoint, TheFirstReleasesSgdRunIsRepeatedBitForBit) {
  Options o;
  o.continue_from = optex::ContinueFrom::last;
  o.parallelism = 3;
  o.history = 8;
  o.seed = 5;
  Engine today(Start(7, 11), Sgd{.lr = 0.02, .momentum = 0.9, .nesterov = true}, o);
  for (int t = 0; t < 5; ++t) Step(today);
  EXPECT_TRUE(SameEngine(today, Engine::load(DataPath("format2-sgd-nesterov.ckpt"))));
}

// Format 1 predates devices: format 2's payload without the device kind, index and
// history precision after the seed. Such a file still loads, on the CPU.
// format2-adam.ckpt rewritten as format 1: without the device kind, index and history
// precision after the seed.
std::vector<char> FormatOneBytes() {
  std::vector<char> bytes = ReadBytes(DataPath("format2-adam.ckpt"));
  EXPECT_GT(bytes.size(), kHeader + kTrailer);
  std::uint32_t version = 0;
  std::memcpy(&version, bytes.data() + 8, sizeof version);
  EXPECT_EQ(version, 2u);
  // Options with an empty lengthscale grid: 4+4+1+8+8+1+1+1+4+(8+0)+1+8 bytes, then 1+4+1.
  constexpr std::size_t kDeviceFields = kHeader + 49;
  EXPECT_EQ(bytes[kDeviceFields], 0);  // Device::Kind::cpu
  bytes.erase(bytes.begin() + kDeviceFields, bytes.begin() + kDeviceFields + 6);
  version = 1;
  std::memcpy(bytes.data() + 8, &version, sizeof version);
  const std::uint64_t payload = bytes.size() - kHeader - kTrailer;
  std::memcpy(bytes.data() + 12, &payload, sizeof payload);
  FixChecksum(bytes);
  return bytes;
}

TEST_F(Checkpoint, ReadsFormatOneAsACpuRun) {
  WriteBytes(Path("v1.ckpt"), FormatOneBytes());

  Engine restored = Engine::load(Path("v1.ckpt"));
  Engine v2 = Engine::load(DataPath("format2-adam.ckpt"));
  EXPECT_EQ(restored.device(), optex::Device::cpu());
  EXPECT_TRUE(SameEngine(restored, v2));
  for (int t = 0; t < 3; ++t) {
    Step(restored);
    Step(v2);
  }
  EXPECT_TRUE(SameEngine(restored, v2));
}

// load()'s own arguments are checked as arguments (std::invalid_argument),
// not reported as a bad file: bf16 storage on the CPU, a device that is not there.
TEST_F(Checkpoint, LoadArgumentsThatCannotBeHonouredAreInvalidArguments) {
  Engine e(Start(6, 3), Adam{.lr = 0.05}, Options{});
  Step(e);
  e.save(Path("run.ckpt"));
  try {
    (void)Engine::load(Path("run.ckpt"), optex::Device::cpu(), optex::Precision::bf16);
    ADD_FAILURE() << "bf16 storage on the CPU was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("history_precision"));
    EXPECT_THAT(error.what(), HasSubstr("bf16"));
  }
  const optex::Device missing = optex::Device::cuda(optex::cuda_device_count());
  try {
    (void)Engine::load(Path("run.ckpt"), missing);
    ADD_FAILURE() << missing.name() << " was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("device"));
    EXPECT_THAT(error.what(), HasSubstr(missing.name()));
  }
  // Without overrides the run loads where it was saved.
  EXPECT_TRUE(SameEngine(Engine::load(Path("run.ckpt")), e));

  // Arguments are checked before the file is read: a missing file does not hide them.
  const std::string none = Path("missing.ckpt");
  const auto expect_argument_error = [&](auto load, const std::string& name) {
    try {
      load();
      ADD_FAILURE() << name << " was accepted";
    } catch (const std::invalid_argument& error) {
      EXPECT_THAT(error.what(), HasSubstr(name));
    } catch (const std::exception& error) {
      ADD_FAILURE() << name << ": blamed on the file: " << error.what();
    }
  };
  expect_argument_error([&] { (void)Engine::load(none, missing); }, "device");
  expect_argument_error(
      [&] {
        (void)Engine::load(none, optex::Device{static_cast<optex::Device::Kind>(7), 0});
      },
      "device");
  expect_argument_error([&] { (void)Engine::load(none, optex::Device::cuda(-1)); }, "device");
  expect_argument_error(
      [&] { (void)Engine::load(none, std::nullopt, static_cast<optex::Precision>(9)); },
      "history_precision");
  expect_argument_error(
      [&] { (void)Engine::load(none, optex::Device::cpu(), optex::Precision::bf16); },
      "history_precision");
}

// A format 1 payload labelled format 2 is the file's fault, never the device argument's:
// read as format 2, Adam's tag and learning rate land in the device fields (with lr = 0.5,
// cuda:0), and the refusal is a std::runtime_error naming the field it failed at.
TEST_F(Checkpoint, AMislabelledFormatIsBlamedOnTheFile) {
  std::vector<char> bytes = FormatOneBytes();
  constexpr std::size_t kLr = kHeader + 49 + 1;  // after the options and Adam's tag
  ASSERT_EQ(static_cast<int>(bytes[kLr - 1]), static_cast<int>(Adam::checkpoint_tag));
  const double lr = 0.5;
  std::memcpy(bytes.data() + kLr, &lr, sizeof lr);
  FixChecksum(bytes);
  WriteBytes(Path("v1.ckpt"), bytes);
  ASSERT_NO_THROW((void)Engine::load(Path("v1.ckpt")));  // a good format 1 file
  const std::uint32_t two = 2;
  std::memcpy(bytes.data() + 8, &two, sizeof two);
  WriteBytes(Path("mislabelled.ckpt"), bytes);
  for (std::optional<optex::Device> device :
       {std::optional<optex::Device>(), std::optional<optex::Device>(optex::Device::cpu())}) {
    try {
      (void)Engine::load(Path("mislabelled.ckpt"), device);
      ADD_FAILURE() << "a mislabelled file was accepted";
    } catch (const std::invalid_argument& error) {
      ADD_FAILURE() << "blamed on an argument: " << error.what();
    } catch (const std::runtime_error& error) {
      EXPECT_THAT(error.what(), HasSubstr(Path("mislabelled.ckpt")));
      EXPECT_THAT(error.what(), ::testing::ContainsRegex("at byte [0-9]+|saved on cuda"));
    }
  }
}

// A well-formed file (checksum fixed) whose content fails the engine's own
// validation is refused as a runtime_error naming the bad field.
TEST_F(BadCheckpoint, InvalidContentWithAValidChecksum) {
  {
    std::vector<char> bytes = good_;
    const std::int32_t parallelism = 0;  // the first payload field
    std::memcpy(bytes.data() + kHeader, &parallelism, sizeof parallelism);
    FixChecksum(bytes);
    ExpectLoadFails(bytes, "parallelism");
  }
  {
    std::vector<char> bytes = good_;
    bytes[kHeader + 8] = 9;  // the kernel enum, after parallelism and history
    FixChecksum(bytes);
    ExpectLoadFails(bytes, "kernel");
  }
}

}  // namespace

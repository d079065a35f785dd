// write_file_atomically and read_regular_file (docs/DESIGN.md section 6,
// "Checkpoints"): a replaced file is whole or untouched, links are followed,
// anything but a regular file is refused, and no failure leaves a temporary
// file behind.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "optex/checkpoint/atomic_file.hpp"
#include "optex/checkpoint/regular_file.hpp"
#include "support/scratch_directory.hpp"

namespace {

namespace fs = std::filesystem;
using optex::detail::read_regular_file;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

void Write(const std::string& path, const std::string& text) {
  const std::span<const char> pieces[] = {{text.data(), text.size()}};
  optex::detail::write_file_atomically("test file", path, pieces);
}

std::string Read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class AtomicFile : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return scratch_.path(name); }
  std::vector<std::string> Names() const { return scratch_.names(); }

  optex::test::ScratchDirectory scratch_{"optex_test_atomic_file"};
  const fs::path& dir_ = scratch_.dir();
  // Expects f() to throw std::runtime_error mentioning each of `needles`.
  template <class F>
  void ExpectRuntimeError(F f, const std::vector<std::string>& needles) {
    try {
      f();
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      for (const std::string& needle : needles) EXPECT_THAT(e.what(), HasSubstr(needle));
    }
  }
};

TEST_F(AtomicFile, WritesThePiecesInOrderAndReplacesAWholeFile) {
  const std::string a = "first ", b = "second";
  const std::span<const char> pieces[] = {{a.data(), a.size()}, {b.data(), b.size()}};
  optex::detail::write_file_atomically("test file", Path("f"), pieces);
  EXPECT_EQ(Read(Path("f")), "first second");
  Write(Path("f"), "x");
  EXPECT_EQ(Read(Path("f")), "x");
  EXPECT_THAT(Names(), ElementsAre("f"));
  const std::vector<char> bytes = read_regular_file("test file", Path("f"));
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "x");
}

TEST_F(AtomicFile, ANewFileHasTheUsualModeAndAReplacedOneKeepsItsMode) {
  const mode_t mask = ::umask(022);
  Write(Path("new"), "a");
  EXPECT_EQ(fs::status(Path("new")).permissions(), static_cast<fs::perms>(0644));
  fs::permissions(Path("new"), static_cast<fs::perms>(0640));
  Write(Path("new"), "b");
  EXPECT_EQ(fs::status(Path("new")).permissions(), static_cast<fs::perms>(0640));
  ::umask(mask);
}

// The policy: a symbolic link is followed, its final target replaced, the link kept.
TEST_F(AtomicFile, ASymbolicLinkIsFollowedAndKept) {
  Write(Path("target"), "old");
  fs::create_directory(dir_ / "links");
  fs::create_symlink("../target", dir_ / "links" / "one");   // relative to its directory
  fs::create_symlink(dir_ / "links" / "one", dir_ / "two");  // a chain
  Write(Path("two"), "new");
  EXPECT_TRUE(fs::is_symlink(dir_ / "two"));
  EXPECT_TRUE(fs::is_symlink(dir_ / "links" / "one"));
  EXPECT_EQ(Read(Path("target")), "new");
  EXPECT_THAT(Names(), UnorderedElementsAre("target", "links", "two"));
  // A dangling link: its target is created.
  fs::create_symlink("created", dir_ / "dangling");
  Write(Path("dangling"), "made");
  EXPECT_TRUE(fs::is_symlink(dir_ / "dangling"));
  EXPECT_EQ(Read(Path("created")), "made");
  // A loop is refused with the OS's reason.
  fs::create_symlink("loop_b", dir_ / "loop_a");
  fs::create_symlink("loop_a", dir_ / "loop_b");
  ExpectRuntimeError([&] { Write(Path("loop_a"), "x"); },
                     {Path("loop_a"), "symbolic links", "Too many levels of symbolic links"});
}

// rename() would turn a fifo, a directory or a device into a regular file.
TEST_F(AtomicFile, WhatIsNotARegularFileIsRefusedAndLeftAlone) {
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  ExpectRuntimeError([&] { Write(Path("fifo"), "x"); }, {Path("fifo"), "is a fifo"});
  EXPECT_TRUE(fs::is_fifo(Path("fifo")));
  fs::create_directory(dir_ / "dir");
  ExpectRuntimeError([&] { Write(Path("dir"), "x"); }, {Path("dir"), "is a directory"});
  EXPECT_TRUE(fs::is_directory(Path("dir")));
  EXPECT_TRUE(fs::is_empty(Path("dir")));
  // Through a link: the target is named, the link kept.
  fs::create_symlink("fifo", dir_ / "to_fifo");
  ExpectRuntimeError([&] { Write(Path("to_fifo"), "x"); }, {"its target", "is a fifo"});
  EXPECT_TRUE(fs::is_symlink(dir_ / "to_fifo"));
  // A character device of our own (the null device's numbers), where we may make one.
  if (::mknod(Path("null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) {
    ExpectRuntimeError([&] { Write(Path("null"), "x"); }, {"is a character device"});
    EXPECT_TRUE(fs::is_character_file(Path("null")));
  } else {
    std::cout << "[ SKIPPED part ] cannot make a device node here: " << std::strerror(errno)
              << "\n";
  }
  EXPECT_THAT(Names(), UnorderedElementsAre("fifo", "dir", "to_fifo", "null"));
}

TEST_F(AtomicFile, PathsThatNameNoFileAreInvalidArguments) {
  for (const std::string& path : {std::string(), Path("a") + std::string(1, '\0') + "b"}) {
    try {
      Write(path, "x");
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("path"));
    }
    EXPECT_THROW((void)read_regular_file("test file", path), std::invalid_argument);
  }
  EXPECT_TRUE(fs::is_empty(dir_));
}

// A write that fails half-way (the file size limit, which binds root too) leaves the old
// file untouched and no temporary file; the message has the path and the OS's reason.
TEST_F(AtomicFile, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  Write(Path("f"), "old");
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* const previous = ::signal(SIGXFSZ, SIG_IGN);  // a failed write, not a signal
  rlimit small = saved;
  small.rlim_cur = 1000;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string big(5000, 'x');
  bool threw = false;
  try {
    Write(Path("f"), big);
  } catch (const std::runtime_error& e) {
    threw = true;
    EXPECT_THAT(e.what(), HasSubstr(Path("f")));
    EXPECT_THAT(e.what(), HasSubstr("write failed: File too large"));
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, previous);
  EXPECT_TRUE(threw);
  EXPECT_EQ(Read(Path("f")), "old");
  EXPECT_THAT(Names(), ElementsAre("f"));
}

TEST_F(AtomicFile, AMissingOrReadOnlyDirectoryIsNamedWithTheReason) {
  ExpectRuntimeError([&] { Write(Path("no/such/f"), "x"); },
                     {Path("no/such/f"), "No such file or directory"});
  if (::geteuid() == 0) {
    std::cout << "[ SKIPPED part ] running as root, which may write to a read-only directory\n";
    return;
  }
  fs::create_directory(dir_ / "ro");
  fs::permissions(dir_ / "ro", static_cast<fs::perms>(0500));
  ExpectRuntimeError([&] { Write(Path("ro/f"), "x"); }, {Path("ro/f"), "Permission denied"});
  EXPECT_TRUE(fs::is_empty(dir_ / "ro"));
}

// Every writer has its own temporary file: concurrent replacements of one file each land
// whole, and a reader sees one of them, never a mix.
TEST_F(AtomicFile, ConcurrentWritersNeverTearTheFile) {
  const std::string a(100000, 'a'), b(70000, 'b');
  Write(Path("f"), a);
  std::atomic<bool> failed{false};
  std::vector<std::thread> writers;
  for (const std::string* text : {&a, &b}) {
    writers.emplace_back([&, text] {
      for (int i = 0; i < 50; ++i) {
        try {
          Write(Path("f"), *text);
        } catch (const std::exception&) {
          failed = true;
        }
      }
    });
  }
  for (int i = 0; i < 100; ++i) {
    const std::vector<char> bytes = read_regular_file("test file", Path("f"));
    const std::string seen(bytes.begin(), bytes.end());
    EXPECT_TRUE(seen == a || seen == b) << "a torn file of " << seen.size() << " bytes";
  }
  for (std::thread& t : writers) t.join();
  EXPECT_FALSE(failed);
  EXPECT_THAT(Names(), ElementsAre("f"));
}

// Reads are bounded by what a regular file is: nothing else is opened for reading.
TEST_F(AtomicFile, OnlyRegularFilesAreRead) {
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  ExpectRuntimeError([&] { (void)read_regular_file("test file", Path("fifo")); },
                     {Path("fifo"), "is a fifo, not a regular file"});
  ExpectRuntimeError([&] { (void)read_regular_file("test file", dir_.string()); },
                     {"is a directory, not a regular file"});
  ExpectRuntimeError([&] { (void)read_regular_file("test file", "/dev/zero"); },
                     {"/dev/zero", "is a character device, not a regular file"});
  ExpectRuntimeError([&] { (void)read_regular_file("test file", Path("missing")); },
                     {Path("missing"), "cannot open for reading: No such file or directory"});
}

}  // namespace

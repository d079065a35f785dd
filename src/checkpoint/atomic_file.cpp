// write_file_atomically: a unique temporary beside the target, synced, renamed over it.
#include "optex/checkpoint/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <system_error>

#include "optex/checkpoint/file_path.hpp"
#include "optex/util/random.hpp"

namespace optex::detail {
namespace {

namespace fs = std::filesystem;

// Linux's own limit on the links of one path (MAXSYMLINKS).
constexpr int kMaxLinks = 40;
constexpr int kNameAttempts = 100;

class Failure {
 public:
  Failure(std::string_view what, const std::string& path)
      : prefix_(std::string(what) + " '" + path + "': ") {}
  [[noreturn]] void operator()(const std::string& step, int error) const {
    throw std::runtime_error(prefix_ + step + ": " +
                             std::error_code(error, std::generic_category()).message());
  }
  [[noreturn]] void operator()(const std::string& why) const {
    throw std::runtime_error(prefix_ + why);
  }

 private:
  std::string prefix_;
};

// The file a write to `path` lands in: `path`, or the final target of the
// symbolic links it names (which may not exist yet). `st` gets its status;
// false when there is nothing there.
bool resolve(const Failure& fail, const std::string& path, fs::path& target, struct stat& st) {
  target = path;
  for (int links = 0;; ++links) {
    if (::lstat(target.c_str(), &st) != 0) {
      if (errno == ENOENT) return false;
      fail("cannot inspect '" + target.string() + "'", errno);
    }
    if (!S_ISLNK(st.st_mode)) return true;
    if (links == kMaxLinks) fail("cannot follow its symbolic links", ELOOP);
    std::error_code ec;
    const fs::path link = fs::read_symlink(target, ec);
    if (ec) fail("cannot read the symbolic link '" + target.string() + "'", ec.value());
    target = link.is_absolute() ? link : target.parent_path() / link;
  }
}

// A name no other writer (thread or process) picks: the target's name, ".tmp.",
// and 64 bits from the OS's entropy, the process id, the clock and a counter.
std::string temporary_name(const fs::path& target, int attempt) {
  static std::atomic<std::uint64_t> counter{0};
  static const std::uint64_t entropy = [] {
    std::random_device device;
    return (std::uint64_t{device()} << 32) ^ device();
  }();
  const auto now = static_cast<std::uint64_t>(
      std::chrono::high_resolution_clock::now().time_since_epoch().count());
  const std::uint64_t unique =
      mix_seed(entropy ^ now, (static_cast<std::uint64_t>(::getpid()) << 32) ^
                                  counter.fetch_add(1) ^ static_cast<std::uint64_t>(attempt));
  char suffix[17];
  constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) suffix[i] = kHex[(unique >> (4 * i)) & 0xF];
  suffix[16] = '\0';
  // Short enough for NAME_MAX (255) whatever the target's name.
  const std::string name = target.filename().string().substr(0, 200);
  return (target.parent_path() / (name + ".tmp." + suffix)).string();
}

// The temporary file: closed and removed unless it was renamed over the target.
struct Temporary {
  std::string name;
  int fd = -1;
  bool renamed = false;
  Temporary() = default;
  Temporary(const Temporary&) = delete;
  Temporary& operator=(const Temporary&) = delete;
  ~Temporary() {
    if (fd >= 0) ::close(fd);
    if (!name.empty() && !renamed) ::unlink(name.c_str());
  }
};

void write_all(const Failure& fail, int fd, std::span<const char> bytes) {
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write failed", errno);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

}  // namespace

void write_file_atomically(std::string_view what, const std::string& path,
                           std::span<const std::span<const char>> pieces) {
  check_file_path("path", path);
  const Failure fail(what, path);
  fs::path target;
  struct stat st {};
  const bool exists = resolve(fail, path, target, st);
  // rename() would replace a device or a fifo by a regular file: refuse instead.
  if (exists && !S_ISREG(st.st_mode)) {
    fail(std::string(target.string() == path ? "" : "its target '" + target.string() + "' ") +
         "is " + std::string(file_type_name(st.st_mode)) +
         ", not a regular file; refusing to replace it");
  }
  if (target.parent_path().empty()) target = fs::path(".") / target;

  Temporary tmp;
  for (int attempt = 0; tmp.fd < 0; ++attempt) {
    tmp.name = temporary_name(target, attempt);
    // 0666 less the umask, like any new file; O_EXCL: never someone else's file.
    tmp.fd = ::open(tmp.name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (tmp.fd < 0) {
      const int error = errno;
      tmp.name.clear();  // not ours: nothing to remove
      if (error != EEXIST || attempt + 1 == kNameAttempts) {
        fail("cannot create a temporary file in '" + target.parent_path().string() + "'", error);
      }
    }
  }
  if (exists && ::fchmod(tmp.fd, st.st_mode & 07777) != 0) {
    fail("cannot give '" + tmp.name + "' the mode of the file it replaces", errno);
  }
  for (std::span<const char> piece : pieces) write_all(fail, tmp.fd, piece);
  if (::fsync(tmp.fd) != 0) fail("cannot sync '" + tmp.name + "' to storage", errno);
  const int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0) fail("cannot close '" + tmp.name + "'", errno);
  if (::rename(tmp.name.c_str(), target.c_str()) != 0) {
    fail("cannot rename '" + tmp.name + "' over '" + target.string() + "'", errno);
  }
  tmp.renamed = true;
  // The rename is durable once the directory is: a crash now keeps the new file.
  const int dir = ::open(target.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) fail("written, but cannot open its directory to sync it", errno);
  const int synced = ::fsync(dir) == 0 ? 0 : errno;
  ::close(dir);
  // EINVAL: a file system that cannot sync directories; nothing more can be done.
  if (synced != 0 && synced != EINVAL) fail("written, but syncing its directory failed", synced);
}

}  // namespace optex::detail

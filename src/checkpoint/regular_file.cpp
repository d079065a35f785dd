// read_regular_file: stat before open, open without blocking, read at most the size.
#include "optex/checkpoint/regular_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <new>
#include <stdexcept>
#include <system_error>

#include "optex/checkpoint/file_path.hpp"

namespace optex::detail {
namespace {

struct Descriptor {
  int fd;
  explicit Descriptor(int descriptor) : fd(descriptor) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::vector<char> read_regular_file(std::string_view what, const std::string& path) {
  check_file_path("path", path);
  const std::string prefix = std::string(what) + " '" + path + "': ";
  const auto fail = [&](const std::string& step, int error) {
    throw std::runtime_error(prefix + step + ": " +
                             std::error_code(error, std::generic_category()).message());
  };
  const auto require_regular = [&](const struct stat& st) {
    // A fifo would block, a device such as /dev/zero never end, a directory not read.
    if (!S_ISREG(st.st_mode)) {
      throw std::runtime_error(prefix + "is " + std::string(file_type_name(st.st_mode)) +
                               ", not a regular file");
    }
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("cannot open for reading", errno);
  require_regular(st);
  // O_NONBLOCK: should a fifo replace the file after the stat, opening it cannot block.
  const Descriptor file(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (file.fd < 0) fail("cannot open for reading", errno);
  if (::fstat(file.fd, &st) != 0) fail("cannot inspect the open file", errno);
  require_regular(st);

  const auto size = static_cast<std::size_t>(st.st_size);
  std::vector<char> bytes;
  try {
    bytes.resize(size);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error(prefix + "its " + std::to_string(size) +
                             " bytes do not fit in memory");
  }
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(file.fd, bytes.data() + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("read failed", errno);
    }
    if (n == 0) {
      throw std::runtime_error(prefix + "shrank while being read (" + std::to_string(done) +
                               " of " + std::to_string(size) + " bytes)");
    }
    done += static_cast<std::size_t>(n);
  }
  return bytes;
}

}  // namespace optex::detail

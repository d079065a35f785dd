#include "optex/checkpoint/file_path.hpp"

#include <sys/stat.h>

#include <stdexcept>

namespace optex::detail {

void check_file_path(std::string_view parameter, const std::string& path) {
  if (path.empty()) {
    throw std::invalid_argument(std::string(parameter) + ": must name a file, got ''");
  }
  if (const std::size_t nul = path.find('\0'); nul != std::string::npos) {
    throw std::invalid_argument(std::string(parameter) + ": must not contain a NUL byte, got '" +
                                path.substr(0, nul) + "\\0" + path.substr(nul + 1) +
                                "' (NUL at byte " + std::to_string(nul) + ")");
  }
}

std::string_view file_type_name(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a directory";
    case S_IFIFO:
      return "a fifo";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFSOCK:
      return "a socket";
    case S_IFLNK:
      return "a symbolic link";
    default:
      return "not a regular file";
  }
}

}  // namespace optex::detail

// A fresh directory under the system's temporary directory for one test,
// removed with everything in it when the test ends (even one whose
// permissions the test took away).
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace optex::test {

class ScratchDirectory {
 public:
  // <temp>/<prefix>_<pid>_<n>: unique across processes and within one.
  explicit ScratchDirectory(const std::string& prefix) {
    static std::atomic<int> counter{0};
    dir_ = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDirectory() {
    std::error_code ec;
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(dir_, ec);
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // The names of the directory's entries, in the order the system lists them.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      out.push_back(entry.path().filename().string());
    }
    return out;
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace optex::test

// An output file of a benchmark program that cannot be lost silently: a short
// write (a full disk, a quota) surfaces at write, flush or close, so finish()
// checks all three and names the flag, the path and the OS's reason.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace optex_bench {

class OutputFile {
 public:
  // Opens `path` for writing now, so that a bad path fails before a long run.
  OutputFile(std::string flag, std::string path) : flag_(std::move(flag)), path_(std::move(path)) {
    errno = 0;
    file_.open(path_);
    if (!file_) fail("cannot open", "");
  }

  // The text goes to memory first: the one write in finish() then sees the OS's
  // error of its own call, not one left over from elsewhere.
  std::ostream& stream() { return text_; }

  // Writes, flushes and closes; throws std::runtime_error if anything was lost.
  void finish() {
    const std::string text = std::move(text_).str();
    errno = 0;
    file_.write(text.data(), static_cast<std::streamsize>(text.size()));
    file_.flush();
    if (!file_) fail("writing", " failed");
    file_.close();
    if (!file_) fail("closing", " failed");
  }

 private:
  // "--json: writing '/dev/full' failed: No space left on device".
  [[noreturn]] void fail(const char* doing, const char* outcome) const {
    const int error = errno;
    throw std::runtime_error(flag_ + ": " + doing + " '" + path_ + "'" + outcome + ": " +
                             (error != 0 ? std::strerror(error) : "unknown error"));
  }

  std::string flag_, path_;
  std::ofstream file_;
  std::ostringstream text_;
};

// Writes `markdown` and `json` to the paths given (an empty path: nothing);
// returns 0, or 1 after printing "<tool>: error: <why>" to stderr.
inline int write_results(const char* tool, const std::string& markdown_path,
                         const std::string& markdown, const std::string& json_path,
                         const std::string& json) {
  try {
    const std::pair<const char*, const std::string*> outputs[] = {{"--markdown", &markdown_path},
                                                                  {"--json", &json_path}};
    for (const auto& [flag, path] : outputs) {
      if (path->empty()) continue;
      OutputFile file(flag, *path);
      file.stream() << (path == &markdown_path ? markdown : json);
      file.finish();
    }
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return 1;
  }
  return 0;
}

}  // namespace optex_bench

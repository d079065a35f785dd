// What the library's file operations check about a path before they touch the
// file system (checkpoints: src/checkpoint/atomic_file.cpp, src/checkpoint/regular_file.cpp).
#pragma once

#include <string>
#include <string_view>

namespace optex::detail {

// Throws std::invalid_argument naming `parameter` unless `path` can name a
// file: not empty, and no NUL byte (the OS would silently cut the name there).
void check_file_path(std::string_view parameter, const std::string& path);

// "a directory", "a fifo", "a character device", ... for a st_mode's type.
std::string_view file_type_name(unsigned mode);

}  // namespace optex::detail

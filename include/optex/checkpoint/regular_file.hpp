// Reading a whole file whose size bounds what is read (docs/DESIGN.md section 6).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace optex::detail {

// The bytes of the regular file at `path`. Anything else (a directory, fifo,
// device, socket) is refused before it is read, so no read can block or run
// without end; at most the size the file has when opened is read.
// std::invalid_argument naming "path" for an empty path or one with a NUL
// byte; std::runtime_error "<what> '<path>': <what failed>: <the OS's reason>"
// otherwise.
std::vector<char> read_regular_file(std::string_view what, const std::string& path);

}  // namespace optex::detail

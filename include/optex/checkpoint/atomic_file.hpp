// Replacing a file so that every reader sees either the old content or the
// new, never a mix, and a failure leaves nothing behind (docs/DESIGN.md
// section 6, "Checkpoints").
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace optex::detail {

// Replaces the file at `path` with the concatenation of `pieces`.
//
// - `path` must be non-empty without NUL bytes (std::invalid_argument naming "path").
// - A symbolic link is followed: its final target is replaced and the link stays.
// - Anything at the target that is not a regular file (a directory, fifo,
//   device, socket) is refused, untouched.
// - The bytes go to a new, uniquely named file beside the target (so two
//   writers never share one), which is synced, renamed over the target, and
//   the directory synced. A new file gets the usual permissions (0666 less
//   the umask); a replaced one keeps its mode.
// - Every failure removes that temporary file and throws std::runtime_error
//   "<what> '<path>': <what failed>: <the OS's reason>".
void write_file_atomically(std::string_view what, const std::string& path,
                           std::span<const std::span<const char>> pieces);

}  // namespace optex::detail

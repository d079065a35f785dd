// How the communicators word a timeout in their messages ("600 s"), shared
// by the in-process, MPI and NCCL backends.
#pragma once

#include <sstream>
#include <string>

#include "optex/distributed/communicator.hpp"

namespace optex::detail {

inline std::string seconds_text(Communicator::Seconds s) {
  std::ostringstream out;
  out << s.count() << " s";
  return out.str();
}

}  // namespace optex::detail

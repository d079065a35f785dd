// MPI's words for an error code, for the MPI communicator's messages (its
// lifetime, its errors and its polling of requests).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>

namespace optex::detail {

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error code " + std::to_string(code);
  }
  return std::string(text, static_cast<std::size_t>(length));
}

}  // namespace optex::detail

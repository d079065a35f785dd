# FindNCCL: the NVIDIA Collective Communications Library (nccl.h, libnccl).
#
#   find_package(NCCL 2.18 REQUIRED)
#   target_link_libraries(app PRIVATE NCCL::NCCL)
#
# Looks in NCCL_ROOT (a CMake or environment variable), then beside the CUDA
# toolkit (CUDAToolkit_INCLUDE_DIRS / CUDAToolkit_LIBRARY_DIR when
# find_package(CUDAToolkit) ran first), then /usr/local/cuda and the system
# paths. Sets NCCL_FOUND, NCCL_VERSION (from NCCL_MAJOR/MINOR/PATCH in
# nccl.h), NCCL_INCLUDE_DIR, NCCL_LIBRARY and the imported target NCCL::NCCL.
# Installed beside optexConfig.cmake, which uses it for optex::nccl.
include(FindPackageHandleStandardArgs)

find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
  PATHS /usr/local/cuda
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR}
  PATHS /usr/local/cuda
  PATH_SUFFIXES lib lib64)

set(NCCL_VERSION "")
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
    REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_nccl_line IN LISTS _nccl_version_lines)
    if(_nccl_line MATCHES "^#define NCCL_(MAJOR|MINOR|PATCH) +([0-9]+)")
      set(_nccl_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
    endif()
  endforeach()
  if(DEFINED _nccl_MAJOR AND DEFINED _nccl_MINOR AND DEFINED _nccl_PATCH)
    set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
  endif()
  unset(_nccl_version_lines)
  unset(_nccl_line)
  unset(_nccl_MAJOR)
  unset(_nccl_MINOR)
  unset(_nccl_PATCH)
endif()

find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()

mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)

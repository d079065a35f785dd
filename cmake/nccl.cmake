# The NCCL communicator target (optex::nccl): NcclCommunicator, one process
# per GPU with gradient rows in device memory. Included from the top-level
# CMakeLists.txt when OPTEX_WITH_NCCL is ON.
if(NOT OPTEX_WITH_CUDA)
  message(FATAL_ERROR "OPTEX_WITH_NCCL=ON needs OPTEX_WITH_CUDA=ON: the NCCL communicator "
    "gathers gradient rows in GPU memory. Configure with -DOPTEX_WITH_CUDA=ON, or turn the "
    "NCCL communicator off with -DOPTEX_WITH_NCCL=OFF.")
endif()

# 2.18: non-blocking ncclCommSplit and ncclCommFinalize.
find_package(NCCL 2.18 QUIET)
if(NOT NCCL_FOUND)
  if(NCCL_VERSION)
    set(_nccl_seen "found NCCL ${NCCL_VERSION} in ${NCCL_INCLUDE_DIR}, which is too old")
  else()
    set(_nccl_seen "found no nccl.h and libnccl")
  endif()
  message(FATAL_ERROR "OPTEX_WITH_NCCL=ON needs NCCL 2.18 or later, but CMake ${_nccl_seen}. "
    "Install NCCL (libnccl-dev, or NVIDIA's tarball) and point NCCL_ROOT at it, or configure "
    "with -DOPTEX_WITH_NCCL=OFF.")
endif()

add_library(optex_nccl
  cuda/nccl_collectives.cpp
  cuda/nccl_communicator.cpp
  cuda/nccl_polling.cpp
  cuda/nccl_state.cpp)
add_library(optex::nccl ALIAS optex_nccl)
# The private headers shared with the other communicators (src/distributed/*.hpp).
target_include_directories(optex_nccl PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
target_link_libraries(optex_nccl
  PUBLIC optex
  PRIVATE CUDA::cudart NCCL::NCCL $<BUILD_INTERFACE:optex_warnings>)
# Lets a user's code tell that this build has optex::nccl.
target_compile_definitions(optex_nccl PUBLIC OPTEX_HAVE_NCCL=1)
set_target_properties(optex_nccl PROPERTIES POSITION_INDEPENDENT_CODE ON EXPORT_NAME nccl)

install(TARGETS optex_nccl EXPORT optexTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# optexConfig.cmake finds NCCL again for a consumer with this module.
install(FILES cmake/FindNCCL.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/optex)

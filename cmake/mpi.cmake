# The MPI communicator target (optex::mpi).
# Included from the top-level CMakeLists.txt when OPTEX_WITH_MPI is ON; the
# find_package(MPI) there decided the option's default.
if(NOT MPI_CXX_FOUND)
  message(FATAL_ERROR "OPTEX_WITH_MPI is ON but no MPI with C++ support was found. Install one "
    "(Debian/Ubuntu: apt-get install libopenmpi-dev openmpi-bin), point CMake at it "
    "(MPI_CXX_COMPILER=/path/to/mpicxx), or configure with -DOPTEX_WITH_MPI=OFF.")
endif()

add_library(optex_mpi
  src/distributed/mpi_collectives.cpp
  src/distributed/mpi_communicator.cpp
  src/distributed/mpi_request_polling.cpp)
add_library(optex::mpi ALIAS optex_mpi)
# The private headers beside the sources (src/distributed/*.hpp), as for optex.
target_include_directories(optex_mpi PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
target_link_libraries(optex_mpi PUBLIC optex MPI::MPI_CXX PRIVATE $<BUILD_INTERFACE:optex_warnings>)
set_target_properties(optex_mpi PROPERTIES POSITION_INDEPENDENT_CODE ON EXPORT_NAME mpi)

install(TARGETS optex_mpi EXPORT optexTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

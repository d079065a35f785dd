// Every CUDA, cuBLAS and cuSOLVER status becomes an exception that names the
// call, the file and line, and the library's own message.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <stdexcept>
#include <string>

namespace optex::cuda {

// What went wrong, with where: "cuda: out of memory (cudaMalloc(...) at cuda/x.cu:12)".
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_cuda_error(const char* library, const char* message, const char* call,
                                   const char* file, int line);
const char* cusolver_status_string(cusolverStatus_t status);

inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) throw_cuda_error("cuda", cudaGetErrorString(status), call, file, line);
}
inline void check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw_cuda_error("cublas", cublasGetStatusString(status), call, file, line);
}
inline void check(cusolverStatus_t status, const char* call, const char* file, int line) {
  if (status != CUSOLVER_STATUS_SUCCESS)
    throw_cuda_error("cusolver", cusolver_status_string(status), call, file, line);
}

}  // namespace optex::cuda

// Wrap every CUDA, cuBLAS or cuSOLVER call (and check kernel launches with
// OPTEX_CUDA_CHECK(cudaGetLastError())).
#define OPTEX_CUDA_CHECK(call) ::optex::cuda::check((call), #call, __FILE__, __LINE__)

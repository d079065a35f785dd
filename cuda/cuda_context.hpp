// RAII owners of the CUDA objects a backend holds: the current-device scope,
// a stream, the cuBLAS and cuSOLVER handles bound to it, and pinned host
// memory. Compiled by the host compiler; every call goes through
// OPTEX_CUDA_CHECK except in destructors, which must not throw.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <cstddef>
#include <utility>

#include "cuda_check.hpp"

namespace optex::cuda {

// Makes `device` current and restores the caller's device when it ends. The
// current device is per host thread and belongs to the caller, so every
// public entry point of a backend runs inside one of these.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) { enter(); }
  ~DeviceGuard() { leave(); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  void enter() {
    if (active_) return;
    int current = 0;
    OPTEX_CUDA_CHECK(cudaGetDevice(&current));
    if (current != device_) OPTEX_CUDA_CHECK(cudaSetDevice(device_));
    previous_ = current;
    active_ = true;
  }
  // For destructors: best effort, never throws.
  void enter_noexcept() noexcept {
    if (active_) return;
    int current = 0;
    if (cudaGetDevice(&current) != cudaSuccess) return;
    if (current != device_ && cudaSetDevice(device_) != cudaSuccess) return;
    previous_ = current;
    active_ = true;
  }
  void leave() noexcept {
    if (!active_) return;
    if (previous_ != device_) cudaSetDevice(previous_);
    active_ = false;
  }

 private:
  int device_;
  int previous_ = 0;
  bool active_ = false;
};

// A non-blocking stream: it never waits on the legacy default stream that
// other code on the device may use.
class Stream {
 public:
  Stream() { OPTEX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// A cuBLAS handle whose work goes to `stream`.
class BlasHandle {
 public:
  explicit BlasHandle(cudaStream_t stream) {
    OPTEX_CUDA_CHECK(cublasCreate(&handle_));
    try {
      OPTEX_CUDA_CHECK(cublasSetStream(handle_, stream));
      // Plain fp32 arithmetic: no TF32 tensor-core shortcuts in the Gram rows.
      OPTEX_CUDA_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
    } catch (...) {
      cublasDestroy(handle_);
      throw;
    }
  }
  ~BlasHandle() { cublasDestroy(handle_); }
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// A cuSOLVER dense handle whose work goes to `stream`.
class SolverHandle {
 public:
  explicit SolverHandle(cudaStream_t stream) {
    OPTEX_CUDA_CHECK(cusolverDnCreate(&handle_));
    try {
      OPTEX_CUDA_CHECK(cusolverDnSetStream(handle_, stream));
    } catch (...) {
      cusolverDnDestroy(handle_);
      throw;
    }
  }
  ~SolverHandle() { cusolverDnDestroy(handle_); }
  SolverHandle(const SolverHandle&) = delete;
  SolverHandle& operator=(const SolverHandle&) = delete;
  cusolverDnHandle_t get() const { return handle_; }

 private:
  cusolverDnHandle_t handle_ = nullptr;
};

// Page-locked host memory (cudaMallocHost): asynchronous copies to and from
// it really are asynchronous, and need no staging copy.
template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t count) : count_(count) {
    if (count > 0)
      OPTEX_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data_), count * sizeof(T)));
  }
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return count_; }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace optex::cuda

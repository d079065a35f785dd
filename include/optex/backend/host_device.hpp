// Marks functions that run on the host and, when compiled by nvcc, on the
// device too: the CPU and CUDA backends share one definition of every
// elementwise formula, so they cannot drift apart.
#pragma once

#if defined(__CUDACC__)
#define OPTEX_HOST_DEVICE __host__ __device__
#else
#define OPTEX_HOST_DEVICE
#endif

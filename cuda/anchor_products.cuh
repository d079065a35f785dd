// The anchor products of DevicePrimitives::anchor_products (their definitions
// and output layout: optex/backend/device_primitives.hpp, AnchorLayout) on the
// device, in fp64 terms: every stored value is widened to double before it is
// subtracted or multiplied, and every sum is in fp64.
//
// Deterministic: the grid over d is reduction_blocks(d) blocks whatever the
// device, every thread sums its grid-stride slice in increasing k, each block
// sums its threads in a fixed tree order, and a second kernel sums the blocks
// of each product in a fixed order. No atomics.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <span>

#include "kernels.cuh"

namespace optex::cuda {

// Fresh slots one pass over the rows takes: F fresh slots read the rows
// ceil(F / kAnchorFreshPerPass) times (once for F <= kAnchorFreshPerPass).
inline constexpr int kAnchorFreshPerPass = 8;

// The partial rows (reduction_blocks(d) doubles each) anchor_products needs
// for n rows and nfresh fresh slots: 6 n + 3 + 2 n min(nfresh,
// kAnchorFreshPerPass), the first pass's products; later passes reuse them.
std::size_t anchor_products_partial_rows(std::size_t n, std::size_t nfresh);

// out[0, AnchorLayout(n, fresh.size()).size()) := the anchor products of the
// first n rows of `points` and `gradients` (n x d each, row stride d), the
// anchor a and the momentum m (d floats; m may be null: the products with m
// are then exactly 0). `fresh` is host memory, read before the call returns,
// whose entries the caller has checked are rows in [0, n)
// (streaming::check_fresh_rows, the CPU's check). partials:
// anchor_products_partial_rows(n, fresh.size()) * reduction_blocks(d) doubles,
// which the caller has checked fit in int rows. With d == 0 every product is 0.
template <class Store>
void anchor_products(const Store* points, const Store* gradients, int n, std::size_t d,
                     const float* a, const float* m, std::span<const int> fresh, double* partials,
                     double* out, cudaStream_t stream);

}  // namespace optex::cuda

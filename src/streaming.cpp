#include "optex/streaming.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <array>

namespace optex::streaming {
namespace {

// 1024 floats = 4 KiB per row block: with up to 64 rows the block of the query
// and of one row both sit in L1 while the products are formed.
constexpr std::size_t kBlock = 1024;
constexpr std::size_t kMaxRowsOnStack = 256;

using RowBlock = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
                            0, Eigen::OuterStride<>>;
using ConstVec = Eigen::Map<const Eigen::VectorXf>;

// Applies `per_block(row_block, x_block, partial)` over d in blocks, where
// `partial` holds one float partial result per row, and adds the partials into
// the double accumulators. Float within a block keeps the pass vectorised;
// double across blocks keeps the sum accurate at d = 1e8.
template <class PerBlock>
void blocked_reduce(const float* rows, std::size_t nrows, std::size_t dim, const float* x,
                    double* out, PerBlock per_block) {
  std::fill(out, out + nrows, 0.0);
  Eigen::VectorXf partial(static_cast<Eigen::Index>(nrows));
  for (std::size_t begin = 0; begin < dim; begin += kBlock) {
    const auto len = static_cast<Eigen::Index>(std::min(kBlock, dim - begin));
    RowBlock block(rows + begin, static_cast<Eigen::Index>(nrows), len,
                   Eigen::OuterStride<>(static_cast<Eigen::Index>(dim)));
    ConstVec xb(x + begin, len);
    per_block(block, xb, partial);
    for (std::size_t j = 0; j < nrows; ++j) out[j] += partial[static_cast<Eigen::Index>(j)];
  }
}

}  // namespace

void squared_distances(const float* rows, std::size_t nrows, std::size_t dim, const float* x,
                       double* out) {
  blocked_reduce(rows, nrows, dim, x, out, [](const RowBlock& block, const ConstVec& xb, Eigen::VectorXf& partial) {
    for (Eigen::Index j = 0; j < block.rows(); ++j)
      partial[j] = (block.row(j).transpose() - xb).squaredNorm();
  });
}

void inner_products(const float* rows, std::size_t nrows, std::size_t dim, const float* x,
                    double* out) {
  blocked_reduce(rows, nrows, dim, x, out, [](const RowBlock& block, const ConstVec& xb, Eigen::VectorXf& partial) {
    partial.noalias() = block * xb;
  });
}

void weighted_sum(const float* rows, std::size_t nrows, std::size_t dim, const double* weights,
                  float* out) {
  std::array<float, kMaxRowsOnStack> w_small{};
  Eigen::VectorXf w_large;
  float* w = w_small.data();
  if (nrows > kMaxRowsOnStack) {
    w_large.resize(static_cast<Eigen::Index>(nrows));
    w = w_large.data();
  }
  for (std::size_t j = 0; j < nrows; ++j) w[j] = static_cast<float>(weights[j]);
  const Eigen::Map<const Eigen::VectorXf> wv(w, static_cast<Eigen::Index>(nrows));
  for (std::size_t begin = 0; begin < dim; begin += kBlock) {
    const auto len = static_cast<Eigen::Index>(std::min(kBlock, dim - begin));
    RowBlock block(rows + begin, static_cast<Eigen::Index>(nrows), len,
                   Eigen::OuterStride<>(static_cast<Eigen::Index>(dim)));
    Eigen::Map<Eigen::VectorXf> ob(out + begin, len);
    ob.noalias() = block.transpose() * wv;
  }
}

double dot(const float* a, const float* b, std::size_t dim) {
  double acc = 0.0;
  for (std::size_t begin = 0; begin < dim; begin += kBlock) {
    const auto len = static_cast<Eigen::Index>(std::min(kBlock, dim - begin));
    acc += ConstVec(a + begin, len).dot(ConstVec(b + begin, len));
  }
  return acc;
}

}  // namespace optex::streaming

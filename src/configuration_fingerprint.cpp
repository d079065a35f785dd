#include "optex/detail/configuration_fingerprint.hpp"

#include "optex/random.hpp"
#include "serialization.hpp"

namespace optex::detail {

std::uint64_t configuration_fingerprint(const Options& options, const OptimizerRanges& optimizer,
                                        std::size_t dim) {
  Options shared = options;
  shared.device.index = 0;  // one GPU per rank: the index may differ
  Writer w;
  put_options(w, shared);
  put_optimizer_ranges(w, optimizer.for_dimension(dim));
  w.put<std::uint64_t>(dim);
  return fnv1a64(reinterpret_cast<const unsigned char*>(w.bytes().data()), w.bytes().size());
}

}  // namespace optex::detail

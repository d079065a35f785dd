#include "optex/distributed/configuration_fingerprint.hpp"

#include "checkpoint/serialization.hpp"
#include "optex/util/random.hpp"

namespace optex::detail {
namespace {

Writer write_configuration(const Options& options, const OptimizerRanges& optimizer,
                           std::size_t dim, bool labelled) {
  Options shared = options;
  shared.device.index = 0;  // one GPU per rank: the index may differ
  Writer w(labelled);
  put_options(w, shared);
  put_optimizer_ranges(w, optimizer.for_dimension(dim));
  w.put<std::uint64_t>(dim, "dim");
  return w;
}

}  // namespace

std::uint64_t configuration_fingerprint(const Options& options, const OptimizerRanges& optimizer,
                                        std::size_t dim) {
  const Writer w = write_configuration(options, optimizer, dim, false);
  return fnv1a64(reinterpret_cast<const unsigned char*>(w.bytes().data()), w.bytes().size());
}

std::vector<std::pair<std::string, std::string>> configuration_fields(
    const Options& options, const OptimizerRanges& optimizer, std::size_t dim) {
  const Writer w = write_configuration(options, optimizer, dim, true);
  std::vector<std::pair<std::string, std::string>> fields;
  for (const Writer::Field& f : w.fields()) fields.emplace_back(f.name, f.value);
  return fields;
}

}  // namespace optex::detail

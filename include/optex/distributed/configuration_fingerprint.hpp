// A hash of everything that must agree between the ranks of a distributed run
// before the first iteration: options (except the device index, which differs
// per rank on GPUs), optimizer ranges and hyperparameters, and dimension. Written with the
// checkpoint's serialisation, so a new option cannot be forgotten here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "optex/engine/options.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"

namespace optex::detail {

std::uint64_t configuration_fingerprint(const Options& options, const OptimizerRanges& optimizer,
                                        std::size_t dim);

// The same bytes' fields, named ("options.history", "optimizer.lr", "dim")
// with their values as text, in the fingerprint's order: the ranks compare
// them when the fingerprints differ, to say which field differs.
std::vector<std::pair<std::string, std::string>> configuration_fields(
    const Options& options, const OptimizerRanges& optimizer, std::size_t dim);

}  // namespace optex::detail

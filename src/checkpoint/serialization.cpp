#include "checkpoint/serialization.hpp"

#include <optional>
#include <string>

namespace optex::detail {
namespace {

template <class O>
void put_fields(Writer& w, const O& o, std::string_view prefix) {
  for_each_hyperparameter<O>([&](const auto& field) {
    const std::string name = std::string(prefix) + "." + std::string(field.name);
    if constexpr (std::is_same_v<typename std::decay_t<decltype(field)>::value_type, bool>) {
      w.put<std::uint8_t>(o.*field.member ? 1 : 0, name, o.*field.member ? "true" : "false");
    } else {
      w.put<double>(o.*field.member, name);
    }
  });
}

template <class O>
O get_fields(Reader& r) {
  O o;
  for_each_hyperparameter<O>([&](const auto& field) {
    const std::string name = "optimizer " + std::string(O::name) + "." + std::string(field.name);
    if constexpr (std::is_same_v<typename std::decay_t<decltype(field)>::value_type, bool>) {
      o.*field.member = r.get_flag(name);
    } else {
      o.*field.member = r.get<double>(name);
    }
  });
  return o;
}

}  // namespace

void put_options(Writer& w, const Options& o) {
  w.put<std::int32_t>(o.parallelism, "options.parallelism");
  w.put<std::int32_t>(o.history, "options.history");
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.kernel), "options.kernel");
  w.put(o.lengthscale, "options.lengthscale");
  w.put(o.noise, "options.noise");
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.input_scaling), "options.input_scaling");
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.warmup), "options.warmup");
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.lengthscale_selection),
                      "options.lengthscale_selection");
  w.put<std::int32_t>(o.selection_interval, "options.selection_interval");
  w.put_vector(o.lengthscale_grid, "options.lengthscale_grid");
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.proxy), "options.proxy");
  w.put(o.seed, "options.seed");
  // Format 2.
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.device.kind), "options.device.kind");
  w.put<std::int32_t>(o.device.index, "options.device.index");
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.history_precision), "options.history_precision");
  // Format 4.
  w.put<std::int32_t>(o.evaluations_per_point, "options.evaluations_per_point");
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.strategy), "options.strategy");
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.continue_from), "options.continue_from");
  w.put(o.max_posterior_variance, "options.max_posterior_variance");
  w.put(o.trust_region, "options.trust_region");
  w.put(o.max_lengthscale_change, "options.max_lengthscale_change");
  // Format 6.
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.mode), "options.mode");
  w.put(o.tolerance, "options.tolerance");
  // Format 7.
  w.put<std::uint8_t>(static_cast<std::uint8_t>(o.proxy_distances), "options.proxy_distances");
}

Options get_options(Reader& r, std::uint32_t version) {
  Options o;
  o.parallelism = r.get<std::int32_t>("options.parallelism");
  o.history = r.get<std::int32_t>("options.history");
  o.kernel = static_cast<Covariance>(r.get<std::uint8_t>("options.kernel"));
  o.lengthscale = r.get<double>("options.lengthscale");
  o.noise = r.get<double>("options.noise");
  o.input_scaling = static_cast<InputScaling>(r.get<std::uint8_t>("options.input_scaling"));
  o.warmup = static_cast<Warmup>(r.get<std::uint8_t>("options.warmup"));
  o.lengthscale_selection =
      static_cast<LengthscaleSelection>(r.get<std::uint8_t>("options.lengthscale_selection"));
  o.selection_interval = r.get<std::int32_t>("options.selection_interval");
  o.lengthscale_grid = r.get_vector<double>("options.lengthscale_grid", 1 << 16);
  o.proxy = static_cast<Proxy>(r.get<std::uint8_t>("options.proxy"));
  o.seed = r.get<std::uint64_t>("options.seed");
  if (version >= 2) {  // format 1 predates devices: CPU, fp32
    o.device.kind = static_cast<Device::Kind>(r.get<std::uint8_t>("options.device.kind"));
    o.device.index = r.get<std::int32_t>("options.device.index");
    o.history_precision = static_cast<Precision>(r.get<std::uint8_t>("options.history_precision"));
  }
  // Earlier formats: one evaluation per point, no safeguards, and the commit
  // from the last point that was the only rule then.
  o.continue_from = ContinueFrom::last;
  if (version >= 4) {
    o.evaluations_per_point = r.get<std::int32_t>("options.evaluations_per_point");
    o.strategy = static_cast<Strategy>(r.get<std::uint8_t>("options.strategy"));
    o.continue_from = static_cast<ContinueFrom>(r.get<std::uint8_t>("options.continue_from"));
    o.max_posterior_variance = r.get<double>("options.max_posterior_variance");
    o.trust_region = r.get<double>("options.trust_region");
    o.max_lengthscale_change = r.get<double>("options.max_lengthscale_change");
  }
  if (version >= 6) {  // earlier formats: the approximate mode only
    o.mode = static_cast<Mode>(r.get<std::uint8_t>("options.mode"));
    o.tolerance = r.get<double>("options.tolerance");
  }
  if (version >= 7) {  // earlier formats: one pass over the history per proxy step
    o.proxy_distances = static_cast<ProxyDistances>(r.get<std::uint8_t>("options.proxy_distances"));
  }
  return o;
}

void put_optimizer(Writer& w, const Optimizer& optimizer, std::string_view name) {
  std::visit(
      [&](const auto& o) {
        w.put<std::uint8_t>(o.checkpoint_tag, std::string(name) + ".kind", std::string(o.name));
        put_fields(w, o, name);
      },
      optimizer);
}

Optimizer get_optimizer(Reader& r) {
  const std::size_t at = r.offset();
  const auto tag = r.get<std::uint8_t>("optimizer tag");
  std::optional<Optimizer> found;
  for_each_optimizer_kind([&](auto kind) {
    using O = typename decltype(kind)::type;
    if (!found && tag == O::checkpoint_tag) found = get_fields<O>(r);
  });
  if (!found) r.fail_at("optimizer tag", at, "unknown optimizer tag " + std::to_string(tag));
  return *found;
}

void put_optimizer_ranges(Writer& w, const OptimizerRanges& ranges) {
  w.put<std::uint32_t>(static_cast<std::uint32_t>(ranges.count()), "optimizer.ranges");
  std::size_t k = 0;
  for (const OptimizerRange& range : ranges.ranges()) {
    const std::string name = "optimizer[" + std::to_string(k++) + "]";
    w.put<std::uint64_t>(range.size, name + ".size");
    w.put<std::int64_t>(range.step_offset, name + ".step_offset");  // format 5
    put_optimizer(w, range.optimizer, ranges.count() == 1 ? "optimizer" : name);
  }
}

OptimizerRanges get_optimizer_ranges(Reader& r, std::size_t dim_limit, std::uint32_t version,
                                     std::vector<std::size_t>* step_offsets_at) {
  const std::size_t at = r.offset();
  const auto count = r.get<std::uint32_t>("optimizer ranges");
  // Each range takes at least its size and its tag: a count the bytes left cannot hold is
  // refused before anything is allocated for it.
  constexpr std::size_t kMinRangeBytes = sizeof(std::uint64_t) + sizeof(std::uint8_t);
  if (count == 0 || count > dim_limit || count > r.remaining() / kMinRangeBytes) {
    r.fail_at("optimizer ranges", at,
              "the number of optimizer ranges is out of range (" + std::to_string(count) +
                  " with " + std::to_string(r.remaining()) + " bytes left)");
  }
  std::vector<OptimizerRange> ranges;
  ranges.reserve(count);
  for (std::uint32_t k = 0; k < count; ++k) {
    const std::string field = "optimizer range " + std::to_string(k) + " size";
    const std::size_t size_at = r.offset();
    const auto size = r.get<std::uint64_t>(field);
    if (size == 0 || size > dim_limit) {
      r.fail_at(field, size_at,
                "an optimizer range's size is out of range (" + std::to_string(size) + ")");
    }
    std::int64_t step_offset = 0;
    if (version >= 5) {
      const std::string offset_field = "optimizer range " + std::to_string(k) + " step_offset";
      const std::size_t offset_at = r.offset();
      step_offset = r.get<std::int64_t>(offset_field);
      if (step_offset < 0) {
        r.fail_at(offset_field, offset_at, "is " + std::to_string(step_offset) + " (must be >= 0)");
      }
      if (step_offsets_at) step_offsets_at->push_back(offset_at);
    }
    ranges.push_back({static_cast<std::size_t>(size), get_optimizer(r), step_offset});
  }
  try {
    return OptimizerRanges(std::move(ranges));
  } catch (const std::invalid_argument& e) {
    r.fail_at("optimizer ranges", at, std::string("invalid content: ") + e.what());
  }
}

}  // namespace optex::detail

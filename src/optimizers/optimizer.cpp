// The operations on any base optimizer that are not elementwise.
#include "optex/optimizers/optimizer.hpp"

#include <cctype>
#include <optional>
#include <stdexcept>

namespace optex {

std::string cannot_replace(const Optimizer& current, const Optimizer& next) {
  if (current.index() != next.index()) {
    return "optimizer: " + std::string(optimizer_name(next)) + " cannot replace " +
           std::string(optimizer_name(current)) +
           " (the optimizer state differs); start a new engine";
  }
  return std::visit(
      [&](const auto& c) { return c.cannot_become(std::get<std::decay_t<decltype(c)>>(next)); },
      current);
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// f(lowercase class name, defaults) for every Python class of every kind.
template <class F>
void for_each_named_optimizer(F&& f) {
  for_each_optimizer_kind([&](auto kind) {
    using O = typename decltype(kind)::type;
    for (const auto& cls : O::python_classes()) f(lower(cls.name), Optimizer(cls.defaults));
  });
}

}  // namespace

std::string optimizer_names() {
  std::string names;
  for_each_named_optimizer([&](const std::string& name, const Optimizer&) {
    names += (names.empty() ? "" : ", ") + name;
  });
  return names;
}

Optimizer optimizer_from_name(std::string_view name) {
  std::optional<Optimizer> found;
  for_each_named_optimizer([&](const std::string& known, const Optimizer& defaults) {
    if (!found && known == name) found = defaults;
  });
  if (!found) {
    throw std::invalid_argument("optimizer: unknown '" + std::string(name) +
                                "' (known: " + optimizer_names() + ")");
  }
  return *found;
}

}  // namespace optex

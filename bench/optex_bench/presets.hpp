// Named starting points for Settings: `--preset NAME` fills every field, and the
// flags given explicitly on the command line then override it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "settings.hpp"

namespace optex_bench {

// "default", "paper", "scaling", "ablation", "suite", "illcond", "noisy_quadratic",
// "lr_transfer", "ci".
const std::vector<std::string>& preset_names();

// One line per preset, for --help.
std::string preset_help();

// Throws std::invalid_argument for an unknown name.
Settings preset_settings(std::string_view name);

}  // namespace optex_bench

// A flag value or list item read as a number: all of the text, or nothing. The
// callers say what range they accept and name the flag in their own message.
#pragma once

#include "../tools/flag_values.hpp"

namespace optex_bench {

using optex::flags::whole_number;

}  // namespace optex_bench

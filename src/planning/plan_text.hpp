// How the planner writes numbers in its report and its errors: a value in full
// precision, a duration in s, ms or us, an interval in one unit.
#pragma once

#include <string>

namespace optex::detail {

std::string number(double v);
std::string duration(double seconds);
std::string interval(double low, double high);

}  // namespace optex::detail

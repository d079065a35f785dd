// The Adam optimizer; it lives in optimizers/adam.hpp with the other base optimizers.
#pragma once

#include "optex/optimizers/adam.hpp"

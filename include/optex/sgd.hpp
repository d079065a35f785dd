// The SGD optimizer; it lives in optimizers/sgd.hpp with the other base optimizers.
#pragma once

#include "optex/optimizers/sgd.hpp"

// optex: first-order optimizers made approximately parallel (OptEx, Shu et al.,
// NeurIPS 2024). Include this one header for the whole public API.
#pragma once

#include "optex/adam.hpp"
#include "optex/batch.hpp"
#include "optex/engine.hpp"
#include "optex/gp_estimator.hpp"
#include "optex/gradient_history.hpp"
#include "optex/iteration_info.hpp"
#include "optex/kernel.hpp"
#include "optex/lengthscale_selection.hpp"
#include "optex/minimize.hpp"
#include "optex/objective.hpp"
#include "optex/optimizer.hpp"
#include "optex/options.hpp"
#include "optex/problems.hpp"
#include "optex/progress_bar.hpp"
#include "optex/random.hpp"
#include "optex/sgd.hpp"
#include "optex/thread_pool.hpp"
#include "optex/version.hpp"

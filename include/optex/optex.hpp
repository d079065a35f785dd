// optex: first-order optimizers made approximately parallel (OptEx, Shu et al.,
// NeurIPS 2024). Include this one header for the whole public API; the MPI
// and NCCL communicators have their own headers (mpi_communicator.hpp,
// nccl_communicator.hpp) and targets (optex::mpi, optex::nccl).
#pragma once

#include "optex/distributed/communicator.hpp"
#include "optex/distributed/data_parallel.hpp"
#include "optex/distributed/distributed_engine.hpp"
#include "optex/distributed/distributed_minimize.hpp"
#include "optex/distributed/in_process_communicator.hpp"
#include "optex/distributed/point_split.hpp"
#include "optex/engine/batch.hpp"
#include "optex/engine/coordinate_range.hpp"
#include "optex/engine/engine.hpp"
#include "optex/engine/iteration_info.hpp"
#include "optex/engine/magnitude_bound.hpp"
#include "optex/engine/minimize.hpp"
#include "optex/engine/objective.hpp"
#include "optex/engine/options.hpp"
#include "optex/estimator/covariance.hpp"
#include "optex/estimator/gp_estimator.hpp"
#include "optex/estimator/gradient_history.hpp"
#include "optex/estimator/lengthscale_selection.hpp"
#include "optex/optimizers/optimizer.hpp"
#include "optex/optimizers/optimizer_ranges.hpp"
#include "optex/planning/plan.hpp"
#include "optex/planning/round_cost.hpp"
#include "optex/problems/problems.hpp"
#include "optex/util/progress_bar.hpp"
#include "optex/util/random.hpp"
#include "optex/util/thread_pool.hpp"
#include "optex/version.hpp"

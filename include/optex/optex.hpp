// optex: first-order optimizers made approximately parallel (OptEx, Shu et al.,
// NeurIPS 2024). Include this one header for the whole public API; the MPI
// and NCCL communicators have their own headers (mpi_communicator.hpp,
// nccl_communicator.hpp) and targets (optex::mpi, optex::nccl).
#pragma once

#include "optex/batch.hpp"
#include "optex/communicator.hpp"
#include "optex/coordinate_range.hpp"
#include "optex/covariance.hpp"
#include "optex/data_parallel.hpp"
#include "optex/distributed_engine.hpp"
#include "optex/distributed_minimize.hpp"
#include "optex/engine.hpp"
#include "optex/gp_estimator.hpp"
#include "optex/gradient_history.hpp"
#include "optex/in_process_communicator.hpp"
#include "optex/iteration_info.hpp"
#include "optex/lengthscale_selection.hpp"
#include "optex/magnitude_bound.hpp"
#include "optex/minimize.hpp"
#include "optex/objective.hpp"
#include "optex/optimizer.hpp"
#include "optex/optimizer_ranges.hpp"
#include "optex/options.hpp"
#include "optex/plan.hpp"
#include "optex/point_split.hpp"
#include "optex/problems.hpp"
#include "optex/progress_bar.hpp"
#include "optex/random.hpp"
#include "optex/round_cost.hpp"
#include "optex/thread_pool.hpp"
#include "optex/version.hpp"

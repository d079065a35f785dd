// The options of a run that resumes from a snapshot or a checkpoint, on a
// device and history precision the caller may choose (Engine::from_snapshot,
// Engine::load). Private to the library.
#pragma once

#include <optional>
#include <string>

#include "optex/backend/device.hpp"
#include "optex/engine/options.hpp"

namespace optex::detail {

// The caller's arguments on their own, before anything is read: a device
// this process has, a history precision that is one, and a pair that works
// together. Throws std::invalid_argument naming the argument.
void check_resume_arguments(std::optional<Device> device, std::optional<Precision> precision);

// The stored options with the arguments applied: `device` moves the run
// (a bf16 history becomes fp32, exactly, on the CPU) and `precision`
// changes the history's storage. Throws std::invalid_argument naming
// history_precision when the result would keep bf16 on the CPU (the
// arguments' fault, never the stored options').
Options resumed_options(const Options& stored, std::optional<Device> device,
                        std::optional<Precision> precision);

// Why this process cannot run on the options' device ("cuda:3 is not
// available (this process sees 1 CUDA device(s))"), "" when it can.
std::string unavailable_device(const Options& options);

}  // namespace optex::detail

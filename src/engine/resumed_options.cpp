#include "engine/resumed_options.hpp"

#include <stdexcept>

namespace optex::detail {

void check_resume_arguments(std::optional<Device> device, std::optional<Precision> precision) {
  if (device) {
    Options o;  // the device's own checks, without the history precision's
    o.device = *device;
    o.validate();
    if (!unavailable_device(o).empty()) {
      throw std::invalid_argument("device: " + unavailable_device(o) +
                                  "; pass another device to resume on");
    }
  }
  if (precision) {
    Options o;
    o.device = Device::cuda(0);  // whether the value is a Precision at all
    o.history_precision = *precision;
    o.validate();
    if (device) {  // both given: the pair must work
      o.device = *device;
      o.validate();
    }
  }
}

Options resumed_options(const Options& stored, std::optional<Device> device,
                        std::optional<Precision> precision) {
  Options options = stored;
  if (device) {
    options.device = *device;
    // bf16 values are exact in fp32: a bf16 history moves to the CPU unchanged.
    if (!device->is_cuda()) options.history_precision = Precision::fp32;
  }
  if (precision) options.history_precision = *precision;
  if (options.history_precision != Precision::fp32 && !options.device.is_cuda()) {
    throw std::invalid_argument(std::string("history_precision: ") +
                                precision_name(options.history_precision) +
                                " storage is available on CUDA devices only, got device cpu");
  }
  return options;
}

std::string unavailable_device(const Options& options) {
  if (!options.device.is_cuda() || options.device.index < cuda_device_count()) return {};
  return options.device.name() + " is not available (this process sees " +
         std::to_string(cuda_device_count()) + " CUDA device(s))";
}

}  // namespace optex::detail

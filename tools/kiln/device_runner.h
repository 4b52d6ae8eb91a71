// How `kiln run` and `kiln bench` run a package on a device other than the
// host's cores (a cuda package, or --device sim|cuda): through a
// ModelRunner, as a production caller would, so that each run includes
// moving the inputs to the device and the outputs back.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/executor.h"
#include "kiln/model_runner.h"
#include "kiln/step_trace.h"

namespace kiln::cli {

// The device kind `kiln run/bench` should use: --device when given, else
// the package's target when it is not cpu, else nullopt (the host executor).
std::optional<DeviceKind> deviceFor(const std::string& package, const std::string& model,
                                    const std::string& device_option);

class DeviceRunner {
 public:
  DeviceRunner(const std::string& package, const std::string& model, DeviceKind kind, bool flush_denormals = true);

  const std::vector<TensorSlot>& inputs() const { return inputs_; }
  const std::vector<TensorSlot>& outputs() const { return outputs_; }
  // One synchronous execution: `inputs[i]` and `outputs[i]` are host
  // buffers of the slots' sizes.
  void run(std::span<const std::byte* const> inputs, std::span<std::byte* const> outputs);

 private:
  std::unique_ptr<ModelRunner> runner_;
  std::vector<TensorSlot> inputs_;
  std::vector<TensorSlot> outputs_;
  InputMemoryView input_view_;
  OutputMemoryView output_view_;
};

// Runs the package `runs` times on a device of `kind` with `inputs` (host
// bytes, in input order), one event per step in `trace`: an Executable
// driven directly (no ModelRunner), each step waited for, for
// `kiln bench --profile`.
void traceOnDevice(const std::string& package, const std::string& model, DeviceKind kind,
                   const std::vector<std::span<const std::byte>>& inputs, int runs, StepTrace& trace);

}  // namespace kiln::cli

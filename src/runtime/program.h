// The executor's prepared form of a step program, and the loop that runs
// it, sub-programs (If, Loop, Scan) included.
//
// Every tensor a step touches is a TensorView in one table owned by the
// executor; steps refer to their views by position, so that binding a
// call's buffers or an arena only rewrites data pointers. Running never
// allocates: control flow copies between views that were all planned at
// compile time (a sub-program's values live in its step's workspace).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/kernel.h"
#include "kernels/view_memory.h"

namespace kiln {

struct ControlFlow;

// One prepared step: a kernel, or control flow run by ProgramRunner.
struct Step {
  RunKernel run = nullptr;  // null for control flow
  std::unique_ptr<KernelState> state;
  uint32_t first_input = 0;
  uint32_t input_count = 0;
  uint32_t first_output = 0;
  uint32_t output_count = 0;
  std::unique_ptr<ControlFlow> control;
};

// A sub-program: its steps and the views of its formal inputs and outputs.
struct Program {
  std::vector<Step> steps;
  std::vector<uint32_t> input_views;
  std::vector<uint32_t> output_views;
};

struct ControlFlow {
  enum class Kind { kIf, kLoop, kScan };
  Kind kind = Kind::kIf;
  std::vector<const Program*> programs;  // If: then, else; Loop, Scan: body
  uint32_t inputs = 0;                   // the node's inputs (captured values follow them)
  uint32_t outputs = 0;                  // the node's outputs (the workspace follows them)
  // Scan only: how many inputs are scanned, and per scanned input / scan
  // output its axis (normalised) and whether it runs backwards.
  uint32_t scan_inputs = 0;
  std::vector<uint32_t> input_axes, output_axes;
  std::vector<uint8_t> input_reverse, output_reverse;
};

// Runs steps over a view table. Throws UsageError only when a Loop ends
// before the number of iterations its scan outputs were planned for.
// Control flow reaches the views' bytes through `memory`: the host's, or a
// device's (kernels/view_memory.h).
class ProgramRunner {
 public:
  ProgramRunner(std::vector<TensorView>& views, uint64_t& steps_run, void* queue = nullptr,
                ViewMemory& memory = hostViewMemory())
      : views_(views), steps_run_(steps_run), queue_(queue), memory_(memory) {}

  void run(const std::vector<Step>& steps) {
    for (const Step& step : steps) runStep(step);
  }

  void runStep(const Step& step) {
    if (step.run != nullptr) {
      step.run(KernelCall{&views_[step.first_input], step.input_count, &views_[step.first_output], step.output_count,
                          step.state.get(), queue_});
    } else {
      runControlFlow(step);
    }
    ++steps_run_;
  }

 private:
  void runControlFlow(const Step& step);
  void runIf(const Step& step);
  void runLoop(const Step& step);
  void runScan(const Step& step);

  std::vector<TensorView>& views_;
  uint64_t& steps_run_;
  void* queue_;  // KernelCall::queue
  ViewMemory& memory_;
};

// The ControlFlow of a kiln.If / kiln.Loop / kiln.Scan step, checked
// against its prepared sub-programs and the view table `views` (which the
// step's inputs and outputs, and the sub-programs' views, index): every copy
// the step will make between the node's tensors and the sub-programs' must
// move as many bytes as its destination holds. UsageError when they do not
// fit together (a crafted package: the copies would write past their
// destination).
std::unique_ptr<ControlFlow> prepareControlFlow(const std::string& kernel, const ParamMap& params,
                                                std::vector<const Program*> programs,
                                                std::span<const TensorView> views, const Step& step);

bool isControlFlowKernel(const std::string& kernel);

}  // namespace kiln

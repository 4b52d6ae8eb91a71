// One training step as graph nodes: the gradients of the loss (autodiff.h)
// and the optimiser's update of each trainable weight (kiln/training.h).
// The compiler lowers each update into a kiln.Assign step that writes the
// new value over its variable at the end of the main program.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kiln/graph.h"
#include "kiln/training.h"

namespace kiln {

struct TrainingStep {
  // (variable name, the value that replaces it), weights and optimiser state.
  std::vector<std::pair<std::string, ValueId>> updates;
  // The optimiser's state, new graph inputs that become variables, with
  // their initial values (zeros).
  std::map<std::string, ConstantPtr> state;
};

// `weights`: graph inputs standing for the trainable weights (the compiler
// turned them into inputs so that nothing folds them). Adds the nodes and
// the state inputs.
// With `accumulation` > 1 the gradients are summed into state variables and
// the optimiser's updates (of the weights and of its state) take effect only
// on every accumulation-th run, with the mean of the summed gradients.
// With `all_reduce` ("domain.name", TrainingOptions::gradient_all_reduce)
// the gradients go through that op, flattened into one buffer, before
// anything uses them (UsageError when no such op is registered).
TrainingStep appendTrainingStep(Graph& graph, const std::map<std::string, int64_t>& opsets, ValueId loss,
                                const std::vector<ValueId>& weights, const Optimizer& optimizer,
                                uint32_t accumulation = 1, const std::string& all_reduce = "");

}  // namespace kiln

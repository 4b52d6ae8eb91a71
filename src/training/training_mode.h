// Putting a model into training mode (PyTorch's model.train()) before its
// gradients are taken: every BatchNormalization normalises with its batch's
// own statistics and updates its running mean and variance, and every
// Dropout drops, with a new mask each run from a seeded stream.
//
// Thread safety: changes `graph`; none.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

// The initializers that are BatchNormalization running statistics (inputs
// 3 and 4): a training package keeps them as variables it updates, never as
// weights it trains.
std::vector<std::string> runningStatistics(const Graph& graph);

// Sets training mode on the graph's BatchNormalization and Dropout nodes.
// Returns (variable, new value) for each running statistic that is a graph
// input (the compiler made it a variable): the BatchNormalization's
// updated mean and variance outputs. Dropout streams start from `seed`
// mixed with the node's position, or from a seed attribute the model
// gives, and move on each run.
std::vector<std::pair<std::string, ValueId>> enterTrainingMode(Graph& graph, uint64_t seed);

// Gives every training Dropout (training_mode a constant true) its mask
// output, which its gradient multiplies by.
void exposeDropoutMasks(Graph& graph);

}  // namespace kiln

// Folding of inference-mode BatchNormalization into the Conv that feeds it.
//
// BatchNormalization(Conv(x, W, B)) with constant parameters is a Conv with
// rescaled weights: per output channel m,
//   a[m]  = scale[m] / sqrt(var[m] + epsilon)
//   W'[m] = W[m] * a[m]
//   B'[m] = (B[m] - mean[m]) * a[m] + beta[m]      (B = 0 when the Conv has none)
// The pass adds W' and B' as new initializers, points the Conv at them, sends
// the BatchNormalization's readers to the Conv's output and removes the
// BatchNormalization. Arithmetic is done in double, results stored as f32.
//
// A fold happens only when all of these hold: both nodes are in the default
// domain; the BatchNormalization has exactly one output and training_mode is
// absent or 0; its input X is the Conv's output, which nothing else reads and
// which is not a graph output; its own output is not a graph output (folding
// would rename the model's output); W, the Conv's bias (if any) and scale, B,
// mean, var are f32 initializers with one element per output channel.
// ConvTranspose (whose weights are [C, M/group, k...]) is not handled.
#pragma once

#include <cstddef>

#include "kiln/graph.h"

namespace kiln {

// Folds every eligible BatchNormalization; returns the number folded. The
// old initializers are left in place (the compiler drops unused ones).
size_t foldBatchNormIntoConv(Graph& graph);

// Every other inference-mode BatchNormalization with f32 initializer
// parameters (after a ConvTranspose, an Add, a Concat...) becomes
// Mul(x, a) then Add(., b) with a and b of shape [C, 1, ...] (a as above,
// b = beta - mean * a): elementwise work that the channels-last pass lets
// through and elementwise fusion merges with its neighbours, instead of a
// step of its own in NCHW. The Add's output keeps the BatchNormalization's
// output name. Returns the number rewritten.
size_t rewriteBatchNormAsScaleShift(Graph& graph);

}  // namespace kiln

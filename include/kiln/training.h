// Training options for the compiler (docs/training.md): a package whose
// main program is one training step (forward, backward, the optimiser's
// update written over the variables), driven by a Session.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// The update rule, with PyTorch's and optax's meanings of the numbers:
//   kSgd:   g += weight_decay * w; v = momentum * v + g (when momentum > 0);
//           w -= learning_rate * (v or g)
//   kAdam:  g += weight_decay * w; m, v the moments; w -= learning_rate *
//           m_hat / (sqrt(v_hat) + epsilon) (bias-corrected by the step)
//   kAdamW: Adam without the g term, and w -= learning_rate * weight_decay
//           * w decoupled (in the same update)
struct Optimizer {
  enum class Kind { kSgd, kAdam, kAdamW };
  Kind kind = Kind::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
};

// The all-reduce of kiln's own: over the replicas of one HostSession.
inline constexpr const char* kReplicaAllReduce = "kiln.replicas.AllReduceMean";
// The metadata option in which a training package records its
// gradient_all_reduce.
inline constexpr const char* kGradientAllReduceOption = "training.gradient_all_reduce";

struct TrainingOptions {
  std::string loss;                    // the one-element loss value
  std::vector<std::string> trainable;  // weights to train; empty: every float initializer
  Optimizer optimizer;
  // The optimiser steps once every this many main-program runs, with the
  // mean of their gradients (micro-batches summing to a larger batch); the
  // runs between only accumulate.
  uint32_t gradient_accumulation = 1;
  // Where the Dropout nodes' random streams start (each node its own,
  // mixed with its position; a seed attribute in the model wins). Each run
  // draws a new mask; the same package gives the same masks in every
  // session.
  uint64_t seed = 0;
  // Data-parallel training: "domain.name" of a registered op (a plugin's or
  // a host callback's: one f32 input, one output of its shape) that
  // returns the mean of its input over the processes training together.
  // The step sends every gradient through it in one flat buffer, between
  // the backward pass and the optimiser, so each process applies the same
  // update. kReplicaAllReduce averages over the replicas of one HostSession
  // (replication_factor); kiln.distributed provides one over MPI. Empty:
  // one process, one replica.
  std::string gradient_all_reduce{};
};

}  // namespace kiln

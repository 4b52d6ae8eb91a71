// An ONNX Loop run on the host, iteration by iteration.
//
// A Loop whose body changes shape from one iteration to the next (a decoder
// that writes step i of a buffer through Slice(buffer, i, i + 1)) cannot be
// planned as one program. DynamicExecutor then runs it here: the body is a
// model of its own (src/compiler/runtime_shapes.h, LoopStage), called once
// per iteration through `BodyCall` with the iteration number, the condition,
// the carried values and the values it reads from outside, and specialized
// on each call's signature like any model with run-time shapes.
//
// Semantics (ONNX Loop): the body runs while the iteration number is below
// the trip count (when given) and the condition holds (the Loop's input,
// then each iteration's output); carried values pass from one iteration's
// outputs to the next one's inputs, and each scan output is stacked along a
// new first axis. Carried values the body hands back unchanged keep their
// buffer. Buffers are the host's own (std::vector, reused from iteration to
// iteration once they are large enough): this path allocates, unlike a
// compiled program.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "kiln/dynamic_executor.h"
#include "kiln/tensor_info.h"

namespace kiln {

struct HostTensor {
  TensorInfo info;
  std::vector<std::byte> bytes;
};

// A tensor read in place: `data` holds info.sizeInBytes() bytes.
struct TensorRef {
  TensorInfo info;
  const std::byte* data = nullptr;
};

struct HostLoopSpec {
  TensorInfo iteration_info;  // i64 scalar (or [1]) as the body declares it
  TensorInfo condition_info;  // bool scalar (or [1])
  std::vector<bool> unchanged;       // per carried value
  std::vector<size_t> body_outputs;  // per output of the body model: its index among the Loop body's outputs
  std::vector<TensorInfo> scans;     // per scan output: one iteration's, as the body declares it
};

// One call of the body model, its outputs written where `allocate` says.
using BodyCall =
    std::function<void(std::span<const TensorInfo>, std::span<const std::byte* const>, const OutputAllocator&)>;

// trip_count and condition: nullptr when the Loop has none. `outputs`
// receives the final carried values, then the scan outputs. UsageError when
// a scan output changes shape between iterations, or when the trip count
// or condition is not one element of i64 or bool.
void runHostLoop(const HostLoopSpec& spec, const TensorRef* trip_count, const TensorRef* condition,
                 std::span<const TensorRef> initial, std::span<const TensorRef> captures, const BodyCall& body,
                 std::vector<HostTensor>& outputs);

}  // namespace kiln

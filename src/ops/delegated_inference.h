// Inference by another operator's schema: the integer and quantized forms of
// Conv and MatMul (ConvInteger, QLinearConv, MatMulInteger, QLinearMatMul),
// and DeformConv, have the output shape of the plain operator over some of
// their inputs. Rather than repeat those shape rules, their schemas run the
// plain operator's (newest) schema on a scratch node.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ops/op_schema.h"

namespace kiln {

// The output shape that ai.onnx `op` infers for a node with this node's
// attributes and, as its inputs, this node's inputs `inputs` (in that order;
// an index past the end or of an omitted input passes an omitted input).
// Every input is presented as f32 of its own shape (the plain operators
// require one element type), constants keep their values. Fails as
// `op` would, with this node's name.
std::optional<std::vector<Dim>> delegatedShape(const InferenceContext& context, const std::string& op,
                                               const std::vector<size_t>& inputs);

}  // namespace kiln

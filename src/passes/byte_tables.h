// Chains of 8-bit table steps as one table.
//
// On 8-bit data, a kiln.FusedElementwise step with one input of its output's
// shape computes a function of 256 values, which its kernel tabulates and
// looks up (kernels/cpu/fused_elementwise.cc). A quantized model quantizes
// after every operator, so such steps come in chains: PP-LCNetV3 scales and
// shifts each activation by learned scalars, every op between a
// QuantizeLinear and a DequantizeLinear of its own (94 links of the 194 table
// steps of PP-OCRv4's recognizer). Two table steps in a row are one table,
// the second's applied to the first's, exactly: this pass computes it at
// compile time through the steps' own CPU kernels (the ConstantEvaluator) and
// makes each chain one kiln.Lookup8(x, table) step, whose table is a
// 256-byte initializer of the output's type.
//
// A kiln.QLinearMul or kiln.QLinearAdd of x and a table step of x (SiLU's
// x * Sigmoid(x) and a hard-swish's x * HardSigmoid(x), each quantized: 57
// steps of YOLOv8n, 24 of PP-OCRv4's detector), of two table steps of x, or
// of x and x is a function of x's byte as well: its table is the node's own
// kernel over the 256 bytes and the operands' tables.
//
// A link joins when the first step's output has no other reader and is not
// pinned (pass_helpers.h). A kiln.Lookup8 made here is a table step too, so
// chains of any length become one step.
#pragma once

#include <cstddef>

#include "kiln/graph.h"
#include "passes/constant_folding.h"

namespace kiln {

// Returns the number of steps removed.
size_t composeByteTables(Graph& graph, const ConstantEvaluator& evaluate);

}  // namespace kiln

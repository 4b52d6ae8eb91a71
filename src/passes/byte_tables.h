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

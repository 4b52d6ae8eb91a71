// Helpers shared by the op families' inference functions.
#pragma once

#include <string>
#include <vector>

#include "ops/op_schema.h"

namespace kiln {

// Numpy (multidirectional) broadcasting of the shapes of the given inputs.
// Dimensions are matched from the right; a 1 stretches; two unknown
// dimensions with the same symbol match; a known dimension other than 1
// wins over an unknown one. Fails when two known sizes differ and neither
// is 1. Omitted inputs are skipped.
std::vector<Dim> broadcastInputs(const InferenceContext& context, const std::vector<size_t>& inputs);

// `axis` in [-rank, rank) as a value in [0, rank); fails otherwise.
size_t normalizeAxis(const InferenceContext& context, int64_t axis, size_t rank);

// Output `output` gets the type of input `input`.
void copyInputType(InferenceContext& context, size_t input = 0, size_t output = 0);

// a + b, a - b and a * b for dimension formulas (pads, strides, kernels, repeats,
// blocks), failing the inference when the result overflows int64: a crafted
// attribute or constant must not wrap (issue 12; kiln/tensor_info.h's
// checkedAdd and checkedMultiply).
int64_t addDims(const InferenceContext& context, int64_t a, int64_t b);
int64_t subtractDims(const InferenceContext& context, int64_t a, int64_t b);
int64_t multiplyDims(const InferenceContext& context, int64_t a, int64_t b);

// A dimension computed in floating point (Resize's scales, a float Range's
// length), rounded toward zero; fails unless it is finite and below 2^63.
int64_t dimFromFloat(const InferenceContext& context, double value);

// a / c for a known `a` and c != 0; otherwise unknown.
Dim divided(const Dim& a, int64_t c);

// The product of `dims`, or an unknown Dim when any is unknown; fails when
// it overflows.
Dim productOf(const InferenceContext& context, const std::vector<Dim>& dims);

// The dims of input `index` when its rank is known; nullptr when the input
// is omitted or its rank is unknown. Inference functions use it to produce
// an unknown result instead of failing on what is merely not known yet.
const std::vector<Dim>* knownShape(const InferenceContext& context, size_t index);

// The broadcast of two shapes, by the rule of broadcastInputs; for shapes
// that are not (whole) inputs: Expand's target, MatMul's batch dimensions.
std::vector<Dim> broadcastShapes(const InferenceContext& context, const std::vector<Dim>& a, const std::vector<Dim>& b);

// Each axis normalised by normalizeAxis; fails when an axis repeats.
std::vector<size_t> normalizeAxes(const InferenceContext& context, const std::vector<int64_t>& axes, size_t rank);

// "[batch, 3, ?]", for error messages.
std::string dimsText(const std::vector<Dim>& dims);

}  // namespace kiln

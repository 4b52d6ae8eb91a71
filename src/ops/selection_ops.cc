// Schemas of the selections whose output size depends on the values they
// read (core/selection.h): NonZero, NonMaxSuppression, Compress, Unique. Their outputs have
// an unknown length unless every input is a constant, when inference
// computes it; a model that feeds them computed values runs in stages, the
// op evaluated on the host (compiler/runtime_shapes.h).
#include <fmt/format.h>

#include "core/selection.h"
#include "ops/op_families.h"
#include "ops/op_schema.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

// NonZero(X) -> [rank(X), count] int64.
void inferNonZero(InferenceContext& context) {
  const std::vector<Dim>* in = knownShape(context, 0);
  const Dim rank = in ? Dim::known(static_cast<int64_t>(in->size())) : Dim{};
  Dim count;
  if (const ConstantPtr x = context.dataConstant(0); x && !x->info.shape.empty()) {
    count = Dim::known(static_cast<int64_t>(countNonZero(x->bytes.data(), x->info.dtype, x->info.numElements())));
  }
  context.output(0) = ValueType{DType::kI64, std::vector<Dim>{rank, count}};
}

// The scalar parameter of NonMaxSuppression at `index` (max_output_boxes_
// per_class, iou_threshold, score_threshold): one element of `dtype`.
ConstantPtr scalarParameter(const InferenceContext& context, size_t index, DType dtype, const char* what) {
  if (!context.hasInput(index)) return nullptr;
  const ValueType& type = context.inputType(index);
  if (type.dtype != dtype) context.fail("{} must be {}, got {}", what, dtypeName(dtype), type.toString());
  const ConstantPtr value = context.dataConstant(index);
  if (value && value->info.numElements() != 1) context.fail("{} must hold one value, got {}", what, type.toString());
  return value;
}

// NonMaxSuppression(boxes [B, N, 4], scores [B, C, N], max_output_boxes_
// per_class?, iou_threshold?, score_threshold?) -> selected [count, 3] int64.
void inferNonMaxSuppression(InferenceContext& context) {
  const std::vector<Dim>* boxes = knownShape(context, 0);
  const std::vector<Dim>* scores = knownShape(context, 1);
  if (boxes && (boxes->size() != 3 || ((*boxes)[2].isKnown() && (*boxes)[2].size != 4))) {
    context.fail("boxes must be [batches, boxes, 4], got {}", context.inputType(0).toString());
  }
  if (scores && scores->size() != 3) context.fail("scores must be [batches, classes, boxes], got {}",
                                                  context.inputType(1).toString());
  if (context.inputType(0).dtype != DType::kF32 || context.inputType(1).dtype != DType::kF32) {
    context.fail("boxes and scores must be f32, got {} and {}", context.inputType(0).toString(),
                 context.inputType(1).toString());
  }
  if (boxes && scores) {
    const auto agree = [](const Dim& a, const Dim& b) { return !a.isKnown() || !b.isKnown() || a.size == b.size; };
    if (!agree((*boxes)[0], (*scores)[0]) || !agree((*boxes)[1], (*scores)[2])) {
      context.fail("boxes {} and scores {} disagree on batches or boxes", context.inputType(0).toString(),
                   context.inputType(1).toString());
    }
  }
  const ConstantPtr max_boxes = scalarParameter(context, 2, DType::kI64, "max_output_boxes_per_class");
  const ConstantPtr iou = scalarParameter(context, 3, DType::kF32, "iou_threshold");
  const ConstantPtr score = scalarParameter(context, 4, DType::kF32, "score_threshold");
  Dim count;
  const ConstantPtr box_values = context.dataConstant(0);
  const ConstantPtr score_values = context.dataConstant(1);
  const bool parameters_known = (!context.hasInput(2) || max_boxes) && (!context.hasInput(3) || iou) &&
                                (!context.hasInput(4) || score);
  if (box_values && score_values && parameters_known) {
    const auto bytes = [](const ConstantPtr& c) { return c ? c->bytes.data() : nullptr; };
    const NonMaxSuppressionOptions options = nonMaxSuppressionOptions(
        context.node().intAttribute("center_point_box", 0), bytes(max_boxes), bytes(iou), bytes(score));
    const std::vector<int64_t>& b = box_values->info.shape;
    const std::vector<int64_t>& s = score_values->info.shape;
    if (b[0] != s[0] || b[1] != s[2]) context.fail("boxes and scores disagree on batches or boxes");
    const std::vector<int64_t> selected =
        nonMaxSuppression(reinterpret_cast<const float*>(box_values->bytes.data()),
                          reinterpret_cast<const float*>(score_values->bytes.data()), b[0], s[1], b[1], options);
    count = Dim::known(static_cast<int64_t>(selected.size() / 3));
  }
  context.output(0) = ValueType{DType::kI64, std::vector<Dim>{count, Dim::known(3)}};
}

// The axis attribute of Compress and Unique against `rank`, or nullopt
// when the node has none (the input is flattened).
std::optional<size_t> axisOf(const InferenceContext& context, size_t rank) {
  const auto& attributes = context.node().attributes;
  if (attributes.find("axis") == attributes.end()) return std::nullopt;
  return normalizeAxis(context, context.node().intAttribute("axis", 0), rank);
}

// The number of slices along `axis` (of elements without one), when known;
// fails when the element count overflows 64 bits.
Dim lengthAlong(const InferenceContext& context, const std::vector<Dim>& in, std::optional<size_t> axis) {
  if (axis) return in[*axis];
  Dim length = Dim::known(1);
  for (const Dim& dim : in) {
    length = dim.isKnown() && length.isKnown() ? Dim::known(multiplyDims(context, length.size, dim.size)) : Dim{};
  }
  return length;
}

// Compress(input, condition [n] bool) -> the slices along `axis` (the
// elements of the flattened input without one) whose condition is true.
void inferCompress(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  if (context.inputType(1).dtype != DType::kBool) {
    context.fail("condition must be bool, got {}", context.inputType(1).toString());
  }
  const std::vector<Dim>* in = knownShape(context, 0);
  const std::vector<Dim>* condition = knownShape(context, 1);
  if (condition && condition->size() != 1) context.fail("condition must be 1-D, got {}", context.inputType(1).toString());
  if (!in) {
    context.output(0) = ValueType{dtype, std::nullopt};
    return;
  }
  const std::optional<size_t> axis = axisOf(context, in->size());
  const Dim length = lengthAlong(context, *in, axis);
  Dim count;
  if (const ConstantPtr c = context.dataConstant(1); c && length.isKnown()) {
    count = Dim::known(static_cast<int64_t>(countSelected(reinterpret_cast<const uint8_t*>(c->bytes.data()),
                                                          c->info.numElements(), static_cast<uint64_t>(length.size))));
  }
  std::vector<Dim> out{count};
  if (axis) {
    out = *in;
    out[*axis] = count;
  }
  context.output(0) = ValueType{dtype, out};
}

// Unique(X) -> Y, indices, inverse_indices, counts (outputs 2-4 optional).
void inferUnique(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  std::optional<size_t> axis;
  if (in) axis = axisOf(context, in->size());
  Dim unique, length;
  if (in) length = lengthAlong(context, *in, axis);
  if (const ConstantPtr x = context.dataConstant(0); x && in) {
    if (x->info.numElements() == 0) {
      // Empty slices are all equal: one unique slice, or none along an empty
      // axis (without sorting out a vast axis of them).
      const int64_t slices = axis ? x->info.shape[*axis] : 0;
      unique = Dim::known(slices > 0 ? 1 : 0);
    } else {
      const AxisSplit s = splitAround(x->info.shape, axis);
      const UniqueSlices found = uniqueSlices(x->bytes.data(), x->info.dtype, s.outer, s.length, s.inner,
                                              context.node().intAttribute("sorted", 1) != 0);
      unique = Dim::known(static_cast<int64_t>(found.first.size()));
    }
  }
  std::vector<Dim> y{unique};
  if (in && axis) {
    y = *in;
    y[*axis] = unique;
  }
  context.output(0) = in ? ValueType{dtype, y} : ValueType{dtype, std::nullopt};
  const std::vector<Dim> per_unique{unique}, per_slice{length};
  if (context.outputCount() > 1) context.output(1) = ValueType{DType::kI64, per_unique};
  if (context.outputCount() > 2) context.output(2) = ValueType{DType::kI64, per_slice};
  if (context.outputCount() > 3) context.output(3) = ValueType{DType::kI64, per_unique};
}

void add(OpRegistry& registry, const std::string& op, int64_t since, size_t min_inputs, size_t max_inputs,
         InferFunction infer, size_t max_outputs = 1) {
  registry.add(OpSchema{"", op, since, min_inputs, max_inputs, 1, max_outputs, std::move(infer)});
}

}  // namespace

void registerSelectionOps(OpRegistry& registry) {
  add(registry, "NonZero", 9, 1, 1, inferNonZero);
  add(registry, "NonMaxSuppression", 10, 2, 5, inferNonMaxSuppression);
  add(registry, "Compress", 9, 2, 2, inferCompress);  // negative axes from 11
  add(registry, "Unique", 11, 1, 1, inferUnique, 4);
}

}  // namespace kiln

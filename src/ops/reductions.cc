// Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd,
// ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceSumSquare, and
// ArgMax/ArgMin.
//
// The reduced axes are an attribute until opset 12 for ReduceSum and 17 for
// the others, then an optional input (with noop_with_empty_axes). Reduced
// axes become 1 with keepdims (the default) and disappear without it.
#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;

// The reduction of input 0 over `axes`; nullopt axes means "given but not
// constant"; empty axes reduce everything, or nothing with
// noop_with_empty_axes.
void reduceOver(InferenceContext& context, const std::optional<Ints>& axes, std::optional<size_t> axes_count) {
  const DType dtype = context.inputType(0).dtype;
  const bool keep_dims = context.node().intAttribute("keepdims", 1) != 0;
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in) {
    context.output(0) = ValueType{dtype, std::nullopt};
    return;
  }
  if (!axes) {
    // Which axes go is unknown; how many is known when the axes' length is.
    std::optional<std::vector<Dim>> out;
    if (keep_dims) {
      out = std::vector<Dim>(in->size());
    } else if (axes_count && *axes_count > 0 && *axes_count <= in->size()) {
      out = std::vector<Dim>(in->size() - *axes_count);
    }
    context.output(0) = ValueType{dtype, out};
    return;
  }
  std::vector<bool> reduced(in->size(), axes->empty());
  if (axes->empty() && context.node().intAttribute("noop_with_empty_axes", 0) != 0) {
    copyInputType(context);
    return;
  }
  for (size_t axis : normalizeAxes(context, *axes, in->size())) reduced[axis] = true;
  std::vector<Dim> out;
  for (size_t i = 0; i < in->size(); ++i) {
    if (!reduced[i]) {
      out.push_back((*in)[i]);
    } else if (keep_dims) {
      out.push_back(Dim::known(1));
    }
  }
  context.output(0) = ValueType{dtype, out};
}

void reduceWithAttribute(InferenceContext& context) {
  reduceOver(context, context.node().intsAttribute("axes", {}), std::nullopt);
}

void reduceWithInput(InferenceContext& context) {
  if (!context.hasInput(1)) return reduceOver(context, Ints{}, std::nullopt);
  const std::vector<Dim>* shape = knownShape(context, 1);
  if (shape && shape->size() != 1) context.fail("the axes (input 1) must be 1-D, found {}", dimsText(*shape));
  const DType axes_type = context.inputType(1).dtype;
  if (axes_type != DType::kI64) context.fail("the axes (input 1) must be int64, found {}", dtypeName(axes_type));
  std::optional<size_t> count;
  if (shape && (*shape)[0].isKnown()) count = static_cast<size_t>((*shape)[0].size);
  reduceOver(context, context.constantInts(1), count);
}

// ArgMax/ArgMin: the i64 index along `axis`, kept as 1 or dropped.
void argReduce(InferenceContext& context) {
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in) {
    context.output(0) = ValueType{DType::kI64, std::nullopt};
    return;
  }
  const size_t axis = normalizeAxis(context, context.node().intAttribute("axis", 0), in->size());
  std::vector<Dim> out = *in;
  if (context.node().intAttribute("keepdims", 1) != 0) {
    out[axis] = Dim::known(1);
  } else {
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(axis));
  }
  context.output(0) = ValueType{DType::kI64, out};
}

void add(OpRegistry& registry, const std::string& op, int64_t since, size_t min_inputs, size_t max_inputs,
         InferFunction infer) {
  registry.add(OpSchema{"", op, since, min_inputs, max_inputs, 1, 1, std::move(infer)});
}

}  // namespace

void registerReductionOps(OpRegistry& registry) {
  add(registry, "ReduceSum", 1, 1, 1, reduceWithAttribute);
  add(registry, "ReduceSum", 13, 1, 2, reduceWithInput);
  for (const char* op : {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
                         "ReduceLogSumExp", "ReduceSumSquare"}) {
    add(registry, op, 1, 1, 1, reduceWithAttribute);
    add(registry, op, 18, 1, 2, reduceWithInput);
  }
  for (const char* op : {"ArgMax", "ArgMin"}) add(registry, op, 1, 1, 1, argReduce);  // select_last_index from 12
}

}  // namespace kiln

// The numeric operators of the ai.onnx.ml domain: ArrayFeatureExtractor and
// Binarizer (ml opset 1) and TreeEnsemble (ml opset 5).
//
// ArrayFeatureExtractor(X, Y) selects elements of X's last axis by the
// indices in Y: [..., F] -> [..., count(Y)], a 1-D X giving [1, count(Y)]
// (as onnxruntime and the ONNX reference do). Binarizer keeps X's type and
// shape. TreeEnsemble maps [N, F] to [N, n_targets]; its tree is held in
// attributes, checked here so that a malformed ensemble fails at compile
// time with the attribute's name.
#include <algorithm>
#include <string>
#include <variant>

#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

constexpr const char* kMl = "ai.onnx.ml";

void arrayFeatureExtractor(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  if (dtype != DType::kF32 && dtype != DType::kF64 && dtype != DType::kI64 && dtype != DType::kI32) {
    context.fail("X must be f32, f64, i64 or i32, found {}", dtypeName(dtype));
  }
  if (context.inputType(1).dtype != DType::kI64) {
    context.fail("Y (the indices) must be i64, found {}", dtypeName(context.inputType(1).dtype));
  }
  context.output(0) = ValueType{dtype, std::nullopt};
  const std::vector<Dim>* x = knownShape(context, 0);
  const std::vector<Dim>* y = knownShape(context, 1);
  if (!x || !y) return;
  if (x->empty()) context.fail("X must have rank 1 or more, found a scalar");
  std::vector<Dim> out = x->size() == 1 ? std::vector<Dim>{Dim::known(1)} : std::vector<Dim>(x->begin(), x->end() - 1);
  out.push_back(productOf(context, *y));
  context.output(0) = ValueType{dtype, std::move(out)};
}

void binarizer(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  if (dtype != DType::kF32 && dtype != DType::kF64 && dtype != DType::kI64 && dtype != DType::kI32) {
    context.fail("X must be f32, f64, i64 or i32, found {}", dtypeName(dtype));
  }
  copyInputType(context);
}

// A tensor attribute, or nullptr when absent; fails when of another kind.
ConstantPtr tensorAttribute(const InferenceContext& context, const std::string& name, bool required) {
  const auto it = context.node().attributes.find(name);
  if (it == context.node().attributes.end()) {
    if (required) context.fail("attribute '{}' is required", name);
    return nullptr;
  }
  const auto* tensor = std::get_if<ConstantPtr>(&it->second);
  if (tensor == nullptr) context.fail("attribute '{}' must be a tensor", name);
  if ((*tensor)->info.shape.size() != 1) context.fail("attribute '{}' must be 1-D", name);
  return *tensor;
}

std::vector<int64_t> intsAttribute(const InferenceContext& context, const std::string& name, bool required) {
  if (required && !context.node().hasAttribute(name)) context.fail("attribute '{}' is required", name);
  return context.node().intsAttribute(name, {});
}

// Checks that the nodes_* and leaf_* attributes agree (one entry per interior
// node, one per leaf, indices in range), and returns the number of targets.
int64_t checkTreeEnsemble(const InferenceContext& context, DType dtype) {
  const ConstantPtr splits = tensorAttribute(context, "nodes_splits", true);
  const ConstantPtr modes = tensorAttribute(context, "nodes_modes", true);
  const ConstantPtr weights = tensorAttribute(context, "leaf_weights", true);
  const ConstantPtr members = tensorAttribute(context, "membership_values", false);
  for (const auto& [name, tensor] : {std::pair{"nodes_splits", splits}, {"leaf_weights", weights}, {"membership_values", members}}) {
    if (tensor && tensor->info.dtype != dtype) {
      context.fail("attribute '{}' must have X's type {}, found {}", name, dtypeName(dtype), dtypeName(tensor->info.dtype));
    }
  }
  if (modes->info.dtype != DType::kU8) context.fail("attribute 'nodes_modes' must be u8, found {}", dtypeName(modes->info.dtype));
  const int64_t nodes = splits->info.shape[0];
  const int64_t leaves = weights->info.shape[0];
  if (modes->info.shape[0] != nodes) context.fail("nodes_modes has {} entries, nodes_splits {}", modes->info.shape[0], nodes);
  for (const char* name : {"nodes_featureids", "nodes_truenodeids", "nodes_falsenodeids", "nodes_trueleafs",
                           "nodes_falseleafs"}) {
    const auto values = intsAttribute(context, name, true);
    if (static_cast<int64_t>(values.size()) != nodes) context.fail("{} has {} entries, nodes_splits {}", name, values.size(), nodes);
  }
  if (context.node().hasAttribute("nodes_missing_value_tracks_true") &&
      static_cast<int64_t>(intsAttribute(context, "nodes_missing_value_tracks_true", false).size()) != nodes) {
    context.fail("nodes_missing_value_tracks_true needs one entry per node ({})", nodes);
  }
  const auto targets = intsAttribute(context, "leaf_targetids", true);
  if (static_cast<int64_t>(targets.size()) != leaves) {
    context.fail("leaf_targetids has {} entries, leaf_weights {}", targets.size(), leaves);
  }
  const int64_t largest = targets.empty() ? -1 : *std::max_element(targets.begin(), targets.end());
  const int64_t n_targets = context.node().intAttribute("n_targets", largest + 1);
  for (int64_t t : targets) {
    if (t < 0 || t >= n_targets) context.fail("leaf target id {} is outside [0, n_targets = {})", t, n_targets);
  }
  const auto roots = intsAttribute(context, "tree_roots", true);
  for (int64_t r : roots) {
    if (r < 0 || r >= nodes) context.fail("tree root {} is not one of the {} nodes", r, nodes);
  }
  const int64_t aggregate = context.node().intAttribute("aggregate_function", 1);
  const int64_t post = context.node().intAttribute("post_transform", 0);
  if (aggregate < 0 || aggregate > 3) context.fail("aggregate_function {} is not 0 to 3", aggregate);
  if (post < 0 || post > 4) context.fail("post_transform {} is not 0 to 4", post);
  return n_targets;
}

void treeEnsemble(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  if (dtype != DType::kF32 && dtype != DType::kF64) {  // ONNX also allows f16; kiln does not (yet)
    context.fail("X must be f32 or f64 (f16 is not supported), found {}", dtypeName(dtype));
  }
  const int64_t n_targets = checkTreeEnsemble(context, dtype);
  context.output(0) = ValueType{dtype, std::nullopt};
  const std::vector<Dim>* x = knownShape(context, 0);
  if (!x) return;
  if (x->size() != 2) context.fail("X must be 2-D [N, F], found {}", dimsText(*x));
  context.output(0) = ValueType{dtype, std::vector<Dim>{(*x)[0], Dim::known(n_targets)}};
}

}  // namespace

void registerMlOps(OpRegistry& registry) {
  registry.add(OpSchema{kMl, "ArrayFeatureExtractor", 1, 2, 2, 1, 1, arrayFeatureExtractor});
  registry.add(OpSchema{kMl, "Binarizer", 1, 1, 1, 1, 1, binarizer});
  registry.add(OpSchema{kMl, "TreeEnsemble", 5, 1, 1, 1, 1, treeEnsemble});
}

}  // namespace kiln

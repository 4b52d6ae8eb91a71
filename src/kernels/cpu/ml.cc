// The numeric ai.onnx.ml kernels on the CPU: ArrayFeatureExtractor,
// Binarizer and TreeEnsemble (ml opset 5), following onnx/reference/ops/
// aionnxml and, where the reference is silent (TreeEnsemble's post_transform,
// out-of-range indices), onnxruntime.
//
// TreeEnsemble's prepare turns the nodes_* / leaf_* attributes into one flat
// array of nodes (a branch refers to a node or to a leaf) and checks that
// every tree is finite and every index in range, so that run only walks.
// Values are compared and accumulated in double (exact for f32 inputs).
// Aggregation: SUM, AVERAGE (sum / number of trees), MIN and MAX (a target
// no leaf reaches keeps the largest / lowest value of the type, as the ONNX
// reference has it). post_transform: NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO
// (softmax over the nonzero scores, zeros stay zero) and PROBIT
// (sqrt(2) * erfinv(2p - 1)), as onnxruntime applies them.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kernel_checks.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;
using checks::typeText;

// ------------------------------------------------------ ArrayFeatureExtractor

struct FeatureExtractorState final : KernelState {
  int64_t rows = 0, features = 0, count = 0;
  size_t element_size = 0;
};

std::unique_ptr<KernelState> prepareFeatureExtractor(const KernelSetup& setup) {
  constexpr std::string_view op = "ArrayFeatureExtractor";
  checks::expectCounts(op, setup, 2, 2, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& indices = setup.inputs[1];
  if (x.dtype != DType::kF32 && x.dtype != DType::kF64 && x.dtype != DType::kI64 && x.dtype != DType::kI32) {
    throw UsageError(fmt::format("{}: no kernel for {} X (supports f32, f64, i64, i32)", op, typeText(x)));
  }
  checks::expectDType(op, "Y (the indices)", indices, DType::kI64);
  if (x.shape.empty()) throw UsageError(fmt::format("{}: X must have rank 1 or more, found {}", op, typeText(x)));
  auto s = std::make_unique<FeatureExtractorState>();
  s->features = x.shape.back();
  s->rows = s->features == 0 ? 0 : checks::elementCount(x.shape) / s->features;
  s->count = checks::elementCount(indices.shape);
  s->element_size = dtypeSize(x.dtype);
  if (const std::byte* constant = setup.constants[1]) {
    for (int64_t i = 0; i < s->count; ++i) {
      int64_t index;
      std::memcpy(&index, constant + i * 8, 8);
      if (index < 0 || index >= s->features) {
        throw UsageError(fmt::format("{}: index {} is out of range for the {} features", op, index, s->features));
      }
    }
  }
  Ints out = x.shape.size() == 1 ? Ints{1} : Ints(x.shape.begin(), x.shape.end() - 1);
  out.push_back(s->count);
  checks::expectOutput(op, setup, 0, x.dtype, out);
  return s;
}

void runFeatureExtractor(const KernelCall& call) {
  const auto& s = static_cast<const FeatureExtractorState&>(*call.state);
  const std::byte* x = call.inputs[0].data;
  const auto* indices = call.inputs[1].as<const int64_t>();
  std::byte* y = call.outputs[0].data;
  const size_t size = s.element_size;
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t j = 0; j < s.count; ++j) {
      const int64_t index = indices[j];
      std::byte* out = y + static_cast<size_t>(r * s.count + j) * size;
      if (index < 0 || index >= s.features) {
        std::memset(out, 0, size);  // an error in ONNX, which run cannot throw
      } else {
        std::memcpy(out, x + static_cast<size_t>(r * s.features + index) * size, size);
      }
    }
  }
}

// ----------------------------------------------------------------- Binarizer

struct BinarizerState final : KernelState {
  using Loop = void (*)(const BinarizerState& s, const std::byte* x, std::byte* y);
  Loop loop = nullptr;
  int64_t size = 0;
  double threshold = 0;
};

template <typename T>
void binarizeLoop(const BinarizerState& s, const std::byte* x_bytes, std::byte* y_bytes) {
  const T* x = reinterpret_cast<const T*>(x_bytes);
  T* y = reinterpret_cast<T*>(y_bytes);
  for (int64_t i = 0; i < s.size; ++i) y[i] = static_cast<double>(x[i]) > s.threshold ? T{1} : T{0};
}

std::unique_ptr<KernelState> prepareBinarizer(const KernelSetup& setup) {
  constexpr std::string_view op = "Binarizer";
  checks::expectCounts(op, setup, 1, 1, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  auto s = std::make_unique<BinarizerState>();
  switch (x.dtype) {
    case DType::kF32: s->loop = &binarizeLoop<float>; break;
    case DType::kF64: s->loop = &binarizeLoop<double>; break;
    case DType::kI64: s->loop = &binarizeLoop<int64_t>; break;
    case DType::kI32: s->loop = &binarizeLoop<int32_t>; break;
    default: throw UsageError(fmt::format("{}: no kernel for {} X (supports f32, f64, i64, i32)", op, typeText(x)));
  }
  checks::expectOutput(op, setup, 0, x.dtype, x.shape);
  s->size = checks::elementCount(x.shape);
  s->threshold = setup.params.getFloat("threshold", 0.0);
  return s;
}

void runBinarizer(const KernelCall& call) {
  const auto& s = static_cast<const BinarizerState&>(*call.state);
  s.loop(s, call.inputs[0].data, call.outputs[0].data);
}

// -------------------------------------------------------------- TreeEnsemble

enum Mode : int64_t { kLeq = 0, kLt, kGte, kGt, kEq, kNeq, kMember };
enum Aggregate : int64_t { kAverage = 0, kSum, kMin, kMax };
enum PostTransform : int64_t { kNone = 0, kSoftmax, kLogistic, kSoftmaxZero, kProbit };

// A branch: an interior node (index into nodes) or a leaf (index into leaves).
struct Branch {
  int64_t index = 0;
  bool leaf = false;
};

struct TreeNode {
  int64_t feature = 0;
  int64_t mode = kLeq;
  double split = 0;
  bool missing_true = false;
  int64_t members_begin = 0, members_end = 0;  // kMember: its set in `members`
  Branch on_true, on_false;
};

struct TreeEnsembleState final : KernelState {
  int64_t rows = 0, features = 0, targets = 0;
  DType dtype = DType::kF32;
  std::vector<TreeNode> nodes;
  std::vector<double> members;
  std::vector<int64_t> leaf_targets;
  std::vector<double> leaf_weights;
  std::vector<int64_t> roots;
  int64_t aggregate = kSum;
  int64_t post = kNone;
  // Scratch for one row and its scores, written by run: one call at a time
  // per prepared step, as the executor runs them.
  mutable std::vector<double> row_scratch;
  mutable std::vector<double> score_scratch;
};

// Lists that must have one entry per node.
Ints nodeInts(const KernelSetup& setup, const char* name, size_t nodes, bool required) {
  if (!setup.params.has(name)) {
    if (required) throw UsageError(fmt::format("TreeEnsemble: attribute '{}' is required", name));
    return Ints(nodes, 0);
  }
  Ints values = setup.params.getInts(name, {});
  if (values.size() != nodes) {
    throw UsageError(fmt::format("TreeEnsemble: '{}' has {} entries, nodes_splits {}", name, values.size(), nodes));
  }
  return values;
}

// The node table, with each kMember node's set cut from membership_values
// (the sets in node order, each ended by a NaN).
void buildNodes(TreeEnsembleState& s, const KernelSetup& setup) {
  constexpr std::string_view op = "TreeEnsemble";
  const std::vector<double> splits = setup.params.getFloats("nodes_splits", {});
  const size_t n = splits.size();
  const Ints features = nodeInts(setup, "nodes_featureids", n, true);
  const Ints modes = nodeInts(setup, "nodes_modes", n, true);
  const Ints true_ids = nodeInts(setup, "nodes_truenodeids", n, true);
  const Ints false_ids = nodeInts(setup, "nodes_falsenodeids", n, true);
  const Ints true_leafs = nodeInts(setup, "nodes_trueleafs", n, true);
  const Ints false_leafs = nodeInts(setup, "nodes_falseleafs", n, true);
  const Ints missing = nodeInts(setup, "nodes_missing_value_tracks_true", n, false);
  const std::vector<double> membership = setup.params.getFloats("membership_values", {});
  size_t next_member = 0;
  for (size_t i = 0; i < n; ++i) {
    TreeNode node;
    node.feature = features[i];
    node.mode = modes[i];
    node.split = splits[i];
    node.missing_true = missing[i] != 0;
    node.on_true = {true_ids[i], true_leafs[i] != 0};
    node.on_false = {false_ids[i], false_leafs[i] != 0};
    if (node.mode < kLeq || node.mode > kMember) throw UsageError(fmt::format("{}: node {} has mode {}", op, i, node.mode));
    if (node.feature < 0 || node.feature >= s.features) {
      throw UsageError(fmt::format("{}: node {} reads feature {} of {}", op, i, node.feature, s.features));
    }
    for (const Branch& b : {node.on_true, node.on_false}) {
      const auto limit = static_cast<int64_t>(b.leaf ? s.leaf_weights.size() : n);
      if (b.index < 0 || b.index >= limit) {
        throw UsageError(fmt::format("{}: node {} branches to {} {} of {}", op, i, b.leaf ? "leaf" : "node", b.index, limit));
      }
    }
    if (node.mode == kMember) {
      node.members_begin = static_cast<int64_t>(s.members.size());
      while (next_member < membership.size() && !std::isnan(membership[next_member])) {
        s.members.push_back(membership[next_member++]);
      }
      if (next_member == membership.size()) {
        throw UsageError(fmt::format("{}: membership_values has no NaN-ended set for member node {}", op, i));
      }
      ++next_member;  // the NaN
      node.members_end = static_cast<int64_t>(s.members.size());
    }
    s.nodes.push_back(node);
  }
  if (next_member != membership.size()) {
    throw UsageError(fmt::format("{}: membership_values has more sets than there are member nodes", op));
  }
}

// Fails when a tree has a cycle: no path from a root may be longer than the
// number of nodes.
void checkFinite(const TreeEnsembleState& s, int64_t index, size_t depth) {
  if (depth > s.nodes.size()) throw UsageError("TreeEnsemble: the nodes do not form trees (a branch loops)");
  const TreeNode& node = s.nodes[static_cast<size_t>(index)];
  if (!node.on_true.leaf) checkFinite(s, node.on_true.index, depth + 1);
  if (!node.on_false.leaf) checkFinite(s, node.on_false.index, depth + 1);
}

std::unique_ptr<KernelState> prepareTreeEnsemble(const KernelSetup& setup) {
  constexpr std::string_view op = "TreeEnsemble";
  checks::expectCounts(op, setup, 1, 1, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  if ((x.dtype != DType::kF32 && x.dtype != DType::kF64) || x.shape.size() != 2) {
    throw UsageError(fmt::format("{}: no kernel for {} X (supports 2-D f32, f64)", op, typeText(x)));
  }
  auto s = std::make_unique<TreeEnsembleState>();
  s->dtype = x.dtype;
  s->rows = x.shape[0];
  s->features = x.shape[1];
  s->leaf_weights = setup.params.getFloats("leaf_weights", {});
  s->leaf_targets = setup.params.getInts("leaf_targetids", {});
  if (s->leaf_targets.size() != s->leaf_weights.size()) {
    throw UsageError(fmt::format("{}: leaf_targetids has {} entries, leaf_weights {}", op, s->leaf_targets.size(),
                                 s->leaf_weights.size()));
  }
  const int64_t largest = s->leaf_targets.empty() ? -1 : *std::max_element(s->leaf_targets.begin(), s->leaf_targets.end());
  s->targets = setup.params.getInt("n_targets", largest + 1);
  for (int64_t t : s->leaf_targets) {
    if (t < 0 || t >= s->targets) throw UsageError(fmt::format("{}: leaf target {} is outside [0, {})", op, t, s->targets));
  }
  buildNodes(*s, setup);
  s->roots = setup.params.getInts("tree_roots", {});
  for (int64_t root : s->roots) {
    if (root < 0 || root >= static_cast<int64_t>(s->nodes.size())) {
      throw UsageError(fmt::format("{}: tree root {} is not one of the {} nodes", op, root, s->nodes.size()));
    }
    checkFinite(*s, root, 1);
  }
  s->aggregate = setup.params.getInt("aggregate_function", kSum);
  s->post = setup.params.getInt("post_transform", kNone);
  if (s->aggregate < kAverage || s->aggregate > kMax) {
    throw UsageError(fmt::format("{}: aggregate_function {} is not 0 to 3", op, s->aggregate));
  }
  if (s->post < kNone || s->post > kProbit) throw UsageError(fmt::format("{}: post_transform {} is not 0 to 4", op, s->post));
  checks::expectOutput(op, setup, 0, x.dtype, {s->rows, s->targets});
  s->row_scratch.resize(static_cast<size_t>(s->features));
  s->score_scratch.resize(static_cast<size_t>(s->targets));
  return s;
}

bool goesTrue(const TreeEnsembleState& s, const TreeNode& node, double x) {
  if (std::isnan(x) && node.missing_true) return true;
  switch (node.mode) {
    case kLeq: return x <= node.split;
    case kLt: return x < node.split;
    case kGte: return x >= node.split;
    case kGt: return x > node.split;
    case kEq: return x == node.split;
    case kNeq: return x != node.split;
    default: {
      const double* begin = s.members.data() + node.members_begin;
      const double* end = s.members.data() + node.members_end;
      return std::find(begin, end, x) != end;
    }
  }
}

// The leaf that `row` reaches from `root`.
int64_t leafOf(const TreeEnsembleState& s, int64_t root, const double* row) {
  Branch at{root, false};
  while (!at.leaf) {
    const TreeNode& node = s.nodes[static_cast<size_t>(at.index)];
    at = goesTrue(s, node, row[node.feature]) ? node.on_true : node.on_false;
  }
  return at.index;
}

// erfinv by the Giles-style closed form, refined by two Newton steps on erf.
double erfInverse(double y) {
  if (y <= -1) return -std::numeric_limits<double>::infinity();
  if (y >= 1) return std::numeric_limits<double>::infinity();
  const double a = 0.147;
  const double log_term = std::log((1 - y) * (1 + y));
  const double first = 2 / (M_PI * a) + log_term / 2;
  double x = std::copysign(std::sqrt(std::sqrt(first * first - log_term / a) - first), y);
  for (int i = 0; i < 2; ++i) x -= (std::erf(x) - y) / (2 / std::sqrt(M_PI) * std::exp(-x * x));
  return x;
}

void postTransform(int64_t post, double* scores, int64_t n) {
  if (post == kLogistic) {
    for (int64_t i = 0; i < n; ++i) scores[i] = 1 / (1 + std::exp(-scores[i]));
  } else if (post == kProbit) {
    for (int64_t i = 0; i < n; ++i) scores[i] = std::sqrt(2.0) * erfInverse(2 * scores[i] - 1);
  } else if (post == kSoftmax || post == kSoftmaxZero) {
    const bool keep_zeros = post == kSoftmaxZero;
    double max = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < n; ++i) max = std::max(max, scores[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      scores[i] = keep_zeros && scores[i] == 0 ? 0 : std::exp(scores[i] - max);
      sum += scores[i];
    }
    for (int64_t i = 0; i < n; ++i) scores[i] = sum == 0 ? 0 : scores[i] / sum;
  }
}

// Adds leaf weight `w` into `score` by the aggregate function.
void aggregateInto(int64_t aggregate, double& score, double w) {
  if (aggregate == kMin) {
    score = std::min(score, w);
  } else if (aggregate == kMax) {
    score = std::max(score, w);
  } else {
    score += w;  // SUM, and AVERAGE before its division
  }
}

template <typename T>
void treeEnsembleRows(const TreeEnsembleState& s, const T* x, T* y) {
  double* row = s.row_scratch.data();
  double* scores = s.score_scratch.data();
  const double start = s.aggregate == kMin   ? static_cast<double>(std::numeric_limits<T>::max())
                       : s.aggregate == kMax ? static_cast<double>(std::numeric_limits<T>::lowest())
                                             : 0.0;
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t f = 0; f < s.features; ++f) row[f] = static_cast<double>(x[r * s.features + f]);
    std::fill(scores, scores + s.targets, start);
    for (int64_t root : s.roots) {
      const auto leaf = static_cast<size_t>(leafOf(s, root, row));
      aggregateInto(s.aggregate, scores[s.leaf_targets[leaf]], s.leaf_weights[leaf]);
    }
    if (s.aggregate == kAverage && !s.roots.empty()) {
      for (int64_t t = 0; t < s.targets; ++t) scores[t] /= static_cast<double>(s.roots.size());
    }
    postTransform(s.post, scores, s.targets);
    for (int64_t t = 0; t < s.targets; ++t) y[r * s.targets + t] = static_cast<T>(scores[t]);
  }
}

void runTreeEnsemble(const KernelCall& call) {
  const auto& s = static_cast<const TreeEnsembleState&>(*call.state);
  if (s.dtype == DType::kF32) {
    treeEnsembleRows(s, call.inputs[0].as<const float>(), call.outputs[0].as<float>());
  } else {
    treeEnsembleRows(s, call.inputs[0].as<const double>(), call.outputs[0].as<double>());
  }
}

}  // namespace

void registerMlKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"ai.onnx.ml.ArrayFeatureExtractor", &prepareFeatureExtractor, &runFeatureExtractor});
  registry.add(KernelDef{"ai.onnx.ml.Binarizer", &prepareBinarizer, &runBinarizer});
  registry.add(KernelDef{"ai.onnx.ml.TreeEnsemble", &prepareTreeEnsemble, &runTreeEnsemble});
}

}  // namespace kiln

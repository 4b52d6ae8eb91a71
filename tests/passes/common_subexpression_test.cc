#include "passes/common_subexpression.h"

#include <gtest/gtest.h>

#include <limits>

#include "kiln/graph_builder.h"

namespace kiln {
namespace {

std::vector<std::string> opsOf(const Graph& graph) {
  std::vector<std::string> ops;
  for (NodeId id : graph.nodeIds()) ops.push_back(graph.node(id).op_type);
  return ops;
}

// The node that defines `value`.
const Node& producer(const Graph& graph, ValueId value) { return graph.node(graph.value(value).producer); }

void expectWellFormed(const Graph& graph) { EXPECT_TRUE(findGraphProblems(graph).empty()) << graph.toString(); }

TEST(CommonSubexpression, MergesIdenticalNodesAndRedirectsReaders) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 3});
  const ValueId r1 = b.op("Relu", {x});
  const ValueId r2 = b.op("Relu", {x});
  const ValueId sum = b.op("Add", {r1, r2});
  b.output(sum);
  GraphPtr graph = b.build();

  const CseResult result = eliminateCommonSubexpressions(*graph);
  EXPECT_EQ(result.nodes, 1u);
  EXPECT_EQ(result.initializers, 0u);
  EXPECT_EQ(opsOf(*graph), (std::vector<std::string>{"Relu", "Add"}));
  EXPECT_EQ(producer(*graph, sum).inputs, (std::vector<ValueId>{r1, r1}));
  EXPECT_EQ(graph->outputs(), (std::vector<ValueId>{sum}));
  expectWellFormed(*graph);
}

TEST(CommonSubexpression, DuplicateChainsCollapseInOneCall) {
  // Two copies of Mul(Sigmoid(Transpose(x)), Transpose(x)): the second
  // Transpose of each copy repeats its first, and the later nodes of the
  // second copy become identical to the first's only once their inputs are
  // merged.
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 3});
  auto chain = [&] {
    const ValueId t = b.op("Transpose", {x}, {{"perm", std::vector<int64_t>{1, 0}}});
    return b.op("Mul", {b.op("Sigmoid", {t}), b.op("Transpose", {x}, {{"perm", std::vector<int64_t>{1, 0}}})});
  };
  const ValueId first = chain();
  const ValueId second = chain();
  b.output(b.op("Sub", {first, second}));
  GraphPtr graph = b.build();

  EXPECT_EQ(eliminateCommonSubexpressions(*graph).nodes, 5u);  // 3 Transposes, Sigmoid and Mul
  EXPECT_EQ(opsOf(*graph), (std::vector<std::string>{"Transpose", "Sigmoid", "Mul", "Sub"}));
  expectWellFormed(*graph);
  EXPECT_EQ(eliminateCommonSubexpressions(*graph).nodes, 0u);  // already a fixpoint
}

TEST(CommonSubexpression, DifferentAttributesOrInputOrderDoNotMerge) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 3});
  const ValueId y = b.input("y", DType::kF32, {2, 3});
  std::vector<ValueId> outs = {
      b.op("LeakyRelu", {x}, {{"alpha", 0.1f}}),
      b.op("LeakyRelu", {x}, {{"alpha", 0.2f}}),
      b.op("LeakyRelu", {x}),  // the default alpha, not written: another attribute set
      b.op("Sub", {x, y}),
      b.op("Sub", {y, x}),
      b.op("Transpose", {x}, {{"perm", std::vector<int64_t>{1, 0}}}),
      b.op("Transpose", {x}),
      b.op("Clip", {x}, {{"min", 0.0f}}),
      b.op("Clip", {x}, {{"min", -0.0f}}),  // floats compare by their bits
  };
  // One that does merge, with a NaN attribute: a NaN equals itself here.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  outs.push_back(b.op("Clip", {x}, {{"max", nan}}));
  outs.push_back(b.op("Clip", {x}, {{"max", nan}}));
  for (ValueId v : outs) b.output(b.op("Neg", {v}));
  GraphPtr graph = b.build();

  // The NaN Clip merges; the two Negs over it then compute the same value,
  // but each is a graph output.
  EXPECT_EQ(eliminateCommonSubexpressions(*graph).nodes, 1u);
  expectWellFormed(*graph);
}

TEST(CommonSubexpression, TensorAttributesCompareByContent) {
  GraphBuilder b;
  const ValueId shape = b.input("shape", DType::kI64, {2});
  auto value = [](float v) {
    std::vector<std::byte> bytes(sizeof v);
    std::memcpy(bytes.data(), &v, sizeof v);
    return makeConstant(TensorInfo{DType::kF32, {1}}, bytes);
  };
  const ValueId a = b.op("ConstantOfShape", {shape}, {{"value", value(2.0f)}});
  const ValueId c = b.op("ConstantOfShape", {shape}, {{"value", value(2.0f)}});  // another pointer, same tensor
  const ValueId d = b.op("ConstantOfShape", {shape}, {{"value", value(3.0f)}});
  b.output(b.op("Sum", {a, c, d}));
  GraphPtr graph = b.build();

  EXPECT_EQ(eliminateCommonSubexpressions(*graph).nodes, 1u);
  EXPECT_EQ(opsOf(*graph), (std::vector<std::string>{"ConstantOfShape", "ConstantOfShape", "Sum"}));
  expectWellFormed(*graph);
}

TEST(CommonSubexpression, GraphOutputsKeepTheirNames) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {4});
  const ValueId both1 = b.op("Relu", {x});
  const ValueId both2 = b.op("Relu", {x});
  const ValueId inner = b.op("Sigmoid", {x});
  const ValueId outer = b.op("Sigmoid", {x});  // the later copy is the graph output
  b.output(both1);
  b.output(both2);
  b.output(outer);
  b.output(b.op("Neg", {inner}));
  GraphPtr graph = b.build();

  EXPECT_EQ(eliminateCommonSubexpressions(*graph).nodes, 1u);
  // Both Relus stay (each defines an output); the Sigmoid that is an output
  // stays and the other one's reader reads it.
  EXPECT_EQ(opsOf(*graph), (std::vector<std::string>{"Relu", "Relu", "Sigmoid", "Neg"}));
  EXPECT_EQ(graph->outputs()[2], outer);
  EXPECT_EQ(graph->value(outer).users.size(), 1u);
  EXPECT_TRUE(graph->node(graph->value(inner).producer).removed);
  expectWellFormed(*graph);
}

TEST(CommonSubexpression, NondeterministicAndCustomOpsNeverMerge) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {4});
  const Attributes seed = {{"seed", 1.0f}};
  const std::vector<ValueId> outs = {
      b.op("RandomNormalLike", {x}, seed), b.op("RandomNormalLike", {x}, seed),
      b.op("RandomUniformLike", {x}, seed), b.op("RandomUniformLike", {x}, seed),
      b.op("Dropout", {x}), b.op("Dropout", {x}),
      b.op("Counter", {x}, {}, "com.example"), b.op("Counter", {x}, {}, "com.example"),
  };
  for (ValueId v : outs) b.output(b.op("Neg", {v}));
  GraphPtr graph = b.build();
  EXPECT_EQ(eliminateCommonSubexpressions(*graph).nodes, 0u);
  EXPECT_EQ(graph->nodeIds().size(), 16u);
}

GraphPtr constantBranch(const std::string& name, float value) {
  GraphBuilder b(name);
  b.output(b.op("Identity", {b.constant<float>(name + "_c", {1}, {value})}));
  return b.build();
}

TEST(CommonSubexpression, NodesWithSubgraphsNeverMerge) {
  GraphBuilder b;
  const ValueId cond = b.input("cond", DType::kBool, {});
  const GraphPtr then_branch = constantBranch("then", 1.0f);
  const GraphPtr else_branch = constantBranch("else", 2.0f);
  const Attributes branches = {{"then_branch", then_branch}, {"else_branch", else_branch}};
  const ValueId a = b.op("If", {cond}, branches);
  const ValueId c = b.op("If", {cond}, branches);  // even the same body objects
  b.output(b.op("Add", {a, c}));
  GraphPtr graph = b.build();
  EXPECT_EQ(eliminateCommonSubexpressions(*graph).nodes, 0u);
}

TEST(CommonSubexpression, ValuesThatSubgraphsCaptureKeepTheirNames) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1});
  const ValueId cond = b.input("cond", DType::kBool, {});
  const ValueId first = b.op("Relu", {x});
  const ValueId captured = b.op("Relu", {x});
  // A branch that reads the second Relu's output by name (built without
  // GraphBuilder, which would verify it on its own, outside `b`).
  auto branch = std::make_shared<Graph>("then");
  const ValueId read = branch->addOuterScopeValue(b.graph().value(captured).name);
  branch->addOutput(branch->node(branch->addNode("Identity", {read}, {""})).outputs[0]);
  const Attributes branches = {{"then_branch", branch}, {"else_branch", constantBranch("else", 0.0f)}};
  b.output(b.op("Add", {first, b.op("If", {cond}, branches)}));
  GraphPtr graph = b.build();

  EXPECT_EQ(eliminateCommonSubexpressions(*graph).nodes, 1u);
  EXPECT_TRUE(graph->node(graph->value(first).producer).removed);
  EXPECT_FALSE(graph->node(graph->value(captured).producer).removed);
  expectWellFormed(*graph);
}

TEST(CommonSubexpression, MergesEqualInitializersOnly) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2});
  const ValueId a = b.constant<float>("a", {2}, {1.0f, 2.0f});
  const ValueId same = b.constant<float>("same", {2}, {1.0f, 2.0f});
  const ValueId other_shape = b.constant<float>("other_shape", {1, 2}, {1.0f, 2.0f});
  const ValueId other_values = b.constant<float>("other_values", {2}, {1.0f, 3.0f});
  const ValueId other_dtype = b.constant<int32_t>("other_dtype", {2}, {0x3f800000, 0x40000000});  // the same bytes
  const ValueId first = b.op("Add", {x, a});
  const ValueId second = b.op("Add", {x, same});  // identical to `first` once `same` reads as `a`
  b.output(b.op("Sum", {first, second, b.op("Add", {x, other_shape}), b.op("Add", {x, other_values})}));
  b.output(b.op("Cast", {other_dtype}, {{"to", int64_t{1}}}));
  GraphPtr graph = b.build();

  const CseResult result = eliminateCommonSubexpressions(*graph);
  EXPECT_EQ(result.initializers, 1u);
  EXPECT_EQ(result.nodes, 1u);
  EXPECT_TRUE(graph->value(same).users.empty());
  EXPECT_EQ(graph->value(a).users.size(), 1u);
  for (ValueId kept : {other_shape, other_values, other_dtype}) EXPECT_EQ(graph->value(kept).users.size(), 1u);
  EXPECT_TRUE(graph->node(graph->value(second).producer).removed);
  expectWellFormed(*graph);
}

TEST(CommonSubexpression, InitializerThatIsAGraphOutputKeepsItsName) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1});
  const ValueId a = b.constant<float>("a", {1}, {5.0f});
  const ValueId out = b.constant<float>("out", {1}, {5.0f});
  b.output(b.op("Add", {x, a}));
  b.output(out);
  GraphPtr graph = b.build();

  EXPECT_EQ(eliminateCommonSubexpressions(*graph).initializers, 1u);
  EXPECT_EQ(graph->outputs()[1], out);
  EXPECT_TRUE(graph->value(a).users.empty());
  EXPECT_EQ(graph->value(out).users.size(), 1u);
  expectWellFormed(*graph);
}

}  // namespace
}  // namespace kiln

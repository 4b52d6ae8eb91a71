#include "passes/constant_folding.h"

#include <gtest/gtest.h>

#include <cstring>

#include "kiln/graph_builder.h"
#include "ops/shape_inference.h"

namespace kiln {
namespace {

const std::map<std::string, int64_t> kOpsets = {{"", 17}};

std::vector<int64_t> intsOf(const Graph& graph, ValueId id) {
  const ConstantPtr& c = graph.value(id).initializer;
  EXPECT_TRUE(c != nullptr);
  std::vector<int64_t> values(c->info.numElements());
  std::memcpy(values.data(), c->bytes.data(), c->bytes.size());
  return values;
}

// reshape(x, concat(unsqueeze(shape(x)[0]), [-1])): what exporters emit for
// x.view(x.size(0), -1).
TEST(ConstantFolding, ShapeArithmeticBecomesConstant) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 3, 4});
  const ValueId shape = b.op("Shape", {x});
  const ValueId zero = b.constant<int64_t>("zero", {}, {0});
  const ValueId batch = b.op("Gather", {shape, zero}, {{"axis", int64_t{0}}});
  const ValueId axes = b.constant<int64_t>("axes", {1}, {0});
  const ValueId batch1 = b.op("Unsqueeze", {batch, axes});
  const ValueId minus_one = b.constant<int64_t>("minus_one", {1}, {-1});
  const ValueId target = b.op("Concat", {batch1, minus_one}, {{"axis", int64_t{0}}});
  const ValueId y = b.op("Reshape", {x, target});
  b.output(b.op("Relu", {y}));
  GraphPtr graph = b.build();

  inferTypes(*graph, kOpsets);
  EXPECT_EQ(graph->value(y).type.toString(), "f32[?, ?]");  // the shape is not known before folding
  size_t total = 0;
  for (size_t folded; (folded = foldConstants(*graph)) > 0;) {
    total += folded;
    inferTypes(*graph, kOpsets);
  }
  EXPECT_EQ(total, 4u);  // Shape, Gather, Unsqueeze, Concat
  EXPECT_EQ(graph->value(y).type.toString(), "f32[2, 12]");
  std::vector<std::string> ops;
  for (NodeId id : graph->nodeIds()) ops.push_back(graph->node(id).op_type);
  EXPECT_EQ(ops, (std::vector<std::string>{"Reshape", "Relu"}));
  const ValueId folded_target = graph->node(graph->nodeIds()[0]).inputs[1];
  EXPECT_EQ(intsOf(*graph, folded_target), (std::vector<int64_t>{2, -1}));
  EXPECT_TRUE(findGraphProblems(*graph).empty());
}

TEST(ConstantFolding, ArithmeticRangeAndSliceOnShapes) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {5, 7});
  const ValueId shape = b.op("Shape", {x});
  const ValueId start = b.constant<int64_t>("start", {1}, {1});
  const ValueId end = b.constant<int64_t>("end", {1}, {2});
  const ValueId last = b.op("Slice", {shape, start, end});            // [7]
  const ValueId doubled = b.op("Mul", {last, b.constant<int64_t>("two", {1}, {2})});  // [14]
  const ValueId range = b.op("Range", {b.constant<int64_t>("r0", {}, {0}), b.constant<int64_t>("r1", {}, {6}),
                                       b.constant<int64_t>("r2", {}, {2})});  // [0, 2, 4]
  b.output(doubled);
  b.output(range);
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  while (foldConstants(*graph) > 0) inferTypes(*graph, kOpsets);
  EXPECT_TRUE(graph->nodeIds().empty());
  EXPECT_EQ(intsOf(*graph, graph->outputs()[0]), (std::vector<int64_t>{14}));
  EXPECT_EQ(intsOf(*graph, graph->outputs()[1]), (std::vector<int64_t>{0, 2, 4}));
}

TEST(ConstantFolding, LeavesRunTimeWorkAlone) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {4});
  const ValueId w = b.constant<float>("w", {4}, {1, 2, 3, 4});
  b.output(b.op("Add", {x, w}));                                        // reads an input
  b.output(b.op("Mul", {w, w}));                                        // float constants: kernels' work
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  EXPECT_EQ(foldConstants(*graph), 0u);
  EXPECT_EQ(graph->nodeIds().size(), 2u);
}

// What the pass cannot evaluate itself goes to the evaluator it is given
// (the compiler's runs the node's kernel); random operators never do.
TEST(ConstantFolding, OtherNodesGoToTheEvaluator) {
  GraphBuilder b;
  const ValueId a = b.constant<float>("a", {2}, {1.5f, -2.0f});
  const ValueId negated = b.op("Neg", {a});
  const ValueId random = b.op("Dropout", {a});  // may be random: never folded
  const ValueId x = b.input("x", DType::kF32, {2});
  b.output(b.op("Add", {x, negated}));
  b.output(b.op("Add", {x, random}));
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  std::vector<std::string> asked;
  const ConstantEvaluator evaluate = [&](const Node& node, const std::vector<ConstantPtr>& inputs,
                                         const std::vector<TensorInfo>& outputs) {
    asked.push_back(node.op_type);
    std::vector<float> values(2);
    std::memcpy(values.data(), inputs[0]->bytes.data(), 8);
    for (float& v : values) v = -v;
    std::vector<std::byte> bytes(8);
    std::memcpy(bytes.data(), values.data(), 8);
    return std::optional<std::vector<ConstantPtr>>{{makeConstant(outputs[0], bytes)}};
  };
  EXPECT_EQ(foldConstants(*graph), 0u);  // without an evaluator: nothing to fold
  EXPECT_EQ(foldConstants(*graph, evaluate), 1u);
  EXPECT_EQ(asked, std::vector<std::string>{"Neg"});
  const Node& add = graph->node(graph->value(graph->outputs()[0]).producer);
  const ConstantPtr folded = graph->value(add.inputs[1]).initializer;
  ASSERT_TRUE(folded != nullptr);
  float values[2];
  std::memcpy(values, folded->bytes.data(), 8);
  EXPECT_EQ(values[0], -1.5f);
  EXPECT_EQ(values[1], 2.0f);
  (void)random;
}

}  // namespace
}  // namespace kiln

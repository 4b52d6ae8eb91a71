// The whole-graph driver: unsupported operators, arity checks, declared
// types, subgraphs.
#include "ops/shape_inference.h"

#include <gtest/gtest.h>

#include "kiln/error.h"
#include "kiln/graph_builder.h"
#include "ops/op_schema.h"

namespace kiln {
namespace {

TEST(ShapeInference, ListsEveryUnsupportedOperatorAtOnce) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2});
  const ValueId y = b.op("FancyOp", {b.op("Relu", {x})});
  const ValueId z = b.op("FancyOp", {y});
  b.output(b.op("Thing", {z}, {}, "com.example"));
  GraphPtr graph = b.build();
  EXPECT_EQ(findUnsupportedOps(*graph, {{"", 17}, {"com.example", 1}}),
            (std::vector<std::string>{"FancyOp (ai.onnx, opset 17)", "Thing (com.example, opset 1)"}));
  try {
    inferTypes(*graph, {{"", 17}, {"com.example", 1}});
    FAIL();
  } catch (const GraphError& e) {
    EXPECT_EQ(std::string(e.what()),
              "Unsupported: 2 operators without a schema in kiln: FancyOp (ai.onnx, opset 17), Thing (com.example, "
              "opset 1)");
  }
}

TEST(ShapeInference, UnsupportedOpsInsideSubgraphsAreFound) {
  auto body = std::make_shared<Graph>("then");
  const ValueId in = body->addOuterScopeValue("x");
  body->addOutput(body->node(body->addNode("Mystery", {in}, {"m"})).outputs[0]);
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1});
  const ValueId cond = b.input("cond", DType::kBool, {});
  (void)x;
  b.output(b.op("If", {cond}, {{"then_branch", body}, {"else_branch", body}}));
  GraphPtr graph = b.build();
  const auto unsupported = findUnsupportedOps(*graph, {{"", 17}});
  EXPECT_NE(std::find(unsupported.begin(), unsupported.end(), "Mystery (ai.onnx, opset 17)"), unsupported.end());
}

TEST(ShapeInference, ArityIsChecked) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2});
  b.output(b.op("Relu", {x, x}));
  GraphPtr graph = b.build();
  try {
    inferTypes(*graph, {{"", 17}});
    FAIL();
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'Relu_0' (Relu): takes 1 to 1 inputs, found 2"), std::string::npos);
  }
}

TEST(ShapeInference, DeclaredTypesMustAgree) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2});
  const ValueId y = b.op("Relu", {x});
  b.graph().value(y).type = ValueType::tensor(DType::kI32, {2});  // as a model's value_info might say
  b.output(y);
  GraphPtr graph = b.build();
  EXPECT_THROW(inferTypes(*graph, {{"", 17}}), GraphError);
}

TEST(ShapeInference, RegistryPicksTheNewestSchemaNotNewerThanTheOpset) {
  const OpRegistry& registry = OpRegistry::global();
  EXPECT_EQ(registry.find("", "LessOrEqual", 11), nullptr);
  ASSERT_NE(registry.find("", "LessOrEqual", 12), nullptr);
  EXPECT_EQ(registry.find("", "LessOrEqual", 17)->since_version, 12);
  EXPECT_EQ(registry.find("", "Relu", 17)->since_version, 1);
  EXPECT_EQ(registry.find("com.example", "Relu", 17), nullptr);
}

}  // namespace
}  // namespace kiln

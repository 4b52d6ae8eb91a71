#include "kiln/graph.h"

#include <gtest/gtest.h>

#include "kiln/error.h"
#include "kiln/graph_builder.h"

namespace kiln {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

bool anyContains(const std::vector<std::string>& lines, const std::string& part) {
  for (const std::string& line : lines) {
    if (contains(line, part)) return true;
  }
  return false;
}

// x -> MatMul(w) -> Add(b) -> Relu -> y
GraphPtr smallMlp() {
  GraphBuilder b("mlp");
  const ValueId x = b.input("x", DType::kF32, {-1, 4});
  const ValueId w = b.constant<float>("w", {4, 2}, std::vector<float>(8, 0.5f));
  const ValueId bias = b.constant<float>("b", {2}, {1.0f, -1.0f});
  const ValueId y = b.op("Relu", {b.op("Add", {b.op("MatMul", {x, w}), bias})});
  b.output(y);
  return b.build();
}

TEST(Graph, BuilderMakesAVerifiedSsaGraph) {
  const GraphPtr g = smallMlp();
  EXPECT_EQ(g->nodeIds().size(), 3u);
  EXPECT_EQ(g->inputs().size(), 1u);
  EXPECT_EQ(g->initializers().size(), 2u);
  ASSERT_EQ(g->outputs().size(), 1u);
  const Value& x = g->value(*g->findValue("x"));
  ASSERT_EQ(x.users.size(), 1u);
  EXPECT_EQ(g->node(x.users[0].node).op_type, "MatMul");
  EXPECT_EQ(g->value(g->outputs()[0]).producer, 2u);
  EXPECT_EQ(g->topologicalOrder(), (std::vector<NodeId>{0, 1, 2}));
  EXPECT_TRUE(findGraphProblems(*g).empty());
}

TEST(Graph, PrinterShowsTypesNodesAndAttributes) {
  GraphBuilder b("g");
  const ValueId x = b.input("x", ValueType{DType::kF32, std::vector<Dim>{Dim::symbolic("batch"), Dim::known(3)}});
  const ValueId y = b.op("LeakyRelu", {x}, {{"alpha", 0.5f}});
  b.graph().value(y).type = b.graph().value(x).type;
  b.output(b.op("Transpose", {y}, {{"perm", std::vector<int64_t>{1, 0}}}));
  const GraphPtr g = b.build();
  EXPECT_EQ(g->toString(),
            "graph g(x: f32[batch, 3]) {\n"
            "  LeakyRelu_0:0: f32[batch, 3] = LeakyRelu(x) {alpha: 0.5}\n"
            "  Transpose_1:0: ? = Transpose(LeakyRelu_0:0) {perm: [1, 0]}\n"
            "  return Transpose_1:0\n"
            "}\n");
}

TEST(Graph, ValueTypeText) {
  EXPECT_EQ(ValueType::tensor(DType::kF16, {1, -1}).toString(), "f16[1, ?]");
  EXPECT_EQ((ValueType{DType::kI64, std::nullopt}).toString(), "i64[*]");
  EXPECT_EQ(ValueType::unknown().toString(), "?");
  EXPECT_TRUE(ValueType::tensor(DType::kF32, {2, 3}).hasStaticShape());
  EXPECT_FALSE(ValueType::tensor(DType::kF32, {2, -1}).hasStaticShape());
  EXPECT_EQ(ValueType::tensor(DType::kF32, {2, -1}).tensorInfo(), (TensorInfo{DType::kF32, {2, -1}}));
}

TEST(Graph, EditsKeepUseListsInStep) {
  GraphPtr g = smallMlp();
  const ValueId x = *g->findValue("x");
  const NodeId relu = 2;
  const ValueId add_out = g->node(1).outputs[0];
  // Bypass Relu: the graph output becomes Add's output, then Relu is dead.
  g->replaceAllUses(g->node(relu).outputs[0], add_out);
  EXPECT_EQ(g->outputs()[0], add_out);
  g->removeNode(relu);
  EXPECT_TRUE(g->node(relu).removed);
  EXPECT_TRUE(g->value(add_out).users.empty());
  EXPECT_EQ(g->nodeIds(), (std::vector<NodeId>{0, 1}));
  // MatMul now reads x twice.
  g->setNodeInput(0, 1, x);
  EXPECT_EQ(g->value(x).users.size(), 2u);
  EXPECT_TRUE(g->value(*g->findValue("w")).users.empty());
  EXPECT_TRUE(findGraphProblems(*g).empty()) << g->toString();
}

TEST(Graph, RefusesBadEdits) {
  GraphPtr g = smallMlp();
  EXPECT_THROW(g->removeNode(0), UsageError);  // its output is read by Add
  EXPECT_THROW(g->addInput("x", {}), UsageError);  // duplicate name
  EXPECT_THROW(g->addNode("Relu", {12345}, {""}), UsageError);
  EXPECT_THROW(g->addNode("", {}, {}), UsageError);
  EXPECT_THROW(g->setNodeInput(0, 7, 0), UsageError);
  EXPECT_THROW(g->addInitializer("nothing", nullptr), UsageError);
}

TEST(Graph, CyclesAreFound) {
  Graph g("cyclic");
  const ValueId x = g.addInput("x", ValueType::tensor(DType::kF32, {1}));
  const NodeId a = g.addNode("Relu", {x}, {"a"});
  const NodeId b = g.addNode("Neg", {g.node(a).outputs[0]}, {"b"});
  g.addOutput(g.node(b).outputs[0]);
  g.setNodeInput(a, 0, g.node(b).outputs[0]);  // a reads b, b reads a
  try {
    (void)g.topologicalOrder();
    FAIL() << "expected a cycle";
  } catch (const GraphError& e) {
    EXPECT_TRUE(contains(e.what(), "has a cycle through nodes: Relu_0, Neg_1")) << e.what();
  }
  EXPECT_TRUE(anyContains(findGraphProblems(g), "cycle"));
  EXPECT_THROW(verifyGraph(g), GraphError);
}

TEST(Graph, TopologicalOrderFollowsDataNotInsertion) {
  Graph g;
  const ValueId x = g.addInput("x", {});
  const NodeId late = g.addNode("Relu", {x}, {"late"});   // will read `early`'s output
  const NodeId early = g.addNode("Neg", {x}, {"early"});
  g.setNodeInput(late, 0, g.node(early).outputs[0]);
  EXPECT_EQ(g.topologicalOrder(), (std::vector<NodeId>{early, late}));
}

TEST(Graph, VerifierFindsBrokenInvariants) {
  {
    GraphPtr g = smallMlp();
    g->value(*g->findValue("x")).users.clear();
    EXPECT_TRUE(anyContains(findGraphProblems(*g), "use list of 'x' disagrees"));
  }
  {
    GraphPtr g = smallMlp();
    g->node(0).removed = true;  // behind the Graph's back
    const auto problems = findGraphProblems(*g);
    EXPECT_TRUE(anyContains(problems, "reads 'MatMul_0:0', produced by removed node 'MatMul_0'"));
  }
  {
    GraphPtr g = smallMlp();
    g->value(*g->findValue("b")).type = ValueType::tensor(DType::kF32, {3});
    EXPECT_TRUE(anyContains(findGraphProblems(*g), "initializer 'b'"));
  }
  {
    GraphPtr g = smallMlp();
    EXPECT_TRUE(anyContains(findGraphProblems(*g, /*require_types=*/true), "value 'MatMul_0:0' has no dtype"));
  }
}

TEST(Graph, SubgraphsMayReadEnclosingValuesOnlyWhenDefined) {
  auto branch = [](const std::string& captured) {
    auto body = std::make_shared<Graph>("then");
    const ValueId outer = body->addOuterScopeValue(captured);
    const NodeId neg = body->addNode("Neg", {outer}, {"neg"});
    body->addOutput(body->node(neg).outputs[0]);
    return body;
  };
  for (const auto& [captured, valid] : {std::pair{std::string("x"), true}, std::pair{std::string("zz"), false}}) {
    Graph g("main");
    const ValueId x = g.addInput("x", ValueType::tensor(DType::kF32, {1}));
    const ValueId cond = g.addInput("cond", ValueType::tensor(DType::kBool, {}));
    const NodeId node = g.addNode("If", {cond}, {"y"}, {{"then_branch", branch(captured)}, {"else_branch", branch("x")}});
    g.addOutput(g.node(node).outputs[0]);
    (void)x;
    const auto problems = findGraphProblems(g);
    EXPECT_EQ(problems.empty(), valid) << captured;
    if (!valid) {
      EXPECT_TRUE(anyContains(problems, "main/If_0/then: 'zz' is read from an enclosing graph")) << problems[0];
    }
    EXPECT_EQ(g.node(node).subgraphs().size(), 2u);
    EXPECT_TRUE(contains(g.toString(), "  graph then(zz: outer) {") == !valid) << g.toString();
  }
}

TEST(Graph, TypedAttributes) {
  Node node;
  node.op_type = "Conv";
  node.attributes = {{"group", int64_t{2}}, {"strides", std::vector<int64_t>{2, 2}}, {"auto_pad", std::string("SAME")}};
  EXPECT_EQ(node.intAttribute("group", 1), 2);
  EXPECT_EQ(node.intAttribute("missing", 7), 7);
  EXPECT_EQ(node.intsAttribute("strides", {}), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(node.stringAttribute("auto_pad", "NOTSET"), "SAME");
  EXPECT_EQ(node.floatAttribute("alpha", 0.25f), 0.25f);
  EXPECT_THROW(node.floatAttribute("group", 0.0f), UsageError);
}

TEST(Graph, ConstantsMustMatchTheirTensorInfo) {
  EXPECT_THROW(makeConstant({DType::kF32, {2}}, std::vector<std::byte>(7)), UsageError);
  EXPECT_THROW(makeConstant({DType::kF32, {-1}}, {}), UsageError);
  EXPECT_EQ(makeConstant({DType::kI64, {}}, std::vector<std::byte>(8))->info.sizeInBytes(), 8u);
}

TEST(GraphBuilder, CannotBeUsedAfterBuild) {
  GraphBuilder b;
  b.output(b.input("x", DType::kF32, {1}));
  (void)b.build();
  EXPECT_THROW(b.build(), UsageError);
  EXPECT_THROW(b.op("Relu", {0}), UsageError);
}

}  // namespace
}  // namespace kiln

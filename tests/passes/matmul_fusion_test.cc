// The MatMul/Gemm fusion pass on small graphs: what it fuses, into what, and
// what it leaves alone. The fused kernels' numbers are checked in
// tests/kernels/fused_matmul_test.cc and against onnxruntime in
// tests/cli/test_fusion.py.
#include "passes/matmul_fusion.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "kiln/graph_builder.h"
#include "ops/shape_inference.h"

namespace kiln {
namespace {

const std::map<std::string, int64_t> kOpsets = {{"", 20}};

std::vector<std::string> opsOf(const Graph& graph) {
  std::vector<std::string> ops;
  for (NodeId id : graph.topologicalOrder()) {
    const Node& node = graph.node(id);
    ops.push_back(node.domain.empty() ? node.op_type : node.domain + "." + node.op_type);
  }
  return ops;
}

std::vector<float> filled(size_t count, float value) { return std::vector<float>(count, value); }

// x [2, 3, 8] times W [8, 4]; `after` adds the nodes under test to the
// product and returns the graph's output.
struct Model {
  GraphPtr graph;
  ValueId x, w, y;
  size_t fused = 0;
};

Model fuse(const std::function<ValueId(GraphBuilder&, ValueId)>& after, int64_t opset = 20) {
  GraphBuilder b;
  Model m;
  m.x = b.input("x", DType::kF32, {2, 3, 8});
  m.w = b.constant<float>("w", {8, 4}, filled(32, 0.5f));
  m.y = after(b, b.op("MatMul", {m.x, m.w}));
  b.output(m.y);
  m.graph = b.build();
  inferTypes(*m.graph, {{"", opset}});
  const std::string before = m.graph->value(m.y).type.toString();
  m.fused = fuseMatMuls(*m.graph);
  inferTypes(*m.graph, {{"", opset}});
  EXPECT_TRUE(findGraphProblems(*m.graph, /*require_types=*/true).empty()) << m.graph->toString();
  EXPECT_EQ(m.graph->value(m.y).type.toString(), before);
  EXPECT_EQ(m.graph->outputs(), std::vector<ValueId>{m.y});  // the output value and its name survive
  return m;
}

// The node that defines the graph's output.
const Node& outputNode(const Model& m) { return m.graph->node(m.graph->value(m.y).producer); }

ValueId bias(GraphBuilder& b, const std::vector<int64_t>& dims = {4}) {
  return b.constant<float>("bias", dims, filled(4, 0.25f));
}

ValueId scalar(GraphBuilder& b, float value) {
  static int count = 0;
  return b.constant<float>("c" + std::to_string(count++), {}, {value});
}

TEST(MatMulFusion, MatMulBiasReluBecomesOneNode) {
  ValueId b_value = kNoValue;
  const Model m = fuse([&](GraphBuilder& b, ValueId y) {
    b_value = bias(b);
    return b.op("Relu", {b.op("Add", {y, b_value})});
  });
  EXPECT_EQ(m.fused, 1u);
  EXPECT_EQ(opsOf(*m.graph), std::vector<std::string>{"kiln.FusedMatMul"});
  const Node& node = outputNode(m);
  EXPECT_EQ(node.inputs, (std::vector<ValueId>{m.x, m.w, b_value}));
  EXPECT_EQ(node.stringAttribute("activation", ""), "Relu");
  EXPECT_EQ(node.name, "MatMul_0");  // the product's name, for profiles
}

TEST(MatMulFusion, BiasAsFirstOperandWithLeadingOnesThenResidual) {
  ValueId residual = kNoValue;
  const Model m = fuse([&](GraphBuilder& b, ValueId y) {
    residual = b.input("h", DType::kF32, {2, 3, 4});
    return b.op("Add", {residual, b.op("Add", {bias(b, {1, 1, 4}), y})});
  });
  EXPECT_EQ(m.fused, 1u);
  EXPECT_EQ(opsOf(*m.graph), std::vector<std::string>{"kiln.FusedMatMul"});
  EXPECT_EQ(outputNode(m).inputs.size(), 4u);
  EXPECT_EQ(outputNode(m).inputs[3], residual);
  EXPECT_FALSE(outputNode(m).hasAttribute("activation"));
}

TEST(MatMulFusion, ResidualOrActivationWithoutBias) {
  const Model residual = fuse([](GraphBuilder& b, ValueId y) { return b.op("Add", {y, b.input("h", DType::kF32, {2, 3, 4})}); });
  EXPECT_EQ(opsOf(*residual.graph), std::vector<std::string>{"kiln.FusedMatMul"});
  EXPECT_EQ(outputNode(residual).inputs[2], kNoValue);

  const Model sigmoid = fuse([](GraphBuilder& b, ValueId y) { return b.op("Sigmoid", {y}); });
  EXPECT_EQ(opsOf(*sigmoid.graph), std::vector<std::string>{"kiln.FusedMatMul"});
  EXPECT_EQ(outputNode(sigmoid).inputs.size(), 2u);
  EXPECT_EQ(outputNode(sigmoid).stringAttribute("activation", ""), "Sigmoid");
}

TEST(MatMulFusion, SingleNodeActivationsAndTheirParameters) {
  struct Case {
    std::function<ValueId(GraphBuilder&, ValueId)> activation;
    std::string name;
    float alpha, beta;
  };
  const float lowest = std::numeric_limits<float>::lowest(), highest = std::numeric_limits<float>::max();
  const std::vector<Case> cases = {
      {[](GraphBuilder& b, ValueId v) { return b.op("LeakyRelu", {v}, {{"alpha", 0.2f}}); }, "LeakyRelu", 0.2f, 0},
      {[](GraphBuilder& b, ValueId v) { return b.op("LeakyRelu", {v}); }, "LeakyRelu", 0.01f, 0},
      {[](GraphBuilder& b, ValueId v) { return b.op("Tanh", {v}); }, "Tanh", 0, 0},
      {[](GraphBuilder& b, ValueId v) { return b.op("HardSwish", {v}); }, "HardSwish", 0, 0},
      {[](GraphBuilder& b, ValueId v) { return b.op("Gelu", {v}); }, "Gelu", 0, 0},
      {[](GraphBuilder& b, ValueId v) { return b.op("Gelu", {v}, {{"approximate", std::string("tanh")}}); },
       "GeluTanh", 0, 0},
      {[](GraphBuilder& b, ValueId v) { return b.op("Clip", {v, scalar(b, 0), scalar(b, 6)}); }, "Clip", 0, 6},
      {[](GraphBuilder& b, ValueId v) { return b.op("Clip", {v, kNoValue, scalar(b, 6)}); }, "Clip", lowest, 6},
      {[](GraphBuilder& b, ValueId v) { return b.op("Clip", {v}); }, "Clip", lowest, highest},
  };
  for (const Case& c : cases) {
    const Model m = fuse([&](GraphBuilder& b, ValueId y) { return c.activation(b, b.op("Add", {y, bias(b)})); });
    EXPECT_EQ(opsOf(*m.graph), std::vector<std::string>{"kiln.FusedMatMul"}) << c.name;
    const Node& node = outputNode(m);
    EXPECT_EQ(node.stringAttribute("activation", ""), c.name);
    if (c.name == "LeakyRelu" || c.name == "Clip") {
      EXPECT_EQ(node.floatAttribute("activation_alpha", -1), c.alpha) << c.name;
      EXPECT_EQ(node.floatAttribute("activation_beta", -1), c.beta) << c.name;
    } else {
      EXPECT_FALSE(node.hasAttribute("activation_alpha")) << c.name;
    }
  }
  // Clip-6 has its bounds as attributes.
  const Model clip6 = fuse([](GraphBuilder& b, ValueId y) { return b.op("Clip", {y}, {{"min", -1.0f}, {"max", 1.0f}}); },
                           /*opset=*/6);
  EXPECT_EQ(outputNode(clip6).floatAttribute("activation_alpha", 0), -1.0f);
  EXPECT_EQ(outputNode(clip6).floatAttribute("activation_beta", 0), 1.0f);
}

TEST(MatMulFusion, SwishInEitherOperandOrder) {
  for (bool sigmoid_first : {false, true}) {
    const Model m = fuse([&](GraphBuilder& b, ValueId y) {
      const ValueId x = b.op("Add", {y, bias(b)});
      const ValueId s = b.op("Sigmoid", {x});
      return sigmoid_first ? b.op("Mul", {s, x}) : b.op("Mul", {x, s});
    });
    EXPECT_EQ(opsOf(*m.graph), std::vector<std::string>{"kiln.FusedMatMul"});
    EXPECT_EQ(outputNode(m).stringAttribute("activation", ""), "Swish");
  }
}

TEST(MatMulFusion, GeluSubgraphsAsExportersWriteThem) {
  // x * 0.5 * (1 + erf(x / sqrt 2)), grouped and ordered in different ways.
  using Form = std::function<ValueId(GraphBuilder&, ValueId)>;
  auto onePlusErf = [](GraphBuilder& b, ValueId x, bool multiply) {
    const ValueId scaled = multiply ? b.op("Mul", {scalar(b, 0.70710678f), x}) : b.op("Div", {x, scalar(b, 1.4142135f)});
    return b.op("Add", {scalar(b, 1), b.op("Erf", {scaled})});
  };
  const std::vector<Form> forms = {
      // torch: Div, Erf, Add, Mul(x, ·), Mul(·, 0.5)
      [&](GraphBuilder& b, ValueId x) { return b.op("Mul", {b.op("Mul", {x, onePlusErf(b, x, false)}), scalar(b, 0.5)}); },
      // Mul(x, 1/sqrt 2) and Mul(0.5, Mul(1 + erf, x))
      [&](GraphBuilder& b, ValueId x) { return b.op("Mul", {scalar(b, 0.5), b.op("Mul", {onePlusErf(b, x, true), x})}); },
      // Mul(Mul(x, 0.5), 1 + erf)
      [&](GraphBuilder& b, ValueId x) {
        const ValueId half = b.op("Mul", {x, scalar(b, 0.5)});
        return b.op("Mul", {half, onePlusErf(b, x, false)});
      },
      // Mul(x, Mul(1 + erf, 0.5))
      [&](GraphBuilder& b, ValueId x) { return b.op("Mul", {x, b.op("Mul", {onePlusErf(b, x, false), scalar(b, 0.5)})}); },
  };
  for (size_t i = 0; i < forms.size(); ++i) {
    const Model m = fuse([&](GraphBuilder& b, ValueId y) { return forms[i](b, b.op("Add", {y, bias(b)})); });
    EXPECT_EQ(opsOf(*m.graph), std::vector<std::string>{"kiln.FusedMatMul"}) << "form " << i;
    EXPECT_EQ(outputNode(m).stringAttribute("activation", ""), "Gelu") << "form " << i;
  }
  // Not a Gelu: x / 2 instead of x / sqrt 2. The bias still fuses.
  const Model wrong = fuse([](GraphBuilder& b, ValueId y) {
    const ValueId x = b.op("Add", {y, bias(b)});
    const ValueId e = b.op("Add", {b.op("Erf", {b.op("Div", {x, scalar(b, 2)})}), scalar(b, 1)});
    return b.op("Mul", {b.op("Mul", {x, e}), scalar(b, 0.5)});
  });
  EXPECT_EQ(opsOf(*wrong.graph),
            (std::vector<std::string>{"kiln.FusedMatMul", "Div", "Erf", "Add", "Mul", "Mul"}));
}

TEST(MatMulFusion, GemmWithActivation) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 8});
  const ValueId w = b.constant<float>("w", {4, 8}, filled(32, 0.5f));
  const ValueId c = b.constant<float>("c", {4}, filled(4, 1));
  const Attributes trans = {{"transB", int64_t{1}}};
  const ValueId fused = b.op("Relu", {b.op("Gemm", {x, w, c}, trans)});
  const ValueId plain = b.op("Add", {b.op("Gemm", {fused, b.constant<float>("w2", {4, 4}, filled(16, 1))}), c});
  b.output(plain);
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  EXPECT_EQ(fuseMatMuls(*graph), 1u);  // Gemm + Add is not a pattern: Gemm has its own C
  EXPECT_EQ(opsOf(*graph), (std::vector<std::string>{"kiln.FusedGemm", "Gemm", "Add"}));
  const Node& node = graph->node(graph->value(fused).producer);
  EXPECT_EQ(node.inputs, (std::vector<ValueId>{x, w, c}));
  EXPECT_EQ(node.intAttribute("transB", 0), 1);
  EXPECT_EQ(node.stringAttribute("activation", ""), "Relu");
  inferTypes(*graph, kOpsets);
  EXPECT_TRUE(findGraphProblems(*graph, true).empty());
}

TEST(MatMulFusion, IntermediatesReadElsewhereStopTheChain) {
  // The product is also read by another node: nothing fuses.
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 8});
  const ValueId y = b.op("MatMul", {x, b.constant<float>("w", {8, 4}, filled(32, 1))});
  b.output(b.op("Relu", {b.op("Add", {y, bias(b)})}));
  b.output(b.op("Neg", {y}));
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  EXPECT_EQ(fuseMatMuls(*graph), 0u);

  // The biased value is a graph output: the bias fuses, the Relu stays.
  GraphBuilder o;
  const ValueId ox = o.input("x", DType::kF32, {2, 8});
  const ValueId biased = o.op("Add", {o.op("MatMul", {ox, o.constant<float>("w", {8, 4}, filled(32, 1))}), bias(o)});
  o.output(biased);
  o.output(o.op("Relu", {biased}));
  GraphPtr outputs = o.build();
  inferTypes(*outputs, kOpsets);
  EXPECT_EQ(fuseMatMuls(*outputs), 1u);
  EXPECT_EQ(opsOf(*outputs), (std::vector<std::string>{"kiln.FusedMatMul", "Relu"}));
  EXPECT_EQ(outputs->outputs()[0], biased);

  // Swish whose Sigmoid output is read elsewhere too.
  const Model swish = fuse([](GraphBuilder& g, ValueId v) {
    const ValueId s = g.op("Sigmoid", {v});
    return g.op("Add", {g.op("Mul", {v, s}), s});
  });
  EXPECT_EQ(swish.fused, 0u);
}

TEST(MatMulFusion, LeavesOtherShapesAndTypesAlone) {
  // A bias that is not a constant row, a residual that broadcasts, a Clip with
  // a bound from an input, min above max, an activation not in the list.
  const std::vector<std::function<ValueId(GraphBuilder&, ValueId)>> unfused = {
      [](GraphBuilder& b, ValueId y) { return b.op("Add", {y, b.input("v", DType::kF32, {4})}); },
      [](GraphBuilder& b, ValueId y) { return b.op("Add", {y, b.constant<float>("m", {3, 4}, filled(12, 1))}); },
      [](GraphBuilder& b, ValueId y) { return b.op("Add", {y, b.input("r", DType::kF32, {1, 3, 4})}); },
      [](GraphBuilder& b, ValueId y) { return b.op("Add", {y, b.constant<float>("r", {1, 1, 1, 4}, filled(4, 1))}); },
      [](GraphBuilder& b, ValueId y) { return b.op("Clip", {y, b.input("lo", DType::kF32, {})}); },
      [](GraphBuilder& b, ValueId y) { return b.op("Clip", {y, scalar(b, 1), scalar(b, 0)}); },
      [](GraphBuilder& b, ValueId y) { return b.op("Softplus", {y}); },
  };
  for (size_t i = 0; i < unfused.size(); ++i) {
    GraphBuilder b;
    const ValueId x = b.input("x", DType::kF32, {2, 3, 8});
    b.output(unfused[i](b, b.op("MatMul", {x, b.constant<float>("w", {8, 4}, filled(32, 1))})));
    GraphPtr graph = b.build();
    inferTypes(*graph, kOpsets);
    EXPECT_EQ(fuseMatMuls(*graph), 0u) << "case " << i;
  }

  // K = 0, a 1-D operand, f16.
  auto product = [](const std::vector<int64_t>& a, const std::vector<int64_t>& w, DType dtype) {
    GraphBuilder b;
    const ValueId x = b.input("x", dtype, a);
    const ValueId y = b.op("MatMul", {x, b.input("w", dtype, w)});
    b.output(b.op("Relu", {y}));
    GraphPtr graph = b.build();
    inferTypes(*graph, kOpsets);
    return fuseMatMuls(*graph);
  };
  EXPECT_EQ(product({2, 0}, {0, 4}, DType::kF32), 0u);
  EXPECT_EQ(product({8}, {8, 4}, DType::kF32), 0u);
  EXPECT_EQ(product({2, 8}, {8, 4}, DType::kF16), 0u);
  EXPECT_EQ(product({2, 8}, {8, 4}, DType::kF32), 1u);
}

TEST(MatMulFusion, EveryLayerOfAStackFuses) {
  GraphBuilder b;
  ValueId h = b.input("x", DType::kF32, {4, 16});
  for (int layer = 0; layer < 3; ++layer) {
    const ValueId w = b.constant<float>("w" + std::to_string(layer), {16, 16}, filled(256, 0.1f));
    const ValueId c = b.constant<float>("b" + std::to_string(layer), {16}, filled(16, 0.1f));
    const ValueId y = b.op("Add", {b.op("MatMul", {h, w}), c});
    h = b.op("Add", {h, b.op("Relu", {y})});  // the residual after the activation is not fused
  }
  b.output(h);
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  EXPECT_EQ(fuseMatMuls(*graph), 3u);
  EXPECT_EQ(opsOf(*graph), (std::vector<std::string>{"kiln.FusedMatMul", "Add", "kiln.FusedMatMul", "Add",
                                                     "kiln.FusedMatMul", "Add"}));
}

}  // namespace
}  // namespace kiln

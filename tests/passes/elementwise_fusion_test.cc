// The elementwise fusion pass on small graphs: which groups it forms, the
// program it writes, and what it leaves alone. The fused kernel's numbers
// are checked in tests/kernels/fused_elementwise_test.cc and against
// onnxruntime in tests/cli/test_elementwise_fusion.py.
#include "passes/elementwise_fusion.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "kiln/graph_builder.h"
#include "ops/shape_inference.h"

namespace kiln {
namespace {

std::vector<std::string> opsOf(const Graph& graph) {
  std::vector<std::string> ops;
  for (NodeId id : graph.topologicalOrder()) {
    const Node& node = graph.node(id);
    ops.push_back(node.domain.empty() ? node.op_type : node.domain + "." + node.op_type);
  }
  return ops;
}

struct Fused {
  GraphPtr graph;
  size_t count = 0;
  std::vector<std::string> outputs_before;  // the graph outputs' names and types

  const Node& producerOf(const std::string& value) const {
    return graph->node(graph->value(*graph->findValue(value)).producer);
  }
  std::vector<std::string> inputNames(const Node& node) const {
    std::vector<std::string> names;
    for (ValueId input : node.inputs) names.push_back(graph->value(input).name);
    return names;
  }
};

std::vector<std::string> describeOutputs(const Graph& graph) {
  std::vector<std::string> out;
  for (ValueId id : graph.outputs()) out.push_back(graph.value(id).name + ": " + graph.value(id).type.toString());
  return out;
}

// Builds a graph with `body`, infers types, fuses, and checks that the result
// is well formed (acyclic, typed) with the graph outputs unchanged.
Fused fuse(const std::function<void(GraphBuilder&)>& body, const ElementwiseFusionLimits& limits = {}) {
  GraphBuilder b;
  body(b);
  Fused f;
  f.graph = b.build();
  inferTypes(*f.graph, {{"", 20}});
  f.outputs_before = describeOutputs(*f.graph);
  f.count = fuseElementwise(*f.graph, limits);
  inferTypes(*f.graph, {{"", 20}});
  EXPECT_TRUE(findGraphProblems(*f.graph, /*require_types=*/true).empty()) << f.graph->toString();
  EXPECT_NO_THROW((void)f.graph->topologicalOrder());
  EXPECT_EQ(describeOutputs(*f.graph), f.outputs_before);
  return f;
}

std::vector<float> filled(size_t count, float value) { return std::vector<float>(count, value); }

ValueId scalar(GraphBuilder& b, const std::string& name, float value, std::vector<int64_t> dims = {}) {
  return b.constant<float>(name, dims, {value});
}

// Renames value `id` (so that tests can find it).
ValueId named(GraphBuilder& b, ValueId id, const std::string& name) {
  b.graph().renameValue(id, name);
  return id;
}

TEST(ElementwiseFusion, AChainBecomesOneNodeThatKeepsTheOutputName) {
  const Fused f = fuse([](GraphBuilder& b) {
    const ValueId x = b.input("x", DType::kF32, {2, 8});
    const ValueId bias = b.constant<float>("bias", {8}, filled(8, 0.5f));
    b.output(named(b, b.op("Sigmoid", {b.op("Relu", {b.op("Add", {x, bias})})}), "y"));
  });
  EXPECT_EQ(f.count, 1u);
  EXPECT_EQ(opsOf(*f.graph), std::vector<std::string>{"kiln.FusedElementwise"});
  const Node& node = f.producerOf("y");
  EXPECT_EQ(f.inputNames(node), (std::vector<std::string>{"x", "bias"}));
  EXPECT_EQ(node.stringAttribute("ops", ""), "Add,Relu,Sigmoid");
  // Slots: x 0, bias 1, then the results 2, 3, 4.
  EXPECT_EQ(node.intsAttribute("operands", {}), (std::vector<int64_t>{0, 1, 2, -1, 3, -1}));
  EXPECT_FALSE(node.hasAttribute("immediates"));
  EXPECT_EQ(node.name, "Sigmoid_2");  // the sink's node name, for profiles
}

TEST(ElementwiseFusion, ScalarConstantsBecomeImmediatesAndInputsAreReadOnce) {
  // Swish and a scale: (x * sigmoid(x)) / 2 - x.
  const Fused f = fuse([](GraphBuilder& b) {
    const ValueId x = b.input("x", DType::kF32, {4, 5});
    const ValueId swish = b.op("Mul", {x, b.op("Sigmoid", {x})});
    b.output(named(b, b.op("Sub", {b.op("Div", {swish, scalar(b, "two", 2.0f, {1})}), x}), "y"));
  });
  EXPECT_EQ(opsOf(*f.graph), std::vector<std::string>{"kiln.FusedElementwise"});
  const Node& node = f.producerOf("y");
  EXPECT_EQ(f.inputNames(node), std::vector<std::string>{"x"});
  EXPECT_EQ(node.stringAttribute("ops", ""), "Sigmoid,Mul,Div,Sub");
  const auto& immediates = std::get<std::vector<float>>(node.attributes.at("immediates"));
  EXPECT_EQ(immediates, std::vector<float>{2.0f});
  // Slots: x 0, the immediate 1, results 2..5.
  EXPECT_EQ(node.intsAttribute("operands", {}), (std::vector<int64_t>{0, -1, 0, 2, 3, 1, 4, 0}));
}

TEST(ElementwiseFusion, OpParametersTravelAsAlphaAndBeta) {
  const Fused f = fuse([](GraphBuilder& b) {
    const ValueId x = b.input("x", DType::kF32, {3});
    ValueId h = b.op("LeakyRelu", {x}, {{"alpha", 0.25f}});
    h = b.op("HardSigmoid", {h}, {{"alpha", 0.3f}, {"beta", 0.4f}});
    h = b.op("Clip", {h, scalar(b, "lo", -1.0f), scalar(b, "hi", 1.0f)});
    h = b.op("Pow", {h, scalar(b, "two", 2.0f)});
    h = b.op("Pow", {h, scalar(b, "half", 0.5f)});
    h = b.op("Gelu", {h}, {{"approximate", std::string("tanh")}});
    b.output(named(b, b.op("Elu", {h}), "y"));
  });
  EXPECT_EQ(f.count, 1u);
  const Node& node = f.producerOf("y");
  EXPECT_EQ(node.stringAttribute("ops", ""), "LeakyRelu,HardSigmoid,Clip,Square,PowHalf,GeluTanh,Elu");
  EXPECT_EQ(f.inputNames(node), std::vector<std::string>{"x"});  // bounds and exponents are part of the ops
  EXPECT_EQ(std::get<std::vector<float>>(node.attributes.at("alpha")),
            (std::vector<float>{0.25f, 0.3f, -1.0f, 0, 0, 0, 1.0f}));
  EXPECT_EQ(std::get<std::vector<float>>(node.attributes.at("beta")),
            (std::vector<float>{0, 0.4f, 1.0f, 0, 0, 0, 0}));
}

TEST(ElementwiseFusion, BroadcastInputsJoinAShapeChangeStartsAnotherGroup) {
  // The tail of a LayerNormalization written out: the [2, 1] statistics are
  // one group, the [2, 8] normalisation reading them another.
  const Fused f = fuse([](GraphBuilder& b) {
    const ValueId centered = b.input("centered", DType::kF32, {2, 8});
    const ValueId variance = b.input("variance", DType::kF32, {2, 1});
    const ValueId deviation = named(b, b.op("Sqrt", {b.op("Add", {variance, scalar(b, "eps", 1e-5f)})}), "deviation");
    const ValueId scale = b.constant<float>("scale", {8}, filled(8, 2.0f));
    const ValueId bias = b.constant<float>("bias", {1, 8}, filled(8, 0.1f));
    b.output(named(b, b.op("Add", {b.op("Mul", {b.op("Div", {centered, deviation}), scale}), bias}), "y"));
  });
  EXPECT_EQ(f.count, 2u);
  EXPECT_EQ(opsOf(*f.graph), (std::vector<std::string>{"kiln.FusedElementwise", "kiln.FusedElementwise"}));
  EXPECT_EQ(f.producerOf("deviation").stringAttribute("ops", ""), "Add,Sqrt");
  const Node& tail = f.producerOf("y");
  EXPECT_EQ(tail.stringAttribute("ops", ""), "Div,Mul,Add");
  EXPECT_EQ(f.inputNames(tail), (std::vector<std::string>{"centered", "deviation", "scale", "bias"}));
}

TEST(ElementwiseFusion, PinnedAndSharedValuesEndGroups) {
  const Fused f = fuse([](GraphBuilder& b) {
    const ValueId x = b.input("x", DType::kF32, {6});
    // "r" is a graph output: its Relu is the sink of its own group {Add, Relu}.
    const ValueId r = named(b, b.op("Relu", {b.op("Add", {x, x})}), "r");
    b.output(r);
    b.output(named(b, b.op("Sigmoid", {b.op("Tanh", {r})}), "y"));
    // "e" has two readers in different groups: it stays a node of its own.
    const ValueId e = named(b, b.op("Exp", {x}), "e");
    b.output(named(b, b.op("Neg", {b.op("Abs", {e})}), "z"));
    b.output(named(b, b.op("Floor", {b.op("Ceil", {e})}), "w"));
  });
  EXPECT_EQ(f.count, 4u);
  EXPECT_EQ(f.producerOf("r").stringAttribute("ops", ""), "Add,Relu");
  EXPECT_EQ(f.producerOf("y").stringAttribute("ops", ""), "Tanh,Sigmoid");
  EXPECT_EQ(f.inputNames(f.producerOf("y")), std::vector<std::string>{"r"});
  EXPECT_EQ(f.producerOf("e").op_type, "Exp");
  EXPECT_EQ(f.producerOf("z").stringAttribute("ops", ""), "Abs,Neg");
  EXPECT_EQ(f.producerOf("w").stringAttribute("ops", ""), "Ceil,Floor");
}

TEST(ElementwiseFusion, AValueReadTwiceInsideTheGroupJoinsIt) {
  // A diamond: a feeds both b and c, which meet in y.
  const Fused f = fuse([](GraphBuilder& b) {
    const ValueId x = b.input("x", DType::kF32, {5});
    const ValueId a = b.op("Exp", {x});
    b.output(named(b, b.op("Add", {b.op("Sigmoid", {a}), b.op("Tanh", {a})}), "y"));
  });
  EXPECT_EQ(opsOf(*f.graph), std::vector<std::string>{"kiln.FusedElementwise"});
  EXPECT_EQ(f.producerOf("y").stringAttribute("ops", ""), "Exp,Sigmoid,Tanh,Add");
}

TEST(ElementwiseFusion, AValueReadOutsideTheGroupCannotJoinItSoNoCycleForms) {
  // a feeds the group {Sigmoid, Add} and a Softmax whose result the Add reads
  // too: fusing a into the group would make the group both before and after
  // the Softmax.
  const Fused f = fuse([](GraphBuilder& b) {
    const ValueId x = b.input("x", DType::kF32, {2, 4});
    const ValueId a = named(b, b.op("Relu", {x}), "a");
    const ValueId t = named(b, b.op("Softmax", {a}, {{"axis", int64_t{-1}}}), "t");
    b.output(named(b, b.op("Add", {b.op("Sigmoid", {a}), t}), "y"));
  });
  EXPECT_EQ(f.count, 1u);
  EXPECT_EQ(opsOf(*f.graph), (std::vector<std::string>{"Relu", "Softmax", "kiln.FusedElementwise"}));
  EXPECT_EQ(f.inputNames(f.producerOf("y")), (std::vector<std::string>{"a", "t"}));
}

TEST(ElementwiseFusion, LeavesAloneWhatItCannotFuse) {
  // Single nodes; an i64 chain; Pow with another exponent; a Clip whose bound
  // is computed; Max of three inputs; a dynamic shape.
  const Fused f = fuse([](GraphBuilder& b) {
    const ValueId x = b.input("x", DType::kF32, {4});
    b.output(b.op("Relu", {x}));
    const ValueId i = b.input("i", DType::kI64, {4});
    b.output(b.op("Neg", {b.op("Add", {i, i})}));
    b.output(b.op("Relu", {b.op("Pow", {x, scalar(b, "four", 4.0f)})}));
    b.output(b.op("Relu", {b.op("Clip", {x, b.op("ReduceMin", {x}, {{"keepdims", int64_t{0}}})})}));
    b.output(b.op("Relu", {b.op("Max", {x, x, x})}));
    const ValueId d = b.input("d", DType::kF32, {-1});
    b.output(b.op("Relu", {b.op("Exp", {d})}));
  });
  EXPECT_EQ(f.count, 0u);
}

TEST(ElementwiseFusion, AnImmediateThatGaveTheOutputItsRankKeepsTheGroupUnfused) {
  // x [4] + c [1, 1] is [1, 4]: without c among the inputs the fused node's
  // shape would not follow from them.
  const Fused f = fuse([](GraphBuilder& b) {
    const ValueId x = b.input("x", DType::kF32, {4});
    b.output(b.op("Relu", {b.op("Add", {x, scalar(b, "c", 1.0f, {1, 1})})}));
  });
  EXPECT_EQ(f.count, 0u);
  EXPECT_EQ(opsOf(*f.graph), (std::vector<std::string>{"Add", "Relu"}));
}

TEST(ElementwiseFusion, ALongChainIsOneNode) {
  const Fused f = fuse([](GraphBuilder& b) {
    ValueId h = b.input("x", DType::kF32, {1, 64});
    for (int i = 0; i < 250; ++i) {
      const ValueId w = b.constant<float>("w" + std::to_string(i), {64}, filled(64, 0.5f));
      h = b.op("Sigmoid", {b.op("Relu", {b.op("Mul", {b.op("Add", {h, w}), w})})});
    }
    b.output(h);
  });
  EXPECT_EQ(f.count, 1u);
  ASSERT_EQ(opsOf(*f.graph).size(), 1u);
  const Node& node = f.graph->node(f.graph->nodeIds()[0]);
  EXPECT_EQ(node.inputs.size(), 251u);  // x and each w once
}

// The cuda target's limits: the same chain becomes several groups, each
// within them, and together they still compute the whole chain (one sink
// reads the next group's output).
TEST(ElementwiseFusion, LimitsSplitALongChainIntoGroupsWithinThem) {
  const ElementwiseFusionLimits limits{.max_inputs = 8, .max_ops = 48, .max_immediates = 16};
  const Fused f = fuse(
      [](GraphBuilder& b) {
        ValueId h = b.input("x", DType::kF32, {1, 64});
        for (int i = 0; i < 250; ++i) {
          const ValueId w = b.constant<float>("w" + std::to_string(i), {64}, filled(64, 0.5f));
          const ValueId s = scalar(b, "s" + std::to_string(i), 0.25f + static_cast<float>(i));
          h = b.op("Sigmoid", {b.op("Relu", {b.op("Mul", {b.op("Add", {h, w}), s})})});
        }
        b.output(h);
      },
      limits);
  size_t ops = 0;
  for (NodeId id : f.graph->nodeIds()) {
    const Node& node = f.graph->node(id);
    if (node.removed) continue;
    ASSERT_EQ(node.op_type, "FusedElementwise");
    EXPECT_LE(node.inputs.size(), limits.max_inputs);
    const std::string list = node.stringAttribute("ops", "");
    const size_t count = static_cast<size_t>(std::count(list.begin(), list.end(), ',')) + 1;
    EXPECT_LE(count, limits.max_ops);
    if (node.hasAttribute("immediates")) {
      EXPECT_LE(std::get<std::vector<float>>(node.attributes.at("immediates")).size(), limits.max_immediates);
    }
    ops += count;
  }
  EXPECT_EQ(ops, 1000u);  // every op of the chain, in some group
  EXPECT_GT(f.count, 1000u / limits.max_ops);
}

}  // namespace
}  // namespace kiln

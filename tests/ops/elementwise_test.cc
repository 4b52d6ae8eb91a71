#include <gtest/gtest.h>

#include "kiln/error.h"
#include "kiln/graph_builder.h"
#include "ops/shape_inference.h"

namespace kiln {
namespace {

const std::map<std::string, int64_t> kOpset17 = {{"", 17}};

std::string inferredType(GraphBuilder& b, ValueId output, const std::map<std::string, int64_t>& opsets = kOpset17) {
  b.output(output);
  GraphPtr graph = b.build();
  inferTypes(*graph, opsets);
  return graph->value(graph->outputs()[0]).type.toString();
}

std::string inferenceError(GraphBuilder& b, ValueId output) {
  try {
    (void)inferredType(b, output);
  } catch (const GraphError& e) {
    return e.what();
  }
  return "(no error)";
}

ValueType symbolic(DType dtype, std::vector<Dim> dims) { return ValueType{dtype, std::move(dims)}; }

TEST(Elementwise, UnaryKeepsTypeAndShape) {
  GraphBuilder b;
  const ValueId x = b.input("x", symbolic(DType::kF32, {Dim::symbolic("batch"), Dim::known(8)}));
  EXPECT_EQ(inferredType(b, b.op("Sigmoid", {b.op("Relu", {x})})), "f32[batch, 8]");
}

TEST(Elementwise, FloatOnlyOpsRefuseIntegers) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kI32, {4});
  EXPECT_NE(inferenceError(b, b.op("Exp", {x})).find("node 'Exp_0' (Exp): needs a floating-point input, found i32"),
            std::string::npos);
}

TEST(Elementwise, BinaryOpsBroadcastLikeNumpy) {
  struct Case {
    std::vector<int64_t> a, b;
    std::string expected;
  };
  for (const Case& c : {Case{{2, 3, 4}, {4}, "f32[2, 3, 4]"}, Case{{2, 1, 4}, {3, 1}, "f32[2, 3, 4]"},
                        Case{{1}, {5, 6}, "f32[5, 6]"}, Case{{}, {2}, "f32[2]"}, Case{{7, 1}, {1, 0}, "f32[7, 0]"}}) {
    GraphBuilder g;
    const ValueId a = g.input("a", DType::kF32, c.a);
    const ValueId bb = g.input("b", DType::kF32, c.b);
    EXPECT_EQ(inferredType(g, g.op("Add", {a, bb})), c.expected);
  }
}

TEST(Elementwise, BroadcastWithSymbolicDims) {
  GraphBuilder b;
  const ValueId a = b.input("a", symbolic(DType::kF32, {Dim::symbolic("n"), Dim::known(1)}));
  const ValueId c = b.input("c", symbolic(DType::kF32, {Dim::symbolic("n"), Dim::symbolic("m")}));
  const ValueId d = b.input("d", symbolic(DType::kF32, {Dim::known(1), Dim::known(5)}));
  EXPECT_EQ(inferredType(b, b.op("Mul", {b.op("Mul", {a, c}), d})), "f32[n, 5]");
}

TEST(Elementwise, IncompatibleShapesAndTypesAreRefused) {
  {
    GraphBuilder b;
    const ValueId x = b.input("x", DType::kF32, {2, 3});
    const ValueId y = b.input("y", DType::kF32, {4});
    EXPECT_NE(inferenceError(b, b.op("Sub", {x, y})).find("cannot broadcast input 1 dimension 0 (4) against 3"),
              std::string::npos);
  }
  {
    GraphBuilder b;
    const ValueId x = b.input("x", DType::kF32, {2});
    const ValueId y = b.input("y", DType::kI64, {2});
    EXPECT_NE(inferenceError(b, b.op("Add", {x, y})).find("input 1 is i64 but input 0 is f32"), std::string::npos);
  }
}

TEST(Elementwise, ComparisonsAndLogicGiveBool) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {3, 1});
  const ValueId y = b.input("y", DType::kF32, {1, 4});
  const ValueId less = b.op("Less", {x, y});
  const ValueId both = b.op("And", {less, b.op("Greater", {x, y})});
  EXPECT_EQ(inferredType(b, b.op("Not", {both})), "bool[3, 4]");
}

TEST(Elementwise, WhereBroadcastsAllThree) {
  GraphBuilder b;
  const ValueId cond = b.input("cond", DType::kBool, {2, 1, 1});
  const ValueId x = b.input("x", DType::kF16, {3, 1});
  const ValueId y = b.input("y", DType::kF16, {5});
  EXPECT_EQ(inferredType(b, b.op("Where", {cond, x, y})), "f16[2, 3, 5]");
}

TEST(Elementwise, CastChangesOnlyTheType) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 2});
  EXPECT_EQ(inferredType(b, b.op("Cast", {x}, {{"to", int64_t{7}}})), "i64[2, 2]");
  GraphBuilder bad;
  const ValueId y = bad.input("y", DType::kF32, {2});
  EXPECT_NE(inferenceError(bad, bad.op("Cast", {y}, {{"to", int64_t{8}}})).find("attribute 'to' is 8"),
            std::string::npos);
}

TEST(Elementwise, CastToTheNarrowTypesAndCastLike) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF16, {3});
  const ValueId like = b.input("like", DType::kF4E2M1, {1});
  EXPECT_EQ(inferredType(b, b.op("CastLike", {b.op("Cast", {x}, {{"to", int64_t{22}}}), like})), "f4e2m1[3]");
  for (int64_t code : {18, 20, 21, 23, 24, 25, 26}) {
    GraphBuilder g;
    const ValueId y = g.input("y", DType::kF32, {2});
    EXPECT_EQ(inferredType(g, g.op("Cast", {y}, {{"to", code}})),
              std::string(dtypeName(static_cast<DType>(code))) + "[2]");
  }
}

TEST(Elementwise, BitwiseSwishAndPredicates) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kU16, {2, 3});
  const ValueId y = b.input("y", DType::kU16, {3});
  EXPECT_EQ(inferredType(b, b.op("BitwiseNot", {b.op("BitwiseXor", {x, y})}), {{"", 18}}), "u16[2, 3]");
  GraphBuilder s;
  const ValueId f = s.input("f", DType::kBF16, {4});
  EXPECT_EQ(inferredType(s, s.op("Swish", {f}, {{"alpha", 0.5f}}), {{"", 24}}), "bf16[4]");
  GraphBuilder p;
  const ValueId h = p.input("h", DType::kF16, {4});
  EXPECT_EQ(inferredType(p, p.op("IsInf", {h}), {{"", 20}}), "bool[4]");
  GraphBuilder bad;
  const ValueId i = bad.input("i", DType::kI32, {4});
  EXPECT_NE(inferenceError(bad, bad.op("IsNaN", {i})).find("needs a floating-point input, found i32"),
            std::string::npos);
}

TEST(Elementwise, VariadicAndOptionalInputs) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {4, 1});
  const ValueId y = b.input("y", DType::kF32, {3});
  const ValueId z = b.input("z", DType::kF32, {1});
  const ValueId sum = b.op("Sum", {x, y, z});
  const ValueId low = b.constant<float>("low", {}, {0.0f});
  EXPECT_EQ(inferredType(b, b.op("Clip", {sum, low, kNoValue})), "f32[4, 3]");
}

TEST(Elementwise, OpsAreFoundByOpsetVersion) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2});
  EXPECT_EQ(inferredType(b, b.op("Gelu", {x}), {{"", 20}}), "f32[2]");
  GraphBuilder old;
  const ValueId y = old.input("y", DType::kF32, {2});
  old.output(old.op("Gelu", {y}));
  GraphPtr graph = old.build();
  EXPECT_THROW(inferTypes(*graph, kOpset17), GraphError);  // Gelu is opset 20
}

// kiln.FusedElementwise(x, b) = Relu(x + b): what passes/elementwise_fusion.h writes.
Attributes fusedProgram(const std::string& ops, std::vector<int64_t> operands) {
  const size_t count = operands.size() / 2;
  return {{"ops", ops}, {"operands", std::move(operands)}, {"alpha", std::vector<float>(count, 0.0f)},
          {"beta", std::vector<float>(count, 0.0f)}};
}

TEST(Elementwise, FusedElementwiseIsTheBroadcastOfItsInputs) {
  GraphBuilder b;
  const ValueId x = b.input("x", symbolic(DType::kF32, {Dim::symbolic("n"), Dim::known(1), Dim::known(8)}));
  const ValueId bias = b.input("b", DType::kF32, {3, 1});
  EXPECT_EQ(inferredType(b, b.op("FusedElementwise", {x, bias}, fusedProgram("Add,Relu", {0, 1, 2, -1}), "kiln")),
            "f32[n, 3, 8]");
}

TEST(Elementwise, FusedElementwiseChecksItsProgramAndTypes) {
  GraphBuilder bad_op;
  const ValueId x = bad_op.input("x", DType::kF32, {4});
  EXPECT_NE(inferenceError(bad_op, bad_op.op("FusedElementwise", {x}, fusedProgram("Pow", {0, -1}), "kiln"))
                .find("ops 'Pow' names an op that is not in the list"),
            std::string::npos);
  GraphBuilder bad_slot;
  const ValueId y = bad_slot.input("y", DType::kF32, {4});
  EXPECT_NE(inferenceError(bad_slot, bad_slot.op("FusedElementwise", {y}, fusedProgram("Exp", {1, -1}), "kiln"))
                .find("instruction 0 (Exp) reads slot 1"),
            std::string::npos);
  GraphBuilder ints;
  const ValueId i = ints.input("i", DType::kI32, {4});
  EXPECT_NE(inferenceError(ints, ints.op("FusedElementwise", {i}, fusedProgram("Neg", {0, -1}), "kiln"))
                .find("input 0 is i32; the fused program takes f32 (or f16 or bf16 throughout), and u8 or i8 where "
                      "it dequantizes"),
            std::string::npos);
}

// Quantized I/O (core/elementwise_program.h): an 8-bit input where
// `dequantize` gives it a scale, an 8-bit output with `quantize`; an 8-bit
// input without a scale, or an f32 one with, is refused.
TEST(Elementwise, FusedElementwiseReadsAndWrites8BitsWhereItsAttributesSay) {
  Attributes attributes = fusedProgram("Add", {0, 1});
  attributes["dequantize"] = std::vector<float>{0.5f, 3.0f, 0.0f, 0.0f};
  GraphBuilder b;
  const ValueId q = b.input("q", DType::kU8, {2, 4});
  const ValueId f = b.input("f", DType::kF32, {4});
  EXPECT_EQ(inferredType(b, b.op("FusedElementwise", {q, f}, attributes, "kiln")), "f32[2, 4]");
  attributes["quantize"] = std::vector<float>{0.25f, -4.0f};
  attributes["quantize_type"] = int64_t{3};  // i8
  GraphBuilder c;
  const ValueId q8 = c.input("q", DType::kU8, {2, 4});
  const ValueId f8 = c.input("f", DType::kF32, {4});
  EXPECT_EQ(inferredType(c, c.op("FusedElementwise", {q8, f8}, attributes, "kiln")), "i8[2, 4]");
  GraphBuilder unscaled;
  const ValueId u = unscaled.input("u", DType::kU8, {4});
  EXPECT_NE(inferenceError(unscaled, unscaled.op("FusedElementwise", {u}, fusedProgram("Neg", {0, -1}), "kiln"))
                .find("input 0 is u8"),
            std::string::npos);
  GraphBuilder scaled_float;
  const ValueId x = scaled_float.input("x", DType::kF32, {4});
  Attributes scaled = fusedProgram("Neg", {0, -1});
  scaled["dequantize"] = std::vector<float>{0.5f, 0.0f};
  EXPECT_NE(inferenceError(scaled_float, scaled_float.op("FusedElementwise", {x}, scaled, "kiln")).find("input 0 is f32"),
            std::string::npos);
  GraphBuilder wrong_count;
  const ValueId w = wrong_count.input("w", DType::kU8, {4});
  Attributes short_list = fusedProgram("Neg", {0, -1});
  short_list["dequantize"] = std::vector<float>{0.5f};
  EXPECT_NE(inferenceError(wrong_count, wrong_count.op("FusedElementwise", {w}, short_list, "kiln"))
                .find("dequantize has 1 values for 1 inputs"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln

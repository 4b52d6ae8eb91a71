// The f16 storage pass (`kiln compile --target cuda --fp16`) on small graphs:
// which steps turn f16, where the Casts go, what happens to weights and to
// the model's inputs and outputs. The numbers on a GPU are checked against
// onnxruntime in tests/cli/test_cuda.py.
#include "passes/float16_storage.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <tuple>

#include "core/float_formats.h"
#include "kiln/error.h"
#include "kiln/graph_builder.h"
#include "ops/shape_inference.h"

namespace kiln {
namespace {

const std::map<std::string, int64_t> kOpsets = {{"", 20}};

const Node& producerOf(const Graph& graph, ValueId value) { return graph.node(graph.value(value).producer); }

DType dtypeOf(const Graph& graph, ValueId value) { return graph.value(value).type.dtype; }

// x [2, 8] -> MatMul(w [8, 8]) -> Add(b) -> ReduceMean (no f16 kernel) -> Softmax
// -> y, with a Reshape view of the Add for a second output.
struct Model {
  GraphPtr graph;
  ValueId x, w, matmul, add, mean, y, view;
};

Model build(float weight = 0.5f) {
  GraphBuilder b;
  Model m;
  m.x = b.input("x", DType::kF32, {2, 8});
  m.w = b.constant<float>("w", {8, 8}, std::vector<float>(64, weight));
  const ValueId bias = b.constant<float>("b", {8}, std::vector<float>(8, 0.25f));
  m.matmul = b.op("MatMul", {m.x, m.w});
  m.add = b.op("Add", {m.matmul, bias});
  m.mean = b.op("ReduceMean", {m.add}, Attributes{{"keepdims", int64_t{1}}});
  m.y = b.op("Softmax", {m.mean});
  m.view = b.op("Reshape", {m.add, b.constant<int64_t>("shape", {1}, {16})});
  b.output(m.y);
  b.output(m.view);
  m.graph = b.build();
  inferTypes(*m.graph, kOpsets);
  return m;
}

TEST(Float16Storage, ConvertsTheStepsWithF16KernelsAndCastsAtTheBorders) {
  Model m = build();
  // MatMul, Add, Softmax and the view of the Add.
  EXPECT_EQ(storeInFloat16(*m.graph), 4u);
  inferTypes(*m.graph, kOpsets);
  EXPECT_TRUE(findGraphProblems(*m.graph, /*require_types=*/true).empty()) << m.graph->toString();
  Graph& g = *m.graph;

  // The model's input stays f32 and is cast once where it enters.
  EXPECT_EQ(dtypeOf(g, m.x), DType::kF32);
  const Node& matmul = producerOf(g, m.matmul);
  const Node& cast_in = producerOf(g, matmul.inputs[0]);
  EXPECT_EQ(cast_in.op_type, "Cast");
  EXPECT_EQ(cast_in.inputs[0], m.x);
  EXPECT_EQ(cast_in.intAttribute("to", 0), 10);
  // The weight is an f16 copy of the initializer.
  const Value& weight = g.value(matmul.inputs[1]);
  ASSERT_TRUE(weight.initializer);
  EXPECT_EQ(weight.initializer->info.dtype, DType::kF16);
  uint16_t bits;
  std::memcpy(&bits, weight.initializer->bytes.data(), 2);
  EXPECT_EQ(halfToFloat(bits), 0.5f);
  EXPECT_EQ(dtypeOf(g, m.matmul), DType::kF16);
  EXPECT_EQ(dtypeOf(g, m.add), DType::kF16);

  // ReduceMean has no f16 kernel: it reads a Cast back to f32, and the
  // Softmax after it a Cast to f16 again.
  const Node& mean = producerOf(g, m.mean);
  EXPECT_EQ(producerOf(g, mean.inputs[0]).op_type, "Cast");
  EXPECT_EQ(dtypeOf(g, mean.inputs[0]), DType::kF32);
  EXPECT_EQ(dtypeOf(g, m.mean), DType::kF32);
  EXPECT_EQ(dtypeOf(g, m.y), DType::kF16);

  // The model's outputs keep their f32 type, through Casts.
  ASSERT_EQ(g.outputs().size(), 2u);
  for (ValueId output : g.outputs()) {
    EXPECT_EQ(dtypeOf(g, output), DType::kF32);
    EXPECT_EQ(producerOf(g, output).op_type, "Cast");
  }
  EXPECT_EQ(producerOf(g, g.outputs()[1]).inputs[0], m.view);
  EXPECT_EQ(dtypeOf(g, m.view), DType::kF16);
}

TEST(Float16Storage, ClampsWeightsToTheLargestHalf) {
  Model m = build(1e6f);
  ASSERT_GT(storeInFloat16(*m.graph), 0u);
  const Node& matmul = producerOf(*m.graph, m.matmul);
  uint16_t bits;
  std::memcpy(&bits, m.graph->value(matmul.inputs[1]).initializer->bytes.data(), 2);
  EXPECT_EQ(halfToFloat(bits), 65504.0f);
}

TEST(Float16Storage, LeavesAViewOfAnF32ValueAndOtherTypesAlone) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 8});
  const ValueId ids = b.input("ids", DType::kI64, {3});
  const ValueId flat = b.op("Reshape", {x, b.constant<int64_t>("shape", {1}, {16})});
  const ValueId picked = b.op("Gather", {flat, ids});
  const ValueId indices = b.op("Add", {ids, ids});  // i64: no f16 to store
  b.output(picked);
  b.output(indices);
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  // Only the Gather: the Reshape views an f32 model input.
  EXPECT_EQ(storeInFloat16(*graph), 1u);
  inferTypes(*graph, kOpsets);
  EXPECT_EQ(dtypeOf(*graph, flat), DType::kF32);
  EXPECT_EQ(dtypeOf(*graph, picked), DType::kF16);
  EXPECT_EQ(dtypeOf(*graph, indices), DType::kI64);
  EXPECT_EQ(dtypeOf(*graph, graph->outputs()[0]), DType::kF32);
}

// A reduction's sum may exceed f16's range (magika's reaches 1.3e5): the
// elementwise work after it stays f32; the product after that converts.
TEST(Float16Storage, KeepsElementwiseWorkOnAnF32SumInF32) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 8});
  const ValueId sum = b.op("ReduceSum", {x, b.constant<int64_t>("axes", {1}, {1})},
                           Attributes{{"keepdims", int64_t{1}}});
  const ValueId scaled = b.op("Mul", {sum, b.constant<float>("c", {1, 8}, std::vector<float>(8, 0.125f))});
  const ValueId viewed = b.op("Reshape", {scaled, b.constant<int64_t>("shape", {2}, {2, 8})});
  const ValueId product = b.op("MatMul", {viewed, b.constant<float>("w", {8, 8}, std::vector<float>(64, 1.0f))});
  b.output(product);
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  EXPECT_EQ(storeInFloat16(*graph), 1u);
  inferTypes(*graph, kOpsets);
  EXPECT_TRUE(findGraphProblems(*graph, /*require_types=*/true).empty()) << graph->toString();
  EXPECT_EQ(dtypeOf(*graph, scaled), DType::kF32);
  EXPECT_EQ(dtypeOf(*graph, viewed), DType::kF32);
  EXPECT_EQ(dtypeOf(*graph, product), DType::kF16);
  EXPECT_EQ(producerOf(*graph, producerOf(*graph, product).inputs[0]).op_type, "Cast");
}

// bf16 (`--bf16`) has f32's range: the same graph converts its elementwise
// work too, and weights keep their magnitude (no clamp at 65504).
TEST(Float16Storage, Bfloat16ConvertsWorkOnAnF32SumAndKeepsLargeWeights) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 8});
  const ValueId sum = b.op("ReduceSum", {x, b.constant<int64_t>("axes", {1}, {1})},
                           Attributes{{"keepdims", int64_t{1}}});
  const ValueId scaled = b.op("Mul", {sum, b.constant<float>("c", {1, 8}, std::vector<float>(8, 0.125f))});
  const ValueId product = b.op("MatMul", {scaled, b.constant<float>("w", {8, 8}, std::vector<float>(64, 1e6f))});
  b.output(product);
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  EXPECT_EQ(storeInFloat16(*graph, DType::kBF16), 2u);  // the Mul and the MatMul
  inferTypes(*graph, kOpsets);
  EXPECT_TRUE(findGraphProblems(*graph, /*require_types=*/true).empty()) << graph->toString();
  EXPECT_EQ(dtypeOf(*graph, sum), DType::kF32);
  EXPECT_EQ(dtypeOf(*graph, scaled), DType::kBF16);
  EXPECT_EQ(dtypeOf(*graph, product), DType::kBF16);
  EXPECT_EQ(dtypeOf(*graph, graph->outputs()[0]), DType::kF32);  // cast back for the caller
  // The sum enters through a Cast to bf16 (ONNX type 16).
  const Node& cast = producerOf(*graph, producerOf(*graph, scaled).inputs[0]);
  EXPECT_EQ(cast.op_type, "Cast");
  EXPECT_EQ(cast.intAttribute("to", 0), 16);
  // The weight's bf16 copy: 1e6 rounds to 999424 (8 bits of mantissa).
  const Value& weight = graph->value(producerOf(*graph, product).inputs[1]);
  EXPECT_EQ(weight.name, "w:bf16");
  uint16_t bits;
  std::memcpy(&bits, weight.initializer->bytes.data(), 2);
  EXPECT_EQ(bfloat16ToFloat(bits), 999424.0f);
  EXPECT_THROW(storeInFloat16(*graph, DType::kF32), UsageError);
}

TEST(Float16Storage, ConvertsResizesDataButNotItsScales) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1, 2, 4, 4});
  const ValueId scales = b.constant<float>("scales", {4}, {1.0f, 1.0f, 2.0f, 2.0f});
  const ValueId empty = b.constant<float>("roi", {0}, {});
  const ValueId resized = b.op("Resize", {b.op("Relu", {x}), empty, scales}, Attributes{{"mode", std::string("linear")}});
  b.output(resized);
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  EXPECT_EQ(storeInFloat16(*graph), 2u);
  inferTypes(*graph, kOpsets);
  EXPECT_TRUE(findGraphProblems(*graph, /*require_types=*/true).empty()) << graph->toString();
  EXPECT_EQ(dtypeOf(*graph, resized), DType::kF16);
  const Node& resize = producerOf(*graph, resized);
  EXPECT_EQ(resize.inputs[1], empty);
  EXPECT_EQ(resize.inputs[2], scales);
  EXPECT_EQ(dtypeOf(*graph, scales), DType::kF32);
}

// Attention computes in f32 from f16 Q, K and V; its float mask stays f32
// (f16 would turn a -1e9 or -3.4e38 mask into -inf).
TEST(Float16Storage, ConvertsAttentionButNotItsMask) {
  GraphBuilder b;
  const ValueId q = b.input("q", DType::kF32, {1, 2, 4, 8});
  const ValueId k = b.input("k", DType::kF32, {1, 2, 4, 8});
  const ValueId v = b.input("v", DType::kF32, {1, 2, 4, 8});
  const ValueId mask = b.input("mask", DType::kF32, {4, 4});
  const ValueId y = b.op("Attention", {q, k, v, mask});
  b.output(y);
  GraphPtr graph = b.build();
  const std::map<std::string, int64_t> opsets = {{"", 23}};
  inferTypes(*graph, opsets);
  EXPECT_EQ(storeInFloat16(*graph), 1u);
  inferTypes(*graph, opsets);
  EXPECT_TRUE(findGraphProblems(*graph, /*require_types=*/true).empty()) << graph->toString();
  const Node& attention = producerOf(*graph, graph->node(graph->value(graph->outputs()[0]).producer).inputs[0]);
  ASSERT_EQ(attention.op_type, "Attention");
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(dtypeOf(*graph, attention.inputs[i]), DType::kF16) << i;
  EXPECT_EQ(attention.inputs[3], mask);
  EXPECT_EQ(dtypeOf(*graph, attention.outputs[0]), DType::kF16);
}

// f16 tensor cores read rows of 16-byte multiples: a product with K or N
// not a multiple of 8 stays f32, and so does the Add on its output.
TEST(Float16Storage, KeepsProductsWithUnalignedRowsInF32) {
  for (const auto& [k, n, converted] : {std::tuple{257, 64, false}, std::tuple{64, 214, false},
                                        std::tuple{64, 216, true}}) {
    GraphBuilder b;
    const ValueId x = b.input("x", DType::kF32, {4, k});
    const ValueId w = b.constant<float>("w", {k, n}, std::vector<float>(static_cast<size_t>(k * n), 0.5f));
    const ValueId y = b.op("MatMul", {x, w});
    b.output(b.op("Relu", {y}));
    GraphPtr graph = b.build();
    inferTypes(*graph, kOpsets);
    EXPECT_EQ(storeInFloat16(*graph), converted ? 2u : 0u) << k << "x" << n;
    EXPECT_EQ(dtypeOf(*graph, y), converted ? DType::kF16 : DType::kF32);
  }
}

TEST(Float16Storage, DoesNothingWithoutF32Work) {
  GraphBuilder b;
  const ValueId ids = b.input("ids", DType::kI64, {3});
  b.output(b.op("Add", {ids, ids}));
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  EXPECT_EQ(storeInFloat16(*graph), 0u);
}

}  // namespace
}  // namespace kiln

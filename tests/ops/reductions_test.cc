// Type and shape inference of the reductions and ArgMax/ArgMin
// (src/ops/reductions.cc).
#include <gtest/gtest.h>

#include <sstream>

#include "kiln/error.h"
#include "kiln/graph_builder.h"
#include "ops/shape_inference.h"
#include "tests/ops/inference_test_util.h"

namespace kiln {
namespace {

using testing::failsWith;
using testing::inferredType;
using testing::inferredTypes;
using testing::parseType;

using Ints = std::vector<int64_t>;

const Attributes kDropDims{{"keepdims", int64_t{0}}};

TEST(Reductions, ReduceSumTakesAxesAsAnInputFromOpset13) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 3, 4]"));
  const ValueId axes = b.constant<int64_t>("axes", {2}, {1, -1});
  const ValueId kept = b.op("ReduceSum", {x, axes});
  const ValueId dropped = b.op("ReduceSum", {x, axes}, kDropDims);
  const ValueId all = b.op("ReduceSum", {x});
  const ValueId all_dropped = b.op("ReduceSum", {x}, kDropDims);
  const ValueId empty = b.constant<int64_t>("empty", {0}, {});
  const ValueId noop = b.op("ReduceSum", {x, empty}, {{"noop_with_empty_axes", int64_t{1}}});
  const ValueId batch = b.op("ReduceSum", {x, b.constant<int64_t>("first", {1}, {0})}, kDropDims);
  EXPECT_EQ(inferredTypes(b, {kept, dropped, all, all_dropped, noop, batch}),
            (std::vector<std::string>{"f32[batch, 1, 1]", "f32[batch]", "f32[1, 1, 1]", "f32[]", "f32[batch, 3, 4]",
                                      "f32[3, 4]"}));
}

TEST(Reductions, AxesAttributeBeforeTheInputForm) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 3, 4});
  const ValueId sum = b.op("ReduceSum", {x}, {{"axes", Ints{0}}});
  const ValueId mean = b.op("ReduceMean", {x}, {{"axes", Ints{-1}}, {"keepdims", int64_t{0}}});
  EXPECT_EQ(inferredTypes(b, {sum, mean}, 11), (std::vector<std::string>{"f32[1, 3, 4]", "f32[2, 3]"}));

  // ReduceMean keeps its attribute until opset 17 and takes the input from 18.
  GraphBuilder attribute;
  const ValueId y = attribute.input("y", DType::kF32, {2, 3, 4});
  EXPECT_EQ(inferredTypes(attribute, {attribute.op("ReduceMean", {y}, {{"axes", Ints{1, 2}}})}, 17),
            (std::vector<std::string>{"f32[2, 1, 1]"}));
  GraphBuilder input;
  const ValueId z = input.input("z", DType::kF32, {2, 3, 4});
  EXPECT_EQ(inferredTypes(input, {input.op("ReduceMean", {z, input.constant<int64_t>("axes", {1}, {1})})}, 18),
            (std::vector<std::string>{"f32[2, 1, 4]"}));
  GraphBuilder too_early;
  const ValueId w = too_early.input("w", DType::kF32, {2, 3});
  too_early.op("ReduceMax", {w, too_early.constant<int64_t>("axes", {1}, {0})});
  EXPECT_TRUE(failsWith(too_early, "takes 1 to 1 inputs, found 2", 17));
}

TEST(Reductions, EveryReductionKeepsTheDtype) {
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}) {
    for (int64_t opset : {11, 18}) {
      GraphBuilder b;
      const ValueId x = b.input("x", parseType("f16[N, 8, 8]"));
      const ValueId y =
          opset < 13 ? b.op(op, {x}, {{"axes", Ints{1, 2}}}) : b.op(op, {x, b.constant<int64_t>("axes", {2}, {1, 2})});
      EXPECT_EQ(inferredTypes(b, {y}, opset), (std::vector<std::string>{"f16[N, 1, 1]"})) << op << " at " << opset;
    }
  }
}

TEST(Reductions, ComputedAxesLeaveSizesUnknown) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 3, 4]"));
  const ValueId axes = b.input("axes", DType::kI64, {2});
  const ValueId kept = b.op("ReduceSum", {x, axes});
  const ValueId dropped = b.op("ReduceSum", {x, axes}, kDropDims);
  const ValueId unknown_count = b.op("ReduceSum", {x, b.input("n", parseType("i64[n]"))}, kDropDims);
  const ValueId unknown_rank = b.op("ReduceSum", {b.input("u", parseType("f32[*]")), axes});
  EXPECT_EQ(inferredTypes(b, {kept, dropped, unknown_count, unknown_rank}),
            (std::vector<std::string>{"f32[?, ?, ?]", "f32[?]", "f32[*]", "f32[*]"}));
}

TEST(Reductions, InvalidAxesAreRefused) {
  GraphBuilder range;
  const ValueId x = range.input("x", DType::kF32, {2, 3});
  range.op("ReduceSum", {x, range.constant<int64_t>("axes", {1}, {2})});
  EXPECT_TRUE(failsWith(range, "axis 2 is out of range for rank 2"));
  GraphBuilder twice;
  const ValueId y = twice.input("y", DType::kF32, {2, 3});
  twice.op("ReduceMin", {y}, {{"axes", Ints{1, -1}}});
  EXPECT_TRUE(failsWith(twice, "axis -1 is given more than once"));
  GraphBuilder dtype;
  const ValueId z = dtype.input("z", DType::kF32, {2, 3});
  dtype.op("ReduceSum", {z, dtype.constant<int32_t>("axes", {1}, {1})});
  EXPECT_TRUE(failsWith(dtype, "the axes (input 1) must be int64, found i32"));
  GraphBuilder matrix;
  const ValueId w = matrix.input("w", DType::kF32, {2, 3});
  matrix.op("ReduceSum", {w, matrix.constant<int64_t>("axes", {1, 1}, {1})});
  EXPECT_TRUE(failsWith(matrix, "the axes (input 1) must be 1-D, found [1, 1]"));
}

TEST(ArgMax, GivesInt64Indices) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 10]"));
  const ValueId max = b.op("ArgMax", {x}, {{"axis", int64_t{1}}});
  const ValueId min =
      b.op("ArgMin", {x}, {{"axis", int64_t{-1}}, {"keepdims", int64_t{0}}, {"select_last_index", int64_t{1}}});
  const ValueId first = b.op("ArgMax", {x}, kDropDims);
  EXPECT_EQ(inferredTypes(b, {max, min, first}), (std::vector<std::string>{"i64[batch, 1]", "i64[batch]", "i64[10]"}));

  GraphBuilder bad;
  bad.op("ArgMin", {bad.input("x", DType::kF32, {3})}, {{"axis", int64_t{1}}});
  EXPECT_TRUE(failsWith(bad, "node 'ArgMin_0' (ArgMin): axis 1 is out of range for rank 1"));
}

}  // namespace
}  // namespace kiln

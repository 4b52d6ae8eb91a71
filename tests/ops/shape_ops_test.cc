// Type and shape inference of the shape and data-movement operators
// (src/ops/shape_ops.cc).
#include <gtest/gtest.h>

#include <limits>
#include <sstream>

#include "kiln/error.h"
#include "kiln/graph_builder.h"
#include "ops/shape_inference.h"
#include "tests/ops/inference_test_util.h"

namespace kiln {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

using testing::failsWith;
using testing::inferredType;
using testing::inferredTypes;
using testing::parseType;

Attributes ints(const std::string& name, std::vector<int64_t> values) { return {{name, std::move(values)}}; }

// ---------------------------------------------------------------- Reshape

TEST(Reshape, ZeroCopiesAndMinusOneTakesTheRest) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 3, 4});
  const ValueId y = b.op("Reshape", {x, b.constant<int64_t>("s1", {2}, {0, -1})});
  const ValueId z = b.op("Reshape", {x, b.constant<int64_t>("s2", {4}, {-1, 0, 2, 2})});
  const ValueId w = b.op("Reshape", {x, b.constant<int32_t>("s3", {1}, {24})});
  EXPECT_EQ(inferredTypes(b, {y, z, w}), (std::vector<std::string>{"f32[2, 12]", "f32[2, 3, 2, 2]", "f32[24]"}));
}

TEST(Reshape, SymbolicDimsFlowThrough) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 3, 4]"));
  const ValueId flat = b.op("Reshape", {x, b.constant<int64_t>("s1", {2}, {0, -1})});
  const ValueId back = b.op("Reshape", {flat, b.constant<int64_t>("s2", {3}, {-1, 3, 4})});
  const ValueId lost = b.op("Reshape", {x, b.constant<int64_t>("s3", {2}, {-1, 2})});
  const ValueId fixed = b.op("Reshape", {x, b.constant<int64_t>("s4", {2}, {6, 0})});  // 0 copies 3, not batch
  EXPECT_EQ(inferredTypes(b, {flat, back, lost, fixed}),
            (std::vector<std::string>{"f32[batch, 12]", "f32[batch, 3, 4]", "f32[?, 2]", "f32[6, 3]"}));
}

TEST(Reshape, AllowZeroKeepsZerosFromOpset14) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {0, 4});
  const ValueId shape = b.constant<int64_t>("s", {2}, {4, 0});
  const ValueId y = b.op("Reshape", {x, shape}, {{"allowzero", int64_t{1}}});
  EXPECT_EQ(inferredType(b, y, 14), "f32[4, 0]");

  GraphBuilder copy;  // without allowzero the 0 copies the input's 4: 16 elements, not 0
  const ValueId x2 = copy.input("x", DType::kF32, {0, 4});
  copy.op("Reshape", {x2, copy.constant<int64_t>("s", {2}, {4, 0})});
  EXPECT_TRUE(failsWith(copy, "cannot reshape [0, 4] into [4, 0]", 14));

  GraphBuilder both;
  const ValueId x3 = both.input("x", DType::kF32, {0, 4});
  both.op("Reshape", {x3, both.constant<int64_t>("s", {2}, {-1, 0})}, {{"allowzero", int64_t{1}}});
  EXPECT_TRUE(failsWith(both, "has both a 0 and a -1, which allowzero=1 forbids", 14));
}

TEST(Reshape, ComputedShapeGivesTheRankOnly) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 3, 4});
  const ValueId shape = b.op("Shape", {x});  // i64[3], not a constant
  const ValueId y = b.op("Reshape", {x, shape});
  const ValueId unknown = b.input("s", parseType("i64[n]"));
  const ValueId z = b.op("Reshape", {x, unknown});
  EXPECT_EQ(inferredTypes(b, {y, z}), (std::vector<std::string>{"f32[?, ?, ?]", "f32[*]"}));
}

TEST(Reshape, InvalidShapesAreRefused) {
  struct Case {
    std::vector<int64_t> shape;
    std::string error;
  };
  for (const Case& c : {Case{{5, 5}, "cannot reshape [2, 3, 4] into [5, 5]: the element counts differ (24 against 25"},
                        Case{{-1, -1}, "the shape [-1, -1] has more than one -1"},
                        Case{{5, -1}, "the remaining 24 elements do not divide by 5"},
                        Case{{2, -3, 4}, "the shape [2, -3, 4] has the invalid size -3"},
                        Case{{0, 0, 0, 0}, "copies dimension 3 (a 0) but the input [2, 3, 4] has rank 3"}}) {
    GraphBuilder b;
    const ValueId x = b.input("x", DType::kF32, {2, 3, 4});
    b.op("Reshape", {x, b.constant<int64_t>("s", {static_cast<int64_t>(c.shape.size())}, c.shape)});
    EXPECT_TRUE(failsWith(b, c.error));
  }
  GraphBuilder matrix;
  const ValueId x = matrix.input("x", DType::kF32, {6});
  matrix.op("Reshape", {x, matrix.constant<int64_t>("s", {1, 2}, {2, 3})});
  EXPECT_TRUE(failsWith(matrix, "the shape (input 1) must be 1-D, found [1, 2]"));
}

TEST(Reshape, Opset1TakesAnAttribute) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {2, 6});
  EXPECT_EQ(inferredType(b, b.op("Reshape", {x}, ints("shape", {3, -1})), 4), "f32[3, 4]");
}

// ------------------------------------------------------- Flatten, Squeeze

TEST(Flatten, SplitsTheDimsAtTheAxis) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 3, 4, 5]"));
  const ValueId y = b.op("Flatten", {x});
  const ValueId z = b.op("Flatten", {x}, {{"axis", int64_t{2}}});
  const ValueId w = b.op("Flatten", {x}, {{"axis", int64_t{0}}});
  const ValueId v = b.op("Flatten", {x}, {{"axis", int64_t{-1}}});
  EXPECT_EQ(inferredTypes(b, {y, z, w, v}),
            (std::vector<std::string>{"f32[batch, 60]", "f32[?, 20]", "f32[1, ?]", "f32[?, 5]"}));

  GraphBuilder bad;
  bad.op("Flatten", {bad.input("x", DType::kF32, {2, 3})}, {{"axis", int64_t{3}}});
  EXPECT_TRUE(failsWith(bad, "axis 3 is out of range [-2, 2] for [2, 3]"));
}

TEST(Squeeze, AxesFromAnInputSinceOpset13) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[1, batch, 1, 4]"));
  const ValueId y = b.op("Squeeze", {x, b.constant<int64_t>("axes", {2}, {0, -2})});
  const ValueId all = b.op("Squeeze", {b.input("z", DType::kF32, {1, 3, 1})});
  const ValueId unknown = b.op("Squeeze", {x});  // batch might be 1
  EXPECT_EQ(inferredTypes(b, {y, all, unknown}), (std::vector<std::string>{"f32[batch, 4]", "f32[3]", "f32[*]"}));
}

TEST(Squeeze, AxesAttributeBeforeOpset13) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1, 3, 1});
  EXPECT_EQ(inferredType(b, b.op("Squeeze", {x}, ints("axes", {2})), 11), "f32[1, 3]");

  GraphBuilder bad;
  bad.op("Squeeze", {bad.input("x", DType::kF32, {1, 3, 1})}, ints("axes", {1}));
  EXPECT_TRUE(failsWith(bad, "cannot squeeze axis 1 of [1, 3, 1]: its size is 3, not 1", 11));
  GraphBuilder input_at_11;  // an axes input is opset 13's form
  const ValueId x2 = input_at_11.input("x", DType::kF32, {1, 3});
  input_at_11.op("Squeeze", {x2, input_at_11.constant<int64_t>("axes", {1}, {0})});
  EXPECT_TRUE(failsWith(input_at_11, "takes 1 to 1 inputs, found 2", 11));
}

TEST(Unsqueeze, InsertsOnesAtTheOutputAxes) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 4]"));
  const ValueId y = b.op("Unsqueeze", {x, b.constant<int64_t>("axes", {2}, {0, -1})});
  const ValueId z = b.op("Unsqueeze", {x, b.constant<int64_t>("axes2", {2}, {1, 3})});
  EXPECT_EQ(inferredTypes(b, {y, z}), (std::vector<std::string>{"f32[1, batch, 4, 1]", "f32[batch, 1, 4, 1]"}));

  GraphBuilder old;
  const ValueId x2 = old.input("x", DType::kF32, {3});
  EXPECT_EQ(inferredType(old, old.op("Unsqueeze", {x2}, ints("axes", {0})), 12), "f32[1, 3]");

  GraphBuilder twice;
  const ValueId x3 = twice.input("x", DType::kF32, {3});
  twice.op("Unsqueeze", {x3, twice.constant<int64_t>("axes", {2}, {0, -3})});
  EXPECT_TRUE(failsWith(twice, "axis -3 is given more than once"));
}

// A scalar axes input is one axis (onnxruntime accepts it, and ONNX's own
// AffineGrid expansion passes one); a 2-D one is refused. A computed scalar
// adds or removes one dimension.
TEST(Unsqueeze, AScalarAxesInputIsOneAxis) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {3, 1});
  const ValueId up = b.op("Unsqueeze", {x, b.constant<int64_t>("axis", {}, {-1})});
  const ValueId down = b.op("Squeeze", {x, b.constant<int64_t>("axis1", {}, {1})});
  const ValueId computed = b.input("n", DType::kI64, {});
  const ValueId up_computed = b.op("Unsqueeze", {x, computed});
  const ValueId down_computed = b.op("Squeeze", {x, computed});
  EXPECT_EQ(inferredTypes(b, {up, down, up_computed, down_computed}),
            (std::vector<std::string>{"f32[3, 1, 1]", "f32[3]", "f32[?, ?, ?]", "f32[?]"}));

  GraphBuilder matrix;
  matrix.op("Unsqueeze", {matrix.input("x", DType::kF32, {3}), matrix.constant<int64_t>("axes", {1, 1}, {0})});
  EXPECT_TRUE(failsWith(matrix, "the axes (input 1) must be a scalar or 1-D, found [1, 1]"));
}

// ---------------------------------------------------- Transpose, Concat

TEST(Transpose, PermutesTheDims) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 3]"));
  const ValueId y = b.input("y", DType::kF32, {2, 3, 4});
  const ValueId reversed = b.op("Transpose", {x});
  const ValueId permuted = b.op("Transpose", {y}, ints("perm", {0, 2, 1}));
  EXPECT_EQ(inferredTypes(b, {reversed, permuted}), (std::vector<std::string>{"f32[3, batch]", "f32[2, 4, 3]"}));

  GraphBuilder bad;
  bad.op("Transpose", {bad.input("x", DType::kF32, {2, 3, 4})}, ints("perm", {0, 1, 1}));
  EXPECT_TRUE(failsWith(bad, "perm [0, 1, 1] is not a permutation of the 3 axes of [2, 3, 4]"));
}

TEST(Concat, AddsUpTheAxisAndMatchesTheRest) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 3]"));
  const ValueId y = b.input("y", parseType("f32[?, 5]"));
  const ValueId z = b.input("z", parseType("f32[batch, n]"));
  const ValueId known = b.op("Concat", {x, y}, {{"axis", int64_t{-1}}});
  const ValueId unknown = b.op("Concat", {x, z}, {{"axis", int64_t{1}}});
  const ValueId rows = b.op("Concat", {y, y}, {{"axis", int64_t{0}}});
  EXPECT_EQ(inferredTypes(b, {known, unknown, rows}),
            (std::vector<std::string>{"f32[batch, 8]", "f32[batch, ?]", "f32[?, 5]"}));
}

TEST(Concat, MismatchesAreRefused) {
  GraphBuilder b;
  b.op("Concat", {b.input("x", DType::kF32, {2, 3}), b.input("y", DType::kF32, {4, 3})}, {{"axis", int64_t{1}}});
  EXPECT_TRUE(failsWith(b, "input 0 is [2, 3] and input 1 is [4, 3]: they may differ only along axis 1"));
  GraphBuilder rank;
  rank.op("Concat", {rank.input("x", DType::kF32, {2, 3}), rank.input("y", DType::kF32, {2})}, {{"axis", int64_t{0}}});
  EXPECT_TRUE(failsWith(rank, "input 1 has rank 1 ([2]) but input 0 has rank 2"));
  GraphBuilder dtype;
  dtype.op("Concat", {dtype.input("x", DType::kF32, {2}), dtype.input("y", DType::kI64, {2})}, {{"axis", int64_t{0}}});
  EXPECT_TRUE(failsWith(dtype, "input 1 is i64 but input 0 is f32"));
  GraphBuilder no_axis;
  no_axis.op("Concat", {no_axis.input("x", DType::kF32, {2})});
  EXPECT_TRUE(failsWith(no_axis, "needs the 'axis' attribute"));
  // The sizes along the axis summed past int64 (undefined behaviour; found by graph_run_fuzz).
  GraphBuilder huge;
  const int64_t big = int64_t{1} << 62;
  huge.op("Concat", {huge.input("x", DType::kF32, {1, big}), huge.input("y", DType::kF32, {1, big})},
          {{"axis", int64_t{1}}});
  EXPECT_TRUE(failsWith(huge, "the dimension arithmetic 4611686018427387904 + 4611686018427387904 overflows 64 bits"));
}

// ------------------------------------------------------------------ Split

TEST(Split, SizesFromTheSplitInput) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 6]"));
  const auto parts = b.ops("Split", {x, b.constant<int64_t>("split", {2}, {2, 4})}, 2, {{"axis", int64_t{1}}});
  const auto equal = b.ops("Split", {x}, 3, {{"axis", int64_t{-1}}});
  const auto rows = b.ops("Split", {x}, 2);  // along the unknown batch
  EXPECT_EQ(inferredTypes(b, {parts[0], parts[1], equal[2], rows[0]}),
            (std::vector<std::string>{"f32[batch, 2]", "f32[batch, 4]", "f32[batch, 2]", "f32[?, 6]"}));
}

TEST(Split, AttributeBeforeOpset13AndNumOutputsFrom18) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {10});
  const auto parts = b.ops("Split", {x}, 2, ints("split", {3, 7}));
  EXPECT_EQ(inferredTypes(b, {parts[0], parts[1]}, 11), (std::vector<std::string>{"f32[3]", "f32[7]"}));

  GraphBuilder uneven;  // opset 18: ceil(10 / 4) = 3 per chunk, the last one smaller
  const ValueId y = uneven.input("y", DType::kF32, {10});
  const auto chunks = uneven.ops("Split", {y}, 4, {{"num_outputs", int64_t{4}}});
  EXPECT_EQ(inferredTypes(uneven, chunks, 18), (std::vector<std::string>{"f32[3]", "f32[3]", "f32[3]", "f32[1]"}));
}

TEST(Split, InvalidSplitsAreRefused) {
  GraphBuilder uneven;
  uneven.ops("Split", {uneven.input("x", DType::kF32, {2, 10})}, 3, {{"axis", int64_t{1}}});
  EXPECT_TRUE(failsWith(uneven, "axis 1 of [2, 10] has size 10, which does not split evenly into 3 outputs"));
  GraphBuilder sum;
  const ValueId x = sum.input("x", DType::kF32, {10});
  sum.ops("Split", {x, sum.constant<int64_t>("split", {2}, {3, 3})}, 2);
  EXPECT_TRUE(failsWith(sum, "split [3, 3] adds up to 6 but axis 0 of [10] has size 10"));
  GraphBuilder count;
  const ValueId y = count.input("y", DType::kF32, {10});
  count.ops("Split", {y, count.constant<int64_t>("split", {3}, {3, 3, 4})}, 2);
  EXPECT_TRUE(failsWith(count, "split has 3 sizes for 2 outputs"));
  GraphBuilder num;
  num.ops("Split", {num.input("x", DType::kF32, {10})}, 2, {{"num_outputs", int64_t{3}}});
  EXPECT_TRUE(failsWith(num, "num_outputs is 3 but the node has 2 outputs", 18));
}

// ------------------------------------------------------------------ Slice

TEST(Slice, ConstantBoundsAreClampedLikeNumpy) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {10, 20, 30});
  auto slice = [&](const std::string& name, std::vector<int64_t> starts, std::vector<int64_t> ends,
                   std::vector<int64_t> axes, std::vector<int64_t> steps) {
    const auto n = static_cast<int64_t>(starts.size());
    return b.op("Slice",
                {x, b.constant<int64_t>(name + "_starts", {n}, starts), b.constant<int64_t>(name + "_ends", {n}, ends),
                 b.constant<int64_t>(name + "_axes", {n}, axes), b.constant<int64_t>(name + "_steps", {n}, steps)});
  };
  const ValueId a = slice("a", {0, 5}, {kMax, -5}, {0, 1}, {1, 1});   // [0:], [5:-5]
  const ValueId c = slice("c", {-1}, {kMin}, {2}, {-1});              // [::-1]
  const ValueId d = slice("d", {1, 100}, {9, 200}, {-3, 2}, {3, 1});  // [1:9:3], out of range
  const ValueId e = slice("e", {25}, {2}, {2}, {-4});                 // [25:2:-4]
  EXPECT_EQ(inferredTypes(b, {a, c, d, e}),
            (std::vector<std::string>{"f32[10, 10, 30]", "f32[10, 20, 30]", "f32[3, 20, 0]", "f32[10, 20, 6]"}));
}

TEST(Slice, UnknownSizesAndBounds) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, seq, 8]"));
  const ValueId starts = b.constant<int64_t>("starts", {2}, {0, 1});
  const ValueId ends = b.constant<int64_t>("ends", {2}, {kMax, kMax});
  const ValueId axes = b.constant<int64_t>("axes", {2}, {0, 1});
  const ValueId kept = b.op("Slice", {x, starts, ends, axes});  // batch whole, seq from 1
  const ValueId two = b.constant<int64_t>("two", {1}, {2});
  const ValueId end = b.input("end", DType::kI64, {1});  // computed at run time
  const ValueId unknown = b.op("Slice", {x, two, end, b.constant<int64_t>("axis2", {1}, {2})});
  const ValueId no_axes = b.op("Slice", {x, two, end});  // axes [0], from the length of starts
  const ValueId any_axes = b.op("Slice", {x, two, end, b.input("axes3", DType::kI64, {1})});
  EXPECT_EQ(inferredTypes(b, {kept, unknown, no_axes, any_axes}),
            (std::vector<std::string>{"f32[batch, ?, 8]", "f32[batch, seq, ?]", "f32[?, seq, 8]", "f32[?, ?, ?]"}));
}

TEST(Slice, AttributesBeforeOpset10) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {10, 20});
  Attributes attributes{
      {"starts", std::vector<int64_t>{2}}, {"ends", std::vector<int64_t>{-2}}, {"axes", std::vector<int64_t>{1}}};
  EXPECT_EQ(inferredType(b, b.op("Slice", {x}, attributes), 9), "f32[10, 16]");
}

TEST(Slice, InvalidArgumentsAreRefused) {
  GraphBuilder zero;
  const ValueId x = zero.input("x", DType::kF32, {10});
  const ValueId c = zero.constant<int64_t>("c", {1}, {0});
  zero.op("Slice", {x, c, zero.constant<int64_t>("e", {1}, {5}), c, zero.constant<int64_t>("s", {1}, {0})});
  EXPECT_TRUE(failsWith(zero, "steps[0] (for axis 0) is 0"));
  GraphBuilder lengths;
  const ValueId y = lengths.input("y", DType::kF32, {10, 10});
  lengths.op("Slice", {y, lengths.constant<int64_t>("s", {2}, {0, 0}), lengths.constant<int64_t>("e", {1}, {5})});
  EXPECT_TRUE(failsWith(lengths, "one value each per sliced axis, found 2, 1, 2 and 2"));
}

// ------------------------------------------------------ Gathers, Scatters

TEST(Gather, IndicesReplaceTheAxis) {
  GraphBuilder b;
  const ValueId data = b.input("data", parseType("f32[vocab, 512]"));
  const ValueId ids = b.input("ids", parseType("i64[batch, seq]"));
  const ValueId embedded = b.op("Gather", {data, ids});
  const ValueId x = b.input("x", DType::kF32, {5, 4, 3});
  const ValueId column = b.op("Gather", {x, b.constant<int64_t>("i", {}, {2})}, {{"axis", int64_t{1}}});
  const ValueId picked =
      b.op("Gather", {x, b.constant<int32_t>("j", {2, 7}, std::vector<int32_t>(14, 0))}, {{"axis", int64_t{-1}}});
  EXPECT_EQ(inferredTypes(b, {embedded, column, picked}),
            (std::vector<std::string>{"f32[batch, seq, 512]", "f32[5, 3]", "f32[5, 4, 2, 7]"}));

  GraphBuilder bad;
  bad.op("Gather", {bad.input("x", DType::kF32, {3}), bad.input("i", DType::kF32, {1})});
  EXPECT_TRUE(failsWith(bad, "the indices (input 1) must be int32 or int64, found f32"));
  GraphBuilder axis;
  axis.op("Gather", {axis.input("x", DType::kF32, {3}), axis.input("i", DType::kI64, {1})}, {{"axis", int64_t{1}}});
  EXPECT_TRUE(failsWith(axis, "axis 1 is out of range for rank 1"));
}

TEST(Gather, ElementsAndNd) {
  GraphBuilder b;
  const ValueId data = b.input("data", DType::kF32, {2, 3, 4});
  const ValueId elements = b.op("GatherElements", {data, b.input("i", DType::kI64, {2, 3, 1})}, {{"axis", int64_t{2}}});
  const ValueId nd = b.op("GatherND", {data, b.input("j", DType::kI64, {5, 2})});
  const ValueId batched = b.op("GatherND", {data, b.input("k", DType::kI64, {2, 1})}, {{"batch_dims", int64_t{1}}});
  EXPECT_EQ(inferredTypes(b, {elements, nd, batched}),
            (std::vector<std::string>{"f32[2, 3, 1]", "f32[5, 4]", "f32[2, 4]"}));

  GraphBuilder deep;
  deep.op("GatherND", {deep.input("d", DType::kF32, {2, 3}), deep.input("i", DType::kI64, {4, 3})});
  EXPECT_TRUE(failsWith(deep, "the indices [4, 3] address 3 dimensions, but the data [2, 3] has 2"));
  GraphBuilder rank;
  rank.op("GatherElements", {rank.input("d", DType::kF32, {2, 3}), rank.input("i", DType::kI64, {2})});
  EXPECT_TRUE(failsWith(rank, "the data [2, 3] and the indices [2] must have the same rank"));
}

TEST(Scatter, OutputIsTheData) {
  GraphBuilder b;
  const ValueId data = b.input("data", parseType("f32[batch, 8]"));
  const ValueId nd = b.op("ScatterND", {data, b.input("i", DType::kI64, {3, 2}), b.input("u", DType::kF32, {3})});
  const ValueId elements =
      b.op("ScatterElements", {data, b.input("j", DType::kI64, {1, 2}), b.input("v", DType::kF32, {1, 2})},
           {{"axis", int64_t{1}}});
  EXPECT_EQ(inferredTypes(b, {nd, elements}), (std::vector<std::string>{"f32[batch, 8]", "f32[batch, 8]"}));

  GraphBuilder bad;
  bad.op("ScatterElements",
         {bad.input("d", DType::kF32, {2, 3}), bad.input("i", DType::kI64, {2}), bad.input("u", DType::kF32, {2})});
  EXPECT_TRUE(failsWith(bad, "input 1 [2] must have the rank of the data [2, 3]"));
}

// ------------------------------------------------- Expand, Tile, Pad, ...

TEST(Expand, BroadcastsToTheShape) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[3, 1]"));
  const ValueId y = b.op("Expand", {x, b.constant<int64_t>("s", {3}, {2, 1, 4})});
  const ValueId z = b.op("Expand", {b.input("z", parseType("f32[batch, 1]")), b.constant<int64_t>("t", {1}, {5})});
  EXPECT_EQ(inferredTypes(b, {y, z}), (std::vector<std::string>{"f32[2, 3, 4]", "f32[batch, 5]"}));

  GraphBuilder bad;
  bad.op("Expand", {bad.input("x", DType::kF32, {3}), bad.constant<int64_t>("s", {1}, {4})});
  EXPECT_TRUE(failsWith(bad, "cannot broadcast [3] against [4]"));
}

TEST(Tile, MultipliesEachDim) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("i32[2, batch, 3]"));
  const ValueId y = b.op("Tile", {x, b.constant<int64_t>("r", {3}, {3, 1, 0})});
  const ValueId z = b.op("Tile", {x, b.constant<int64_t>("q", {3}, {1, 2, 1})});
  EXPECT_EQ(inferredTypes(b, {y, z}), (std::vector<std::string>{"i32[6, batch, 0]", "i32[2, ?, 3]"}));

  GraphBuilder bad;
  bad.op("Tile", {bad.input("x", DType::kF32, {2, 3}), bad.constant<int64_t>("r", {1}, {2})});
  EXPECT_TRUE(failsWith(bad, "repeats has 1 values but the input [2, 3] has rank 2"));
}

TEST(Pad, PadsFromAnInputSinceOpset11) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[N, 3, 4, 4]"));
  const ValueId y = b.op("Pad", {x, b.constant<int64_t>("p", {8}, {0, 0, 1, 2, 0, 0, 1, -1})});
  const ValueId z = b.op("Pad", {x, b.op("Shape", {b.input("q", DType::kF32, {8})})});  // computed pads
  EXPECT_EQ(inferredTypes(b, {y, z}), (std::vector<std::string>{"f32[N, 3, 6, 5]", "f32[?, ?, ?, ?]"}));

  GraphBuilder old;
  const ValueId x2 = old.input("x", DType::kF32, {2, 3});
  EXPECT_EQ(inferredType(old, old.op("Pad", {x2}, ints("pads", {1, 0, 1, 0})), 10), "f32[4, 3]");

  GraphBuilder axes;  // opset 18: pads for the listed axes only
  const ValueId x3 = axes.input("x", DType::kF32, {2, 3, 4});
  const ValueId padded =
      axes.op("Pad", {x3, axes.constant<int64_t>("p", {2}, {2, 3}), kNoValue, axes.constant<int64_t>("a", {1}, {-1})});
  EXPECT_EQ(inferredType(axes, padded, 18), "f32[2, 3, 9]");

  GraphBuilder bad;
  bad.op("Pad", {bad.input("x", DType::kF32, {2, 3}), bad.constant<int64_t>("p", {2}, {1, 1})});
  EXPECT_TRUE(failsWith(bad, "pads has 2 values; 4 expected (a begin and an end for each of 2 axes)"));
}

TEST(ShapeAndSize, GiveInt64) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 3, 4]"));
  const ValueId shape = b.op("Shape", {x});
  const ValueId size = b.op("Size", {x});
  const ValueId unknown = b.op("Shape", {b.input("u", parseType("f32[*]"))});
  EXPECT_EQ(inferredTypes(b, {shape, size, unknown}), (std::vector<std::string>{"i64[3]", "i64[]", "i64[?]"}));

  GraphBuilder ranged;  // opset 15: start and end
  const ValueId y = ranged.input("y", DType::kF32, {1, 2, 3, 4});
  const ValueId tail = ranged.op("Shape", {y}, {{"start", int64_t{1}}});
  const ValueId middle = ranged.op("Shape", {y}, {{"start", int64_t{-3}}, {"end", int64_t{-1}}});
  const ValueId none = ranged.op("Shape", {y}, {{"start", int64_t{3}}, {"end", int64_t{1}}});
  EXPECT_EQ(inferredTypes(ranged, {tail, middle, none}, 15), (std::vector<std::string>{"i64[3]", "i64[2]", "i64[0]"}));
}

TEST(Constants, ConstantOfShapeAndConstant) {
  GraphBuilder b;
  const ValueId shape = b.constant<int64_t>("s", {2}, {2, 3});
  const ValueId zeros = b.op("ConstantOfShape", {shape});
  const ConstantPtr one = makeConstant(TensorInfo{DType::kI32, {1}}, std::vector<std::byte>(4));
  const ValueId ints32 = b.op("ConstantOfShape", {shape}, {{"value", one}});
  const ValueId computed = b.op("ConstantOfShape", {b.op("Shape", {b.input("x", DType::kF32, {1, 2, 3})})});
  const ConstantPtr matrix = makeConstant(TensorInfo{DType::kF16, {2, 2}}, std::vector<std::byte>(8));
  const ValueId tensor = b.op("Constant", {}, {{"value", matrix}});
  const ValueId list = b.op("Constant", {}, ints("value_ints", {1, 2, 3}));
  const ValueId scalar = b.op("Constant", {}, {{"value_float", 0.5f}});
  EXPECT_EQ(inferredTypes(b, {zeros, ints32, computed, tensor, list, scalar}),
            (std::vector<std::string>{"f32[2, 3]", "i32[2, 3]", "f32[?, ?, ?]", "f16[2, 2]", "i64[3]", "f32[]"}));

  GraphBuilder none;
  none.op("Constant", {});
  EXPECT_TRUE(failsWith(none, "needs exactly one of value, value_float, value_floats, value_int, value_ints"));
  GraphBuilder negative;
  negative.op("ConstantOfShape", {negative.constant<int64_t>("s", {2}, {2, -3})});
  EXPECT_TRUE(failsWith(negative, "the shape [2, -3] has the negative size -3"));
}

// ---------------------------------------------------------------- Resize

TEST(Resize, FromScalesOrSizes) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[N, 3, 8, 10]"));
  const ValueId scales = b.constant<float>("scales", {4}, {1.0f, 1.0f, 2.0f, 0.5f});
  const ValueId scaled = b.op("Resize", {x, kNoValue, scales});
  const ValueId empty = b.constant<float>("empty", {0}, {});
  const ValueId sizes = b.constant<int64_t>("sizes", {4}, {1, 3, 32, 32});
  const ValueId sized = b.op("Resize", {x, empty, empty, sizes});
  const ValueId computed = b.op("Resize", {x, kNoValue, kNoValue, b.op("Shape", {x})});
  EXPECT_EQ(inferredTypes(b, {scaled, sized, computed}),
            (std::vector<std::string>{"f32[N, 3, 16, 5]", "f32[1, 3, 32, 32]", "f32[?, ?, ?, ?]"}));
}

TEST(Resize, AxesAndAspectRatioFromOpset18) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1, 3, 100, 200});
  const ValueId sizes = b.constant<int64_t>("sizes", {2}, {50, 50});
  Attributes not_larger{{"axes", std::vector<int64_t>{2, 3}}, {"keep_aspect_ratio_policy", std::string("not_larger")}};
  Attributes not_smaller{{"axes", std::vector<int64_t>{2, 3}},
                         {"keep_aspect_ratio_policy", std::string("not_smaller")}};
  const ValueId fit = b.op("Resize", {x, kNoValue, kNoValue, sizes}, not_larger);
  const ValueId cover = b.op("Resize", {x, kNoValue, kNoValue, sizes}, not_smaller);
  EXPECT_EQ(inferredTypes(b, {fit, cover}, 18), (std::vector<std::string>{"f32[1, 3, 25, 50]", "f32[1, 3, 50, 100]"}));
}

TEST(Resize, UpsampleAndOpset10) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1, 3, 4, 4});
  const ValueId scales = b.constant<float>("scales", {4}, {1.0f, 1.0f, 2.0f, 3.0f});
  const ValueId upsampled = b.op("Upsample", {x, scales});
  const ValueId resized = b.op("Resize", {x, scales});
  EXPECT_EQ(inferredTypes(b, {upsampled, resized}, 10),
            (std::vector<std::string>{"f32[1, 3, 8, 12]", "f32[1, 3, 8, 12]"}));

  GraphBuilder old;
  const ValueId y = old.input("y", DType::kF32, {1, 1, 2, 2});
  EXPECT_EQ(inferredType(old, old.op("Upsample", {y}, {{"scales", std::vector<float>{1, 1, 2, 2}}}), 7),
            "f32[1, 1, 4, 4]");
}

TEST(Resize, InvalidArgumentsAreRefused) {
  GraphBuilder none;
  none.op("Resize", {none.input("x", DType::kF32, {1, 3, 4, 4}), kNoValue});
  EXPECT_TRUE(failsWith(none, "needs either scales or sizes"));
  GraphBuilder count;
  const ValueId x = count.input("x", DType::kF32, {1, 3, 4, 4});
  count.op("Resize", {x, kNoValue, count.constant<float>("s", {2}, {2.0f, 2.0f})});
  EXPECT_TRUE(failsWith(count, "scales has 2 values for the 4 resized axes of [1, 3, 4, 4]"));
}

// ------------------------------------------------------------ Range, misc

TEST(Range, LengthFromConstantBounds) {
  GraphBuilder b;
  const ValueId ints = b.op("Range", {b.constant<int64_t>("a", {}, {0}), b.constant<int64_t>("b", {}, {10}),
                                      b.constant<int64_t>("c", {}, {3})});
  const ValueId down = b.op("Range", {b.constant<int32_t>("d", {}, {10}), b.constant<int32_t>("e", {}, {4}),
                                      b.constant<int32_t>("f", {}, {-2})});
  const ValueId floats = b.op("Range", {b.constant<float>("g", {}, {1.0f}), b.constant<float>("h", {}, {2.0f}),
                                        b.constant<float>("i", {}, {0.25f})});
  const ValueId computed = b.op(
      "Range", {b.constant<int64_t>("j", {}, {0}), b.input("n", DType::kI64, {}), b.constant<int64_t>("k", {}, {1})});
  EXPECT_EQ(inferredTypes(b, {ints, down, floats, computed}),
            (std::vector<std::string>{"i64[4]", "i32[3]", "f32[4]", "i64[?]"}));

  GraphBuilder zero;
  zero.op("Range", {zero.constant<int64_t>("a", {}, {0}), zero.constant<int64_t>("b", {}, {10}),
                    zero.constant<int64_t>("c", {}, {0})});
  EXPECT_TRUE(failsWith(zero, "delta is 0"));
}

TEST(DepthToSpace, MovesChannelsIntoSpaceAndBack) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[N, 16, 5, 6]"));
  const ValueId space = b.op("DepthToSpace", {x}, {{"blocksize", int64_t{2}}});
  const ValueId depth = b.op("SpaceToDepth", {space}, {{"blocksize", int64_t{2}}});
  EXPECT_EQ(inferredTypes(b, {space, depth}), (std::vector<std::string>{"f32[N, 4, 10, 12]", "f32[N, 16, 5, 6]"}));

  GraphBuilder bad;
  bad.op("SpaceToDepth", {bad.input("x", DType::kF32, {1, 3, 5, 6})}, {{"blocksize", int64_t{2}}});
  EXPECT_TRUE(failsWith(bad, "dimension 2 of [1, 3, 5, 6] (5) does not divide by 2"));
}

TEST(TopK, ValuesAndInt64Indices) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 100]"));
  const auto top = b.ops("TopK", {x, b.constant<int64_t>("k", {1}, {5})}, 2);
  const auto computed = b.ops("TopK", {x, b.input("k2", DType::kI64, {1})}, 2, {{"axis", int64_t{1}}});
  EXPECT_EQ(inferredTypes(b, {top[0], top[1], computed[0]}),
            (std::vector<std::string>{"f32[batch, 5]", "i64[batch, 5]", "f32[batch, ?]"}));

  GraphBuilder old;
  const auto old_top = old.ops("TopK", {old.input("x", DType::kF32, {3, 8})}, 2, {{"k", int64_t{2}}});
  EXPECT_EQ(inferredType(old, old_top[1], 9), "i64[3, 2]");

  GraphBuilder bad;
  bad.ops("TopK", {bad.input("x", DType::kF32, {3}), bad.constant<int64_t>("k", {1}, {4})}, 2);
  EXPECT_TRUE(failsWith(bad, "k 4 is larger than axis 0 of [3] (size 3)"));
}

TEST(MiscOps, NonZeroTriluCumSumOneHot) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[batch, 4, 4]"));
  const ValueId nonzero = b.op("NonZero", {x});
  const ValueId upper = b.op("Trilu", {x});
  const ValueId sums = b.op("CumSum", {x, b.constant<int64_t>("axis", {}, {-1})});
  const ValueId ids = b.input("ids", parseType("i64[batch, seq]"));
  const ValueId values = b.constant<float>("values", {2}, {0.0f, 1.0f});
  const ValueId hot = b.op("OneHot", {ids, b.constant<int64_t>("depth", {}, {10}), values});
  const ValueId first = b.op("OneHot", {ids, b.constant<float>("depth2", {1}, {3.0f}), values}, {{"axis", int64_t{0}}});
  EXPECT_EQ(inferredTypes(b, {nonzero, upper, sums, hot, first}),
            (std::vector<std::string>{"i64[3, ?]", "f32[batch, 4, 4]", "f32[batch, 4, 4]", "f32[batch, seq, 10]",
                                      "f32[3, batch, seq]"}));

  GraphBuilder vector;
  vector.op("Trilu", {vector.input("x", DType::kF32, {4})});
  EXPECT_TRUE(failsWith(vector, "needs an input of rank 2 or more, found [4]"));
  GraphBuilder axis;
  axis.op("CumSum", {axis.input("x", DType::kF32, {4}), axis.constant<int64_t>("a", {}, {1})});
  EXPECT_TRUE(failsWith(axis, "axis 1 is out of range for rank 1"));
}

// Unique of a constant whose slices are empty: one unique slice along a
// vast axis (inference once sorted its 2^40 slice indices: 8 TiB asked of
// malloc; found by graph_run_fuzz), none along an empty one.
TEST(MiscOps, UniqueOfEmptySlicesAlongAVastAxis) {
  const int64_t vast = int64_t{1} << 40;
  GraphBuilder b;
  const ValueId empty = b.constant<float>("empty", {vast, 0}, {});
  const auto along = b.ops("Unique", {empty}, 4, {{"axis", int64_t{0}}});
  const auto flat = b.ops("Unique", {empty}, 2);
  const auto across = b.ops("Unique", {b.constant<float>("none", {0, vast}, {})}, 1, {{"axis", int64_t{0}}});
  EXPECT_EQ(inferredTypes(b, {along[0], along[1], along[2], along[3], flat[0], flat[1], across[0]}),
            (std::vector<std::string>{"f32[1, 0]", "i64[1]", "i64[1099511627776]", "i64[1]", "f32[0]", "i64[0]",
                                      "f32[0, 1099511627776]"}));
}

TEST(ShapeOps, UnknownRankInputsGiveUnknownShapes) {
  GraphBuilder b;
  const ValueId x = b.input("x", parseType("f32[*]"));
  std::vector<ValueId> outputs{
      b.op("Transpose", {x}),
      b.op("Squeeze", {x}),
      b.op("Unsqueeze", {x, b.constant<int64_t>("axes", {1}, {0})}),
      b.op("Slice", {x, b.constant<int64_t>("s", {1}, {0}), b.constant<int64_t>("e", {1}, {1})}),
      b.op("Gather", {x, b.input("i", DType::kI64, {2})}),
      b.op("Flatten", {x}),
      b.op("Reshape", {x, b.constant<int64_t>("shape", {2}, {0, -1})}),
  };
  EXPECT_EQ(inferredTypes(b, outputs),
            (std::vector<std::string>{"f32[*]", "f32[*]", "f32[*]", "f32[*]", "f32[*]", "f32[?, ?]", "f32[?, ?]"}));
}

}  // namespace
}  // namespace kiln

// Type and shape inference of src/ops/indexing_ops.cc, and of the
// shape_ops.cc operators whose sizes come from constant inputs.
#include <gtest/gtest.h>

#include "kiln/error.h"
#include "kiln/graph_builder.h"
#include "ops/shape_inference.h"
#include "tests/ops/inference_test_util.h"

namespace kiln {
namespace {

using testing::failsWith;
using testing::inferredType;
using testing::parseType;

TEST(IndexingOps, SizesFromConstantInputs) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {3, 8});
  const ValueId k = b.constant<int64_t>("k", {1}, {2});
  const std::vector<ValueId> top = b.ops("TopK", {x, k}, 2);
  const ValueId hot = b.op("OneHot", {b.input("i", DType::kI64, {4}), b.constant<float>("depth", {}, {5}),
                                      b.constant<float>("values", {2}, {0, 1})},
                           {{"axis", int64_t{0}}});
  const ValueId range = b.op("Range", {b.constant<float>("s", {}, {1}), b.constant<float>("l", {}, {2}),
                                       b.constant<float>("d", {}, {0.3f})});
  const ValueId filled = b.op("ConstantOfShape", {b.constant<int64_t>("shape", {2}, {2, 7})});
  EXPECT_EQ(testing::inferredTypes(b, {top[0], top[1], hot, range, filled}, 18),
            (std::vector<std::string>{"f32[3, 2]", "i64[3, 2]", "f32[5, 4]", "f32[4]", "f32[2, 7]"}));
}

TEST(IndexingOps, ComputedSizesStayUnknown) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {3, 8});
  const std::vector<ValueId> top = b.ops("TopK", {x, b.input("k", DType::kI64, {1})}, 2);
  const ValueId crop = b.op("CenterCropPad", {x, b.input("shape", DType::kI64, {1})}, {{"axes", std::vector<int64_t>{1}}});
  EXPECT_EQ(testing::inferredTypes(b, {top[0], crop}, 18), (std::vector<std::string>{"f32[3, ?]", "f32[3, ?]"}));
}

TEST(IndexingOps, CenterCropPadCol2ImAndMaxUnpool) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {20, 10, 3});
  const ValueId crop = b.op("CenterCropPad", {x, b.constant<int64_t>("shape", {2}, {5, 12})},
                            {{"axes", std::vector<int64_t>{0, -2}}});
  const ValueId columns = b.input("columns", DType::kF32, {1, 10, 12});
  const ValueId image = b.op("Col2Im", {columns, b.constant<int64_t>("image", {2}, {5, 5}),
                                        b.constant<int64_t>("block", {2}, {1, 5})});
  const ValueId pooled = b.input("pooled", DType::kF32, {1, 1, 2, 2});
  const ValueId unpooled = b.op("MaxUnpool", {pooled, b.input("indices", DType::kI64, {1, 1, 2, 2})},
                                {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}});
  EXPECT_EQ(testing::inferredTypes(b, {crop, image, unpooled}, 22),
            (std::vector<std::string>{"f32[5, 12, 3]", "f32[1, 2, 5, 5]", "f32[1, 1, 4, 4]"}));
}

TEST(IndexingOps, EinsumShapes) {
  GraphBuilder b;
  const ValueId a = b.input("a", DType::kF32, {5, 2, 3});
  const ValueId c = b.input("c", DType::kF32, {5, 3, 4});
  const ValueId bmm = b.op("Einsum", {a, c}, {{"equation", std::string("bij,bjk->bik")}});
  const ValueId implicit = b.op("Einsum", {a}, {{"equation", std::string("...ij")}});
  const ValueId trace = b.op("Einsum", {b.input("m", DType::kF32, {3, 3})}, {{"equation", std::string("ii")}});
  EXPECT_EQ(testing::inferredTypes(b, {bmm, implicit, trace}, 12),
            (std::vector<std::string>{"f32[5, 2, 4]", "f32[5, 2, 3]", "f32[]"}));

  GraphBuilder bad;
  bad.op("Einsum", {bad.input("a", DType::kF32, {2, 3}), bad.input("b", DType::kF32, {4, 2})},
         {{"equation", std::string("ij,jk->ik")}});
  EXPECT_TRUE(failsWith(bad, "label 'j' has sizes 3 and 4", 12));
}

TEST(IndexingOps, EyeLikeBitCastDetAndTensorScatter) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kI32, {3, 4});
  const ValueId eye = b.op("EyeLike", {x}, {{"dtype", int64_t{1}}});
  const ValueId cast = b.op("BitCast", {x}, {{"to", int64_t{1}}});
  const ValueId det = b.op("Det", {b.input("m", DType::kF64, {2, 3, 3})});
  const ValueId cache = b.op("TensorScatter", {b.input("cache", DType::kF32, {2, 1, 8, 4}),
                                               b.input("update", DType::kF32, {2, 1, 3, 4})});
  EXPECT_EQ(testing::inferredTypes(b, {eye, cast, det, cache}, 26),
            (std::vector<std::string>{"f32[3, 4]", "f32[3, 4]", "f64[2]", "f32[2, 1, 8, 4]"}));

  GraphBuilder wide;
  wide.op("BitCast", {wide.input("x", DType::kI32, {3})}, {{"to", int64_t{7}}});
  EXPECT_TRUE(failsWith(wide, "their sizes differ", 26));
}

}  // namespace
}  // namespace kiln

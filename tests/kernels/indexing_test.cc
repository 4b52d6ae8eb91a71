// Indexing, scatter/gather and shape-manipulation kernels (indexing.cc)
// against references written out plainly here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "kiln/error.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/support/allocation_counter.h"

namespace kiln {
namespace {

using ::kiln::testing::elementCount;
using ::kiln::testing::omitted;
using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::params;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::kiln::testing::randomValues;
using ::kiln::testing::unravel;
using ::testing::HasSubstr;
using Shape = std::vector<int64_t>;

// Runs `op` and returns output `index` as T.
template <typename T>
std::vector<T> run(const std::string& op, std::vector<Operand> inputs, std::vector<Operand> outputs,
                   const ParamMap& p = {}, size_t index = 0) {
  PreparedKernel(op, inputs, outputs, p).run(inputs, outputs);
  return outputs[index].values<T>();
}

int64_t ravel(const Shape& coords, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + coords[d];
  return flat;
}

TEST(Shape, StartAndEndSelectDims) {
  EXPECT_EQ(run<int64_t>("Shape", {output(DType::kF32, {2, 3, 4, 5})}, {output(DType::kI64, {2})},
                         params({{"start", int64_t{1}}, {"end", int64_t{-1}}})),
            (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(run<int64_t>("Size", {output(DType::kU8, {2, 3, 4})}, {output(DType::kI64, {})}),
            (std::vector<int64_t>{24}));
}

TEST(ConstantOfShape, FillsWithTheValue) {
  EXPECT_EQ(run<int32_t>("ConstantOfShape", {operand<int64_t>({2}, {2, 3})}, {output(DType::kI32, {2, 3})},
                         params({{"value", int64_t{7}}})),
            std::vector<int32_t>(6, 7));
  EXPECT_EQ(run<float>("ConstantOfShape", {operand<int64_t>({1}, {4})}, {output(DType::kF32, {4})}),
            std::vector<float>(4, 0.0f));
  EXPECT_THAT(prepareError("ConstantOfShape", {operand<int64_t>({1}, {4}, true)}, {output(DType::kF32, {5})}),
              HasSubstr("output is f32[5]"));
}

TEST(GatherElements, GathersAlongTheAxisWithNegativeIndices) {
  const Shape data_shape{3, 4}, index_shape{2, 4};
  const std::vector<float> data = randomValues<float>(12, 1, -1, 1);
  const std::vector<int64_t> indices{0, -1, 2, 1, 2, 0, -3, 1};
  for (int64_t axis : {0, 1}) {
    Shape ishape = axis == 0 ? index_shape : Shape{3, 2};
    std::vector<int64_t> idx(indices.begin(), indices.begin() + static_cast<int64_t>(elementCount(ishape)));
    const std::vector<float> got = run<float>("GatherElements", {operand(data_shape, data), operand(ishape, idx)},
                                              {output(DType::kF32, ishape)}, params({{"axis", axis}}));
    for (size_t i = 0; i < got.size(); ++i) {
      Shape c = unravel(ishape, static_cast<int64_t>(i));
      int64_t at = idx[i] < 0 ? idx[i] + data_shape[static_cast<size_t>(axis)] : idx[i];
      c[static_cast<size_t>(axis)] = at;
      EXPECT_EQ(got[i], data[static_cast<size_t>(ravel(c, data_shape))]) << "axis " << axis << " element " << i;
    }
  }
  EXPECT_THAT(prepareError("GatherElements", {operand(data_shape, data), operand<int64_t>({1, 1}, {3}, true)},
                           {output(DType::kF32, {1, 1})}),
              HasSubstr("index 3 is out of range"));
}

TEST(GatherND, BatchDimsAndSlices) {
  // data [2, 3, 2], batch_dims 1, indices [2, 1, 1]: each batch picks a row.
  const std::vector<int32_t> data{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  EXPECT_EQ(run<int32_t>("GatherND", {operand<int32_t>({2, 3, 2}, data), operand<int64_t>({2, 1, 1}, {2, 0})},
                         {output(DType::kI32, {2, 1, 2})}, params({{"batch_dims", int64_t{1}}})),
            (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(run<int32_t>("GatherND", {operand<int32_t>({2, 3, 2}, data), operand<int64_t>({2, 3}, {1, 2, 1, 0, -1, 0})},
                         {output(DType::kI32, {2})}),
            (std::vector<int32_t>{11, 4}));
}

TEST(ScatterElements, Reductions) {
  const std::vector<float> data{1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> indices{1, 1, 0};
  const std::vector<float> updates{10, 20, 30};
  auto scatter = [&](const char* reduction) {
    return run<float>("ScatterElements",
                      {operand<float>({2, 3}, data), operand<int64_t>({1, 3}, indices), operand<float>({1, 3}, updates)},
                      {output(DType::kF32, {2, 3})}, params({{"axis", int64_t{0}}, {"reduction", std::string(reduction)}}));
  };
  EXPECT_EQ(scatter("none"), (std::vector<float>{1, 2, 30, 10, 20, 6}));
  EXPECT_EQ(scatter("add"), (std::vector<float>{1, 2, 33, 14, 25, 6}));
  EXPECT_EQ(scatter("mul"), (std::vector<float>{1, 2, 90, 40, 100, 6}));
  EXPECT_EQ(scatter("max"), (std::vector<float>{1, 2, 30, 10, 20, 6}));
  EXPECT_EQ(scatter("min"), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  // Duplicate indices accumulate in order.
  EXPECT_EQ(run<int32_t>("ScatterElements",
                         {operand<int32_t>({1, 3}, {1, 2, 3}), operand<int64_t>({1, 2}, {1, 1}),
                          operand<int32_t>({1, 2}, {5, 7})},
                         {output(DType::kI32, {1, 3})}, params({{"axis", int64_t{1}}, {"reduction", std::string("add")}})),
            (std::vector<int32_t>{1, 14, 3}));
  // Integers wrap (INT64_MIN * -2 was undefined behaviour; graph_run_fuzz).
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  auto scatter64 = [](const char* reduction, int64_t into, int64_t update) {
    return run<int64_t>("ScatterElements",
                        {operand<int64_t>({1}, {into}), operand<int64_t>({1}, {0}), operand<int64_t>({1}, {update})},
                        {output(DType::kI64, {1})}, params({{"reduction", std::string(reduction)}}));
  };
  EXPECT_EQ(scatter64("mul", kMin, -2), (std::vector<int64_t>{0}));
  EXPECT_EQ(scatter64("add", kMin, -1), (std::vector<int64_t>{std::numeric_limits<int64_t>::max()}));
}

TEST(ScatterND, SlicesWithReduction) {
  std::vector<float> data(2 * 2 * 2, 1.0f);
  EXPECT_EQ(run<float>("ScatterND",
                       {operand<float>({2, 2, 2}, data), operand<int64_t>({2, 1}, {1, 1}),
                        operand<float>({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8})},
                       {output(DType::kF32, {2, 2, 2})}, params({{"reduction", std::string("add")}})),
            (std::vector<float>{1, 1, 1, 1, 7, 9, 11, 13}));
  EXPECT_EQ(run<float>("ScatterND",
                       {operand<float>({2, 2, 2}, data), operand<int64_t>({1, 3}, {0, 1, 0}), operand<float>({1}, {9})},
                       {output(DType::kF32, {2, 2, 2})}),
            (std::vector<float>{1, 1, 9, 1, 1, 1, 1, 1}));
}

TEST(TensorScatter, LinearAndCircularWrites) {
  // cache [2, 4, 1], update [2, 2, 1], axis 1.
  const std::vector<float> cache{0, 0, 0, 0, 0, 0, 0, 0};
  const std::vector<float> update{1, 2, 3, 4};
  auto scatter = [&](const char* mode, std::vector<int64_t> indices) {
    return run<float>("TensorScatter",
                      {operand<float>({2, 4, 1}, cache), operand<float>({2, 2, 1}, update),
                       operand<int64_t>({2}, std::move(indices))},
                      {output(DType::kF32, {2, 4, 1})}, params({{"axis", int64_t{1}}, {"mode", std::string(mode)}}));
  };
  EXPECT_EQ(scatter("linear", {1, 2}), (std::vector<float>{0, 1, 2, 0, 0, 0, 3, 4}));
  EXPECT_EQ(scatter("circular", {3, 0}), (std::vector<float>{2, 0, 0, 1, 3, 4, 0, 0}));
}

TEST(Trilu, UpperAndLowerWithK) {
  const std::vector<int32_t> x{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  auto trilu = [&](int64_t upper, int64_t k, bool constant) {
    return run<int32_t>("Trilu", {operand<int32_t>({3, 4}, x), operand<int64_t>({}, {k}, constant)},
                        {output(DType::kI32, {3, 4})}, params({{"upper", upper}}));
  };
  EXPECT_EQ(trilu(1, 0, true), (std::vector<int32_t>{1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12}));
  EXPECT_EQ(trilu(1, 1, false), (std::vector<int32_t>{0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12}));
  EXPECT_EQ(trilu(0, -1, false), (std::vector<int32_t>{0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0}));
  EXPECT_EQ(trilu(0, 5, true), x);
}

// Found by graph_run_fuzz (UBSan, undefined behaviour; make test-asan
// runs these): extreme operands that overflowed signed arithmetic.
TEST(Trilu, ExtremeKAndEmptyMatricesDoNotOverflow) {
  const std::vector<int32_t> x{1, 2, 3, 4};
  auto trilu = [&](int64_t upper, int64_t k) {
    return run<int32_t>("Trilu", {operand<int32_t>({2, 2}, x), operand<int64_t>({}, {k})}, {output(DType::kI32, {2, 2})},
                        params({{"upper", upper}}));
  };
  EXPECT_EQ(trilu(1, INT64_MAX), (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(trilu(1, INT64_MIN), x);
  EXPECT_EQ(trilu(0, INT64_MAX), x);
  EXPECT_EQ(trilu(0, INT64_MIN), (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_TRUE(run<int32_t>("Trilu", {operand<int32_t>({0, INT64_MAX}, {}), operand<int64_t>({}, {1})},
                           {output(DType::kI32, {0, INT64_MAX})})
                  .empty());
}

TEST(OneHot, IndicesAndDepthWithoutAnIntegerValue) {
  // NaN and 1e30 have no int64 value (casting them is undefined): such an
  // index sets nothing, such a depth matches no output.
  EXPECT_EQ(run<float>("OneHot", {operand<float>({2}, {NAN, 1e30f}), operand<int64_t>({}, {2}), operand<float>({2}, {0, 1})},
                       {output(DType::kF32, {2, 2})}),
            (std::vector<float>{0, 0, 0, 0}));
  EXPECT_THAT(prepareError("OneHot",
                           {operand<int64_t>({1}, {0}), operand<float>({}, {1e30f}, true), operand<float>({2}, {0, 1})},
                           {output(DType::kF32, {1, 2})}),
              HasSubstr("OneHot: depth is"));
}

TEST(GatherND, HugeIndicesGiveZerosWithoutOverflow) {
  EXPECT_EQ(run<float>("GatherND", {operand<float>({2, 2}, {1, 2, 3, 4}), operand<int64_t>({2, 2}, {int64_t{1} << 62, 0, 1, 1})},
                       {output(DType::kF32, {2})}),
            (std::vector<float>{0, 4}));
}

TEST(CumSum, IntegerSumsWrap) {
  EXPECT_EQ(run<int64_t>("CumSum", {operand<int64_t>({3}, {INT64_MAX, 1, 1}), operand<int64_t>({}, {0}, true)},
                         {output(DType::kI64, {3})}),
            (std::vector<int64_t>{INT64_MAX, INT64_MIN, INT64_MIN + 1}));
  EXPECT_EQ(run<int64_t>("CumProd", {operand<int64_t>({2}, {int64_t{1} << 62, 4}), operand<int64_t>({}, {0}, true)},
                         {output(DType::kI64, {2})}),
            (std::vector<int64_t>{int64_t{1} << 62, 0}));
}

// An empty tensor whose other dimensions are vast: nothing to do, at once
// (the scan once looped over the 2^40 x 2^20 outer rows of the empty inner
// axis).
TEST(CumSum, EmptyTensorWithVastDimensionsReturnsAtOnce) {
  for (int64_t axis : {0, 1, 2}) {
    const Shape shape{int64_t{1} << 40, int64_t{1} << 20, 0};
    Operand x = operand<float>(shape, {});
    std::vector<Operand> outputs{output(DType::kF32, shape)};
    std::vector<Operand> inputs{x, operand<int64_t>({}, {axis}, true)};
    PreparedKernel("CumSum", inputs, outputs).run(inputs, outputs);
    EXPECT_TRUE(outputs[0].values<float>().empty()) << axis;
  }
}

// Unique along an axis of 2^31 empty slices: one unique slice, counted
// 2^31 times, without sorting them (the kernel once asked malloc for their
// 16 GiB of indices while constant folding ran it; graph_run_fuzz).
TEST(Unique, EmptySlicesAlongAVastAxisAreOneSlice) {
  const int64_t vast = int64_t{1} << 31;
  std::vector<Operand> inputs{operand<float>({vast, 0}, {})};
  std::vector<Operand> outputs{output(DType::kF32, {1, 0}), output(DType::kI64, {1}), omitted(),
                               output(DType::kI64, {1})};
  PreparedKernel("Unique", inputs, outputs, params({{"axis", int64_t{0}}, {"sorted", int64_t{0}}}))
      .run(inputs, outputs);
  EXPECT_EQ(outputs[1].values<int64_t>(), (std::vector<int64_t>{0}));
  EXPECT_EQ(outputs[3].values<int64_t>(), (std::vector<int64_t>{vast}));
}

// Unique along an empty axis under 2^40 outer rows: nothing unique, and no
// loop over the rows (constant folding once spun there; graph_run_fuzz).
TEST(Unique, AnEmptyAxisUnderVastOuterRowsReturnsAtOnce) {
  const int64_t vast = int64_t{1} << 40;
  std::vector<Operand> inputs{operand<int64_t>({vast, 0, 1}, {})};
  std::vector<Operand> outputs{output(DType::kI64, {vast, 0, 1}), output(DType::kI64, {0}),
                               output(DType::kI64, {0}), output(DType::kI64, {0})};
  PreparedKernel("Unique", inputs, outputs, params({{"axis", int64_t{-2}}, {"sorted", int64_t{0}}}))
      .run(inputs, outputs);
  EXPECT_TRUE(outputs[1].values<int64_t>().empty());
}

// Gather of no indices and Compress of an empty axis under 2^40 outer
// rows: empty outputs, and no loop over the rows (as Unique's above).
TEST(Gather, NoIndicesUnderVastOuterRowsReturnsAtOnce) {
  const int64_t vast = int64_t{1} << 40;
  std::vector<Operand> inputs{operand<float>({vast, 0, 1}, {}), operand<int64_t>({0}, {})};
  std::vector<Operand> outputs{output(DType::kF32, {vast, 0, 1})};
  PreparedKernel("Gather", inputs, outputs, params({{"axis", int64_t{1}}})).run(inputs, outputs);
  EXPECT_TRUE(outputs[0].values<float>().empty());
}

TEST(Compress, AnEmptyAxisUnderVastOuterRowsReturnsAtOnce) {
  const int64_t vast = int64_t{1} << 40;
  Operand none = operand<uint8_t>({0}, {});
  none.info.dtype = DType::kBool;
  std::vector<Operand> inputs{operand<float>({vast, 0, 1}, {}), none};
  std::vector<Operand> outputs{output(DType::kF32, {vast, 0, 1})};
  PreparedKernel("Compress", inputs, outputs, params({{"axis", int64_t{1}}})).run(inputs, outputs);
  EXPECT_TRUE(outputs[0].values<float>().empty());
}

TEST(TopK, LargestAndSmallestKeepLowerIndicesOnTies) {
  const std::vector<float> x{3, 1, 3, 2, 0, 5, 5, 1};
  std::vector<Operand> inputs{operand<float>({2, 4}, x), operand<int64_t>({1}, {2})};
  std::vector<Operand> outputs{output(DType::kF32, {2, 2}), output(DType::kI64, {2, 2})};
  PreparedKernel("TopK", inputs, outputs).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<float>(), (std::vector<float>{3, 3, 5, 5}));
  EXPECT_EQ(outputs[1].values<int64_t>(), (std::vector<int64_t>{0, 2, 1, 2}));
  std::vector<Operand> columns{output(DType::kF32, {1, 4}), output(DType::kI64, {1, 4})};
  inputs[1] = operand<int64_t>({1}, {1});
  PreparedKernel("TopK", inputs, columns, params({{"largest", int64_t{0}}, {"axis", int64_t{0}}})).run(inputs, columns);
  EXPECT_EQ(columns[0].values<float>(), (std::vector<float>{0, 1, 3, 1}));
  EXPECT_EQ(columns[1].values<int64_t>(), (std::vector<int64_t>{1, 0, 0, 1}));
}

// An empty input whose other dimensions are vast: nothing to sort (the
// loop once ran over 2^60 rows of an empty axis, as CumSum's did).
TEST(TopK, EmptyInputWithVastDimensionsReturnsAtOnce) {
  const Shape shape{int64_t{1} << 40, int64_t{1} << 20, 0};
  std::vector<Operand> inputs{operand<float>(shape, {}), operand<int64_t>({1}, {0})};
  std::vector<Operand> outputs{output(DType::kF32, shape), output(DType::kI64, shape)};
  PreparedKernel("TopK", inputs, outputs).run(inputs, outputs);
  EXPECT_TRUE(outputs[0].values<float>().empty());
}

TEST(OneHot, AxisAndNegativeIndices) {
  EXPECT_EQ(run<float>("OneHot",
                       {operand<int64_t>({3}, {0, -1, 7}), operand<float>({}, {3}), operand<float>({2}, {-1, 4})},
                       {output(DType::kF32, {3, 3})}),
            (std::vector<float>{4, -1, -1, -1, -1, 4, -1, -1, -1}));
  EXPECT_EQ(run<int32_t>("OneHot",
                         {operand<int32_t>({2}, {1, 0}), operand<int64_t>({}, {2}), operand<int32_t>({2}, {0, 1})},
                         {output(DType::kI32, {2, 2})}, params({{"axis", int64_t{0}}})),
            (std::vector<int32_t>{0, 1, 1, 0}));
}

// Indices [2^40, 0] with the depth axis between the two: 2^40 rows of no
// index each were walked (a hang, graph_run_fuzz).
TEST(OneHot, EmptyIndicesWalkNothing) {
  constexpr int64_t kRows = int64_t{1} << 40;
  EXPECT_TRUE(run<float>("OneHot",
                         {operand<int64_t>({kRows, 0}, {}), operand<int64_t>({}, {3}), operand<float>({2}, {0, 1})},
                         {output(DType::kF32, {kRows, 3, 0})}, params({{"axis", int64_t{1}}}))
                  .empty());
}

TEST(Range, IntegerAndFloat) {
  EXPECT_EQ(run<int32_t>("Range", {operand<int32_t>({}, {10}), operand<int32_t>({}, {4}), operand<int32_t>({}, {-3})},
                         {output(DType::kI32, {2})}),
            (std::vector<int32_t>{10, 7}));
  EXPECT_EQ(run<double>("Range", {operand<double>({}, {1}), operand<double>({}, {2}), operand<double>({}, {0.25})},
                        {output(DType::kF64, {4})}),
            (std::vector<double>{1, 1.25, 1.5, 1.75}));
}

TEST(DepthToSpace, DcrCrdAndBack) {
  const Shape in{1, 8, 2, 3};
  std::vector<float> x(48);
  std::iota(x.begin(), x.end(), 0.0f);
  for (const char* mode : {"DCR", "CRD"}) {
    const std::vector<float> y = run<float>("DepthToSpace", {operand(in, x)}, {output(DType::kF32, {1, 2, 4, 6})},
                                            params({{"blocksize", int64_t{2}}, {"mode", std::string(mode)}}));
    for (int64_t c = 0; c < 2; ++c) {
      for (int64_t h = 0; h < 4; ++h) {
        for (int64_t w = 0; w < 6; ++w) {
          const int64_t bh = h % 2, bw = w % 2;
          const int64_t source_c = std::string(mode) == "DCR" ? (bh * 2 + bw) * 2 + c : c * 4 + bh * 2 + bw;
          EXPECT_EQ(y[static_cast<size_t>((c * 4 + h) * 6 + w)],
                    x[static_cast<size_t>((source_c * 2 + h / 2) * 3 + w / 2)])
              << mode << " " << c << "," << h << "," << w;
        }
      }
    }
  }
  // SpaceToDepth undoes DCR DepthToSpace.
  const std::vector<float> space = run<float>("DepthToSpace", {operand(in, x)}, {output(DType::kF32, {1, 2, 4, 6})},
                                              params({{"blocksize", int64_t{2}}}));
  EXPECT_EQ(run<float>("SpaceToDepth", {operand<float>({1, 2, 4, 6}, space)}, {output(DType::kF32, in)},
                       params({{"blocksize", int64_t{2}}})),
            x);
}

// An empty input with a blocksize of 2^31: the outer loops counted through
// 2^62 empty rows (a hang; found by graph_run_fuzz).
TEST(DepthToSpace, EmptyWithAHugeBlockReturnsAtOnce) {
  const int64_t block = int64_t{1} << 31;
  EXPECT_TRUE(run<float>("DepthToSpace", {operand<float>({1, 0, 2, 2}, {})}, {output(DType::kF32, {1, 0, 2 * block, 2 * block})},
                         params({{"blocksize", block}}))
                  .empty());
}

TEST(ReverseSequence, ReversesEachBatchEntrysPrefix) {
  // time_axis 0, batch_axis 1: x[t, b].
  EXPECT_EQ(run<float>("ReverseSequence",
                       {operand<float>({4, 2}, {0, 10, 1, 11, 2, 12, 3, 13}), operand<int64_t>({2}, {3, 1})},
                       {output(DType::kF32, {4, 2})}),
            (std::vector<float>{2, 10, 1, 11, 0, 12, 3, 13}));
}

TEST(CumSum, ExclusiveReverseAndRunTimeAxis) {
  const std::vector<float> x{1, 2, 3, 4, 5, 6};
  auto cum = [&](const char* op, int64_t axis, int64_t exclusive, int64_t reverse, bool constant) {
    return run<float>(op, {operand<float>({2, 3}, x), operand<int64_t>({}, {axis}, constant)},
                      {output(DType::kF32, {2, 3})}, params({{"exclusive", exclusive}, {"reverse", reverse}}));
  };
  EXPECT_EQ(cum("CumSum", 1, 0, 0, true), (std::vector<float>{1, 3, 6, 4, 9, 15}));
  EXPECT_EQ(cum("CumSum", 0, 1, 0, false), (std::vector<float>{0, 0, 0, 1, 2, 3}));
  EXPECT_EQ(cum("CumSum", -1, 1, 1, false), (std::vector<float>{5, 3, 0, 11, 6, 0}));
  EXPECT_EQ(cum("CumProd", 1, 0, 1, true), (std::vector<float>{6, 6, 3, 120, 30, 6}));
}

TEST(CenterCropPad, CropsAndPadsAroundTheCentre) {
  // [3, 4] -> [4, 2]: rows padded (one before, none after... extra on the right), columns cropped from 1.
  const std::vector<int32_t> x{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  EXPECT_EQ(run<int32_t>("CenterCropPad", {operand<int32_t>({3, 4}, x), operand<int64_t>({2}, {4, 2})},
                         {output(DType::kI32, {4, 2})}),
            (std::vector<int32_t>{2, 3, 6, 7, 10, 11, 0, 0}));
  EXPECT_EQ(run<int32_t>("CenterCropPad", {operand<int32_t>({3, 4}, x), operand<int64_t>({2}, {5, 3})},
                         {output(DType::kI32, {5, 3})}),
            (std::vector<int32_t>{0, 0, 0, 1, 2, 3, 5, 6, 7, 9, 10, 11, 0, 0, 0}));
}

TEST(Col2Im, FoldsOverlappingBlocks) {
  // One channel, image [3], block [2], stride 1: columns (k, l) add into pixel l + k.
  const std::vector<float> columns{1, 2, 10, 20};  // [1, 2, 2]
  EXPECT_EQ(run<float>("Col2Im",
                       {operand<float>({1, 2, 2}, columns), operand<int64_t>({1}, {3}, true),
                        operand<int64_t>({1}, {2}, true)},
                       {output(DType::kF32, {1, 1, 3})}),
            (std::vector<float>{1, 12, 20}));
  // block_shape read at run; one that does not fit gives zeros.
  EXPECT_EQ(run<float>("Col2Im",
                       {operand<float>({1, 2, 2}, columns), operand<int64_t>({1}, {3}), operand<int64_t>({1}, {2})},
                       {output(DType::kF32, {1, 1, 3})}),
            (std::vector<float>{1, 12, 20}));
  EXPECT_EQ(run<float>("Col2Im",
                       {operand<float>({1, 2, 2}, columns), operand<int64_t>({1}, {3}), operand<int64_t>({1}, {3})},
                       {output(DType::kF32, {1, 1, 3})}),
            (std::vector<float>{0, 0, 0}));
}

TEST(MaxUnpool, PlacesValuesAtTheirIndices) {
  EXPECT_EQ(run<float>("MaxUnpool", {operand<float>({1, 1, 1, 2}, {5, 6}), operand<int64_t>({1, 1, 1, 2}, {1, 3})},
                       {output(DType::kF32, {1, 1, 2, 2})}, params({{"kernel_shape", std::vector<int64_t>{2, 1}}})),
            (std::vector<float>{0, 5, 0, 6}));
  // A larger output_shape holds the unpooled [2, 2] in its corner.
  EXPECT_EQ(run<float>("MaxUnpool",
                       {operand<float>({1, 1, 1, 2}, {5, 6}), operand<int64_t>({1, 1, 1, 2}, {1, 3}),
                        operand<int64_t>({4}, {1, 1, 3, 3})},
                       {output(DType::kF32, {1, 1, 3, 3})}, params({{"kernel_shape", std::vector<int64_t>{2, 1}}})),
            (std::vector<float>{0, 5, 0, 0, 6, 0, 0, 0, 0}));
}

TEST(Einsum, MatMulTraceTransposeAndEllipsis) {
  const std::vector<float> a{1, 2, 3, 4, 5, 6};      // [2, 3]
  const std::vector<float> b{1, 0, 2, 1, 0, 1};      // [3, 2]
  EXPECT_EQ(run<float>("Einsum", {operand<float>({2, 3}, a), operand<float>({3, 2}, b)}, {output(DType::kF32, {2, 2})},
                       params({{"equation", std::string("ij,jk->ik")}})),
            (std::vector<float>{5, 5, 14, 11}));
  EXPECT_EQ(run<float>("Einsum", {operand<float>({2, 3}, a)}, {output(DType::kF32, {3, 2})},
                       params({{"equation", std::string("ij->ji")}})),
            (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(run<float>("Einsum", {operand<float>({2, 2}, {1, 2, 3, 4})}, {output(DType::kF32, {})},
                       params({{"equation", std::string("ii")}})),
            (std::vector<float>{5}));
  EXPECT_EQ(run<float>("Einsum", {operand<float>({2, 1, 3}, {1, 2, 3, 4, 5, 6})}, {output(DType::kF32, {2, 1})},
                       params({{"equation", std::string("...j->...")}})),
            (std::vector<float>{6, 15}));
  EXPECT_EQ(run<float>("Einsum", {operand<float>({3}, {1, 2, 3}), operand<float>({3}, {4, 5, 6})},
                       {output(DType::kF32, {})}, params({{"equation", std::string("i,i")}})),
            (std::vector<float>{32}));
}

TEST(Det, BatchedWithPivoting) {
  const std::vector<double> x{0, 1, 2, 3,  // needs a row swap: det -2
                              2, 0, 0, 0, 3, 0, 0, 0, 4};
  EXPECT_EQ(run<double>("Det", {operand<double>({1, 2, 2}, {0, 1, 2, 3})}, {output(DType::kF64, {1})}),
            (std::vector<double>{-2}));
  EXPECT_EQ(run<double>("Det", {operand<double>({3, 3}, {x.begin() + 4, x.end()})}, {output(DType::kF64, {})}),
            (std::vector<double>{24}));
}

// Resize's general kernel (resize_general.cc), against onnx's reference
// implementation's results for the same cases.
TEST(GeneralResize, CubicAlongOneAxis) {
  const std::vector<float> got = run<float>(
      "Resize",
      {operand<float>({1, 4}, {1, 2, 4, 8}), omitted(), operand<float>({1}, {2}, true), omitted()},
      {output(DType::kF32, {1, 8})}, params({{"mode", std::string("cubic")}, {"axes", std::vector<int64_t>{1}}}));
  const std::vector<float> expected{0.89453125f, 1.15625f, 1.5625f, 2.41796875f, 3.16015625f, 5.1171875f, 7.1640625f, 8.421875f};
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-5) << i;
}

TEST(GeneralResize, AntialiasCropAndAspectRatio) {
  EXPECT_EQ(run<float>("Resize",
                       {operand<float>({1, 4}, {1, 2, 4, 8}), omitted(), operand<float>({2}, {1, 0.5f}, true), omitted()},
                       {output(DType::kF32, {1, 2})}, params({{"mode", std::string("linear")}, {"antialias", int64_t{1}}})),
            (std::vector<float>{1.75f, 5.75f}));
  EXPECT_EQ(run<float>("Resize",
                       {operand<float>({1, 4}, {1, 2, 4, 8}), operand<float>({4}, {0, 0.25f, 1, 1.5f}, true), omitted(),
                        operand<int64_t>({2}, {1, 3}, true)},
                       {output(DType::kF32, {1, 3})},
                       params({{"mode", std::string("linear")},
                               {"coordinate_transformation_mode", std::string("tf_crop_and_resize")},
                               {"extrapolation_value", -1.0}})),
            (std::vector<float>{1.75f, 6.5f, -1.0f}));
  // The same with the roi read at run.
  EXPECT_EQ(run<float>("Resize",
                       {operand<float>({1, 4}, {1, 2, 4, 8}), operand<float>({4}, {0, 0.25f, 1, 1.5f}), omitted(),
                        operand<int64_t>({2}, {1, 3}, true)},
                       {output(DType::kF32, {1, 3})},
                       params({{"mode", std::string("linear")},
                               {"coordinate_transformation_mode", std::string("tf_crop_and_resize")},
                               {"extrapolation_value", -1.0}})),
            (std::vector<float>{1.75f, 6.5f, -1.0f}));
  EXPECT_EQ(run<float>("Resize",
                       {operand<float>({2, 3}, {0, 1, 2, 3, 4, 5}), omitted(), omitted(), operand<int64_t>({2}, {4, 4}, true)},
                       {output(DType::kF32, {3, 4})},
                       params({{"keep_aspect_ratio_policy", std::string("not_larger")},
                               {"axes", std::vector<int64_t>{0, 1}}})),
            (std::vector<float>{0, 1, 1, 2, 3, 4, 4, 5, 3, 4, 4, 5}));
}

TEST(IndexingKernels, RunWithoutAllocating) {
  std::vector<Operand> inputs{operand<float>({4, 6}, randomValues<float>(24, 2, -1, 1)), operand<int64_t>({1}, {3})};
  std::vector<Operand> outputs{output(DType::kF32, {4, 3}), output(DType::kI64, {4, 3})};
  PreparedKernel kernel("TopK", inputs, outputs);
  auto call = kernel.bind(inputs, outputs);
  kernel.run(call->call);  // warms the thread_local scratch
  ::kiln::testing::startCountingAllocations();
  for (int i = 0; i < 10; ++i) kernel.run(call->call);
  const ::kiln::testing::AllocationCount count = ::kiln::testing::stopCountingAllocations();
  EXPECT_EQ(count.news, 0u);
  EXPECT_EQ(count.mallocs, 0u);
}

}  // namespace
}  // namespace kiln

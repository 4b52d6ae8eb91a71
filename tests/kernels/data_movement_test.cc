// Data-movement kernels against references written out plainly here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/transpose_tile.h"
#include "kernels/kernel.h"
#include "kiln/error.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/support/allocation_counter.h"

namespace kiln {
namespace {

using ::kiln::testing::broadcastIndex;
using ::kiln::testing::elementCount;
using ::kiln::testing::omitted;
using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::params;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::kiln::testing::randomValues;
using Shape = std::vector<int64_t>;

std::vector<int64_t> unravel(uint64_t flat, const Shape& shape) {
  std::vector<int64_t> coords(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coords[d] = static_cast<int64_t>(flat % static_cast<uint64_t>(shape[d]));
    flat /= static_cast<uint64_t>(shape[d]);
  }
  return coords;
}

uint64_t ravel(const std::vector<int64_t>& coords, const Shape& shape) {
  uint64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * static_cast<uint64_t>(shape[d]) + static_cast<uint64_t>(coords[d]);
  return flat;
}

// Runs `op` and returns output `index` as T.
template <typename T>
std::vector<T> run(const std::string& op, std::vector<Operand> inputs, DType out_dtype, const Shape& out_shape,
                   const ParamMap& p = {}) {
  std::vector<Operand> outputs = {output(out_dtype, out_shape)};
  PreparedKernel(op, inputs, outputs, p).run(inputs, outputs);
  return outputs[0].values<T>();
}

template <typename T>
std::vector<T> iota(size_t n, T start = T(0)) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(start + static_cast<T>(i));
  return v;
}

TEST(DataMovementKernels, AllAreRegistered) {
  for (const char* op :
       {"Transpose", "Concat", "Split", "Slice", "Gather", "Expand", "Tile", "Where", "Pad", "Resize"}) {
    EXPECT_NE(KernelRegistry::cpu().find(op), nullptr) << op;
  }
}

// ---------------------------------------------------------------- Transpose

template <typename T>
void checkTranspose(const Shape& shape, const std::vector<int64_t>& perm, uint32_t seed) {
  const std::vector<T> x = randomValues<T>(elementCount(shape), seed, 0, 100);
  Shape out(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) out[d] = shape[static_cast<size_t>(perm[d])];
  const std::vector<T> got =
      run<T>("Transpose", {operand(shape, x)}, dtypeOf<T>(), out, params({{"perm", perm}}));
  std::vector<T> want(x.size());
  for (uint64_t i = 0; i < want.size(); ++i) {
    const std::vector<int64_t> oc = unravel(i, out);
    std::vector<int64_t> ic(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) ic[static_cast<size_t>(perm[d])] = oc[d];
    want[i] = x[ravel(ic, shape)];
  }
  EXPECT_EQ(got, want) << "shape " << TensorInfo{DType::kF32, shape}.shapeString() << " perm " << ::testing::PrintToString(perm);
}

TEST(TransposeKernel, MatchesReference) {
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{2, 3}, {1, 0}},          {{33, 17}, {1, 0}},           {{2, 3, 4}, {2, 0, 1}},
      {{2, 3, 4}, {0, 2, 1}},    {{4, 5, 6, 7}, {0, 2, 3, 1}}, {{4, 5, 6, 7}, {0, 3, 1, 2}},
      {{3, 1, 4}, {1, 2, 0}},    {{2, 3, 4, 5}, {3, 2, 1, 0}}, {{5}, {0}},
      {{}, {}},                  {{2, 0, 3}, {2, 1, 0}},       {{70, 3, 40}, {2, 1, 0}},
      {{2, 3, 4, 5, 6}, {1, 0, 4, 2, 3}},
      // Past parallel.h's bound: split across threads by rows, and a tiled
      // transpose (NCHW -> NHWC of 3 channels) in chunks of 256 rows with a
      // partial last one.
      {{2, 3, 70, 143}, {0, 2, 3, 1}},  {{1, 3, 20001}, {0, 2, 1}}, {{40, 30, 41}, {0, 2, 1}},
      // Layout changes of feature maps both ways (transpose_tile.h's vector
      // blocks, with partial blocks at both edges), and of 2 and 4 planes.
      {{1, 144, 23, 29}, {0, 2, 3, 1}}, {{1, 23, 29, 144}, {0, 3, 1, 2}}, {{1, 37, 300}, {0, 2, 1}},
      {{2, 2, 9, 41}, {0, 2, 3, 1}},    {{2, 4, 9, 41}, {0, 2, 3, 1}},
      // Tiles cut along both axes: a detection head's [80, 80, 144] back to
      // NCHW (25 chunks of columns), and both axes past 256 with partial
      // chunks, under an outer dimension.
      {{1, 80, 80, 144}, {0, 3, 1, 2}}, {{2, 300, 270}, {0, 2, 1}},
      // Pixels back into 2 and 3 planes (blocks of fewer rows than a
      // vector holds), and 5 planes of a 4-D tensor.
      {{1, 40, 30, 3}, {0, 3, 1, 2}},   {{2, 33, 2}, {0, 2, 1}},      {{1, 9, 41, 5}, {0, 3, 1, 2}}};
  uint32_t seed = 1;
  for (const auto& [shape, perm] : cases) {
    checkTranspose<float>(shape, perm, seed++);
    checkTranspose<uint8_t>(shape, perm, seed++);
    checkTranspose<uint16_t>(shape, perm, seed++);
    checkTranspose<int64_t>(shape, perm, seed++);
  }
}

// Strides of an empty tensor among huge dimensions overflowed int64
// (UBSan; found by graph_run_fuzz and package_fuzz).
// transposeTile directly: every element size, row and column counts around
// the vector blocks' sizes and the 64 x 64 cache blocks', outputs with
// padded rows (ys > cols), the interleaving paths (2-4 columns, contiguous
// rows) and blocks of fewer rows than a vector holds, whose loads read on
// past the rows. Input rows follow each other or have a gap after each, in
// a buffer that ends at the last element read, so that a read past it is
// AddressSanitizer's to report.
template <typename T>
void checkTransposeTile(int64_t rows, int64_t cols, int64_t ys, int64_t gap) {
  const int64_t xs = rows + gap;
  std::vector<T> x(static_cast<size_t>((cols - 1) * xs + rows));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<T>(i * 2654435761u + 17);
  const T sentinel = static_cast<T>(0x5a);
  std::vector<T> y(static_cast<size_t>(rows * ys + 8), sentinel);
  transposeTile(y.data(), ys, x.data(), xs, rows, cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < ys; ++j) {
      const T want = j < cols ? x[static_cast<size_t>(i + j * xs)] : sentinel;
      ASSERT_EQ(y[static_cast<size_t>(i * ys + j)], want)
          << sizeof(T) << "-byte " << rows << "x" << cols << " ys " << ys << " at " << i << ", " << j;
    }
  }
  for (size_t k = static_cast<size_t>(rows * ys); k < y.size(); ++k) ASSERT_EQ(y[k], sentinel) << "wrote past the end";
}

template <typename T>
void checkTransposeTiles() {
  for (int64_t rows : {1, 2, 3, 4, 5, 7, 15, 16, 17, 33, 64, 67, 150}) {
    for (int64_t cols : {1, 2, 3, 4, 5, 15, 16, 17, 40, 67, 150}) {
      for (int64_t gap : {0, 3}) {
        checkTransposeTile<T>(rows, cols, cols, gap);
        checkTransposeTile<T>(rows, cols, cols + 5, gap);
      }
    }
  }
}

TEST(TransposeTile, MatchesReferenceForEveryElementSize) {
  checkTransposeTiles<uint8_t>();
  checkTransposeTiles<uint16_t>();
  checkTransposeTiles<uint32_t>();
  checkTransposeTiles<uint64_t>();
}

TEST(TransposeKernel, EmptyTensorsWithHugeDimensions) {
  const int64_t huge = (int64_t{1} << 62) + 2;
  EXPECT_TRUE(run<float>("Transpose", {operand<float>({0, huge, 4}, {})}, DType::kF32, {4, huge, 0}).empty());
  EXPECT_TRUE(run<float>("Expand", {operand<float>({0, huge, 4}, {}), operand<int64_t>({3}, {0, huge, 4}, true)},
                         DType::kF32, {0, huge, 4})
                  .empty());
}

TEST(TransposeKernel, DefaultPermReverses) {
  const std::vector<float> x = iota<float>(6);
  EXPECT_EQ(run<float>("Transpose", {operand<float>({2, 3}, x)}, DType::kF32, {3, 2}),
            (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(TransposeKernel, PrepareErrors) {
  std::vector<Operand> x = {operand<float>({2, 3}, iota<float>(6))};
  EXPECT_EQ(prepareError("Transpose", x, {output(DType::kF32, {3, 2})}, params({{"perm", std::vector<int64_t>{0, 0}}})),
            "Transpose: perm [0, 0] is not a permutation of 0..1");
  EXPECT_EQ(prepareError("Transpose", x, {output(DType::kF32, {3, 2})}, params({{"perm", std::vector<int64_t>{0}}})),
            "Transpose: perm has 1 entries for an input of rank 2");
  EXPECT_EQ(prepareError("Transpose", x, {output(DType::kF32, {2, 3})}),
            "Transpose: output is f32[2, 3] but the inputs give f32[3, 2]");
}

// ----------------------------------------------------------- Concat, Split

TEST(ConcatKernel, MatchesReference) {
  for (int64_t axis : {0, 1, 2, -1}) {
    const Shape a_shape = {2, 3, 4};
    Shape b_shape = a_shape;
    const size_t ax = static_cast<size_t>(axis < 0 ? axis + 3 : axis);
    b_shape[ax] = 5;
    Shape c_shape = a_shape;
    c_shape[ax] = 1;
    Shape out = a_shape;
    out[ax] = a_shape[ax] + 5 + 1;
    const std::vector<int32_t> a = randomValues<int32_t>(elementCount(a_shape), 1, -100, 100);
    const std::vector<int32_t> b = randomValues<int32_t>(elementCount(b_shape), 2, -100, 100);
    const std::vector<int32_t> c = randomValues<int32_t>(elementCount(c_shape), 3, -100, 100);
    const std::vector<int32_t> got = run<int32_t>(
        "Concat", {operand(a_shape, a), operand(b_shape, b), operand(c_shape, c)}, DType::kI32, out,
        params({{"axis", axis}}));
    std::vector<int32_t> want(elementCount(out));
    for (uint64_t i = 0; i < want.size(); ++i) {
      std::vector<int64_t> coords = unravel(i, out);
      if (coords[ax] < a_shape[ax]) {
        want[i] = a[ravel(coords, a_shape)];
      } else if (coords[ax] < a_shape[ax] + 5) {
        coords[ax] -= a_shape[ax];
        want[i] = b[ravel(coords, b_shape)];
      } else {
        coords[ax] -= a_shape[ax] + 5;
        want[i] = c[ravel(coords, c_shape)];
      }
    }
    EXPECT_EQ(got, want) << "axis " << axis;
  }
}

// Copies past parallel.h's bound are split across the threads: by outer
// blocks, or (axis 0) each piece in chunks; sizes that fill no whole chunk.
TEST(ConcatKernel, LargeCopiesMatchAndSplitBack) {
  for (int64_t axis : {0, 1}) {
    const Shape a_shape = axis == 0 ? Shape{40009, 3} : Shape{3, 40009};
    const Shape b_shape = axis == 0 ? Shape{17, 3} : Shape{3, 17};
    const Shape out = axis == 0 ? Shape{40026, 3} : Shape{3, 40026};
    const std::vector<float> a = randomValues<float>(elementCount(a_shape), 5, -1, 1);
    const std::vector<float> b = randomValues<float>(elementCount(b_shape), 6, -1, 1);
    const std::vector<float> got =
        run<float>("Concat", {operand(a_shape, a), operand(b_shape, b)}, DType::kF32, out, params({{"axis", axis}}));
    std::vector<float> want(elementCount(out));
    for (uint64_t i = 0; i < want.size(); ++i) {
      std::vector<int64_t> coords = unravel(i, out);
      const size_t ax = static_cast<size_t>(axis);
      if (coords[ax] < a_shape[ax]) {
        want[i] = a[ravel(coords, a_shape)];
      } else {
        coords[ax] -= a_shape[ax];
        want[i] = b[ravel(coords, b_shape)];
      }
    }
    ASSERT_EQ(got, want) << "axis " << axis;
    std::vector<Operand> inputs = {operand(out, got)};
    std::vector<Operand> outputs = {output(DType::kF32, a_shape), output(DType::kF32, b_shape)};
    PreparedKernel("Split", inputs, outputs, params({{"axis", axis}})).run(inputs, outputs);
    EXPECT_EQ(outputs[0].values<float>(), a) << "axis " << axis;
    EXPECT_EQ(outputs[1].values<float>(), b) << "axis " << axis;
  }
}

TEST(ConcatKernel, PrepareErrors) {
  std::vector<Operand> inputs = {operand<float>({2, 3}, iota<float>(6)), operand<float>({3, 3}, iota<float>(9))};
  EXPECT_EQ(prepareError("Concat", inputs, {output(DType::kF32, {5, 3})}), "Concat: needs the attribute axis");
  EXPECT_EQ(prepareError("Concat", inputs, {output(DType::kF32, {5, 3})}, params({{"axis", int64_t{1}}})),
            "Concat: input 1 is f32[3, 3] but input 0 is f32[2, 3]: they must match except along axis 1");
  EXPECT_EQ(prepareError("Concat", inputs, {output(DType::kF32, {5, 3})}, params({{"axis", int64_t{2}}})),
            "Concat: axis 2 is out of range for rank 2");
  EXPECT_EQ(prepareError("Concat", inputs, {output(DType::kF32, {6, 3})}, params({{"axis", int64_t{0}}})),
            "Concat: output is f32[6, 3] but the inputs give f32[5, 3]");
}

// An empty dimension before the axis leaves nothing to copy; the pieces'
// rows were copied once anyway, into (and out of) an empty tensor's null
// buffer (found by graph_run_fuzz, issue 12).
TEST(ConcatKernel, AnEmptyDimensionBeforeTheAxisCopiesNothing) {
  std::vector<Operand> pieces = {operand<float>({0, 2}, {}), operand<float>({0, 3}, {})};
  std::vector<Operand> whole = {output(DType::kF32, {0, 5})};
  PreparedKernel("Concat", pieces, whole, params({{"axis", int64_t{1}}})).run(pieces, whole);
  std::vector<Operand> from = {operand<float>({0, 5}, {})};
  std::vector<Operand> parts = {output(DType::kF32, {0, 2}), output(DType::kF32, {0, 3})};
  PreparedKernel("Split", from, parts, params({{"axis", int64_t{1}}})).run(from, parts);
  EXPECT_TRUE(whole[0].bytes.empty());
}

TEST(SplitKernel, MatchesReference) {
  const Shape shape = {3, 7, 2};
  const std::vector<float> x = randomValues<float>(elementCount(shape), 4, -1, 1);
  for (int64_t axis : {0, 1, -1}) {
    const size_t ax = static_cast<size_t>(axis < 0 ? axis + 3 : axis);
    std::vector<int64_t> sizes = ax == 0 ? std::vector<int64_t>{1, 2} : ax == 1 ? std::vector<int64_t>{3, 0, 4}
                                                                                 : std::vector<int64_t>{1, 1};
    for (bool with_split : {false, true}) {
      std::vector<Operand> inputs = {operand(shape, x)};
      if (with_split) inputs.push_back(operand<int64_t>({static_cast<int64_t>(sizes.size())}, sizes, true));
      std::vector<Operand> outputs;
      for (int64_t s : sizes) {
        Shape out = shape;
        out[ax] = s;
        outputs.push_back(output(DType::kF32, out));
      }
      PreparedKernel("Split", inputs, outputs, params({{"axis", axis}})).run(inputs, outputs);
      int64_t start = 0;
      for (size_t k = 0; k < sizes.size(); ++k) {
        const Shape& out = outputs[k].info.shape;
        std::vector<float> want(elementCount(out));
        for (uint64_t i = 0; i < want.size(); ++i) {
          std::vector<int64_t> coords = unravel(i, out);
          coords[ax] += start;
          want[i] = x[ravel(coords, shape)];
        }
        EXPECT_EQ(outputs[k].values<float>(), want) << "axis " << axis << " output " << k;
        start += sizes[k];
      }
    }
  }
}

TEST(SplitKernel, PrepareErrors) {
  std::vector<Operand> x = {operand<float>({4, 2}, iota<float>(8))};
  EXPECT_EQ(prepareError("Split", x, {output(DType::kF32, {1, 2}), output(DType::kF32, {2, 2})}),
            "Split: the outputs add up to 3 along axis 0, the input has 4");
  EXPECT_EQ(prepareError("Split", x, {output(DType::kF32, {2, 2}), output(DType::kF32, {2, 3})}),
            "Split: output 1 is f32[2, 3] but the input is f32[4, 2]: they must match except along axis 0");
  EXPECT_EQ(prepareError("Split", {x[0], operand<int64_t>({2}, {1, 3}, true)},
                         {output(DType::kF32, {2, 2}), output(DType::kF32, {2, 2})}),
            "Split: split [1, 3] does not match the outputs");
}

// -------------------------------------------------------------------- Slice

struct SliceCase {
  Shape shape;
  std::vector<int64_t> starts, ends, axes, steps;
};

// numpy-style reference: per dimension, the list of source indices.
std::vector<std::vector<int64_t>> sliceIndices(const SliceCase& c) {
  const size_t rank = c.shape.size();
  std::vector<std::vector<int64_t>> picks(rank);
  for (size_t d = 0; d < rank; ++d) {
    for (int64_t i = 0; i < c.shape[d]; ++i) picks[d].push_back(i);
  }
  for (size_t k = 0; k < c.starts.size(); ++k) {
    int64_t axis = c.axes.empty() ? static_cast<int64_t>(k) : c.axes[k];
    if (axis < 0) axis += static_cast<int64_t>(rank);
    const int64_t dim = c.shape[static_cast<size_t>(axis)];
    const int64_t step = c.steps.empty() ? 1 : c.steps[k];
    int64_t start = c.starts[k], end = c.ends[k];
    if (start < 0) start += dim;
    if (end < 0) end += dim;
    std::vector<int64_t>& pick = picks[static_cast<size_t>(axis)];
    pick.clear();
    if (step > 0) {
      start = std::max<int64_t>(0, std::min(start, dim));
      end = std::max<int64_t>(0, std::min(end, dim));
      for (int64_t i = start; i < end; i += step) pick.push_back(i);
    } else {
      start = std::max<int64_t>(-1, std::min(start, dim - 1));
      end = std::max<int64_t>(-1, std::min(end, dim - 1));
      for (int64_t i = start; i > end; i += step) pick.push_back(i);
    }
  }
  return picks;
}

TEST(SliceKernel, MatchesReference) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  const std::vector<SliceCase> cases = {
      {{10}, {2}, {7}, {}, {}},
      {{10}, {-3}, {big}, {}, {}},
      {{10}, {8}, {1}, {}, {-2}},
      {{10}, {-1}, {-big}, {}, {-1}},
      {{10}, {20}, {30}, {}, {}},
      {{4, 5, 6}, {1, 0}, {3, 5}, {0, 2}, {1, 2}},
      {{4, 5, 6}, {3, -1}, {0, -6}, {-1, 1}, {-2, -1}},
      {{4, 5, 6}, {0, 1, 2}, {4, 4, 6}, {}, {1, 1, 1}},
      {{3, 40, 2}, {5}, {37}, {1}, {3}},
      {{2, 3, 4, 5}, {1, -2}, {2, big}, {1, 3}, {}},
      {{4, 4}, {3, 3}, {0, 0}, {}, {-1, -1}},
      {{4, 4}, {2}, {2}, {1}, {}},
  };
  uint32_t seed = 10;
  for (const SliceCase& c : cases) {
    const std::vector<std::vector<int64_t>> picks = sliceIndices(c);
    Shape out;
    for (const auto& pick : picks) out.push_back(static_cast<int64_t>(pick.size()));
    const std::vector<float> x = randomValues<float>(elementCount(c.shape), seed++, -1, 1);
    std::vector<float> want(elementCount(out));
    for (uint64_t i = 0; i < want.size(); ++i) {
      std::vector<int64_t> coords = unravel(i, out);
      for (size_t d = 0; d < coords.size(); ++d) coords[d] = picks[d][static_cast<size_t>(coords[d])];
      want[i] = x[ravel(coords, c.shape)];
    }
    const int64_t n = static_cast<int64_t>(c.starts.size());
    for (bool constant : {true, false}) {
      std::vector<Operand> inputs = {operand(c.shape, x), operand<int64_t>({n}, c.starts, constant),
                                     operand<int64_t>({n}, c.ends, constant)};
      inputs.push_back(c.axes.empty() ? omitted() : operand<int64_t>({n}, c.axes, constant));
      if (!c.steps.empty()) inputs.push_back(operand<int64_t>({n}, c.steps, constant));
      EXPECT_EQ(run<float>("Slice", inputs, DType::kF32, out), want)
          << "case " << seed << (constant ? " constant" : " from call");
    }
    // i32 positions, and u16 data moved as bytes.
    std::vector<int32_t> starts32, ends32;
    for (int64_t v : c.starts) starts32.push_back(static_cast<int32_t>(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX)));
    for (int64_t v : c.ends) ends32.push_back(static_cast<int32_t>(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX)));
    const std::vector<uint16_t> x16 = randomValues<uint16_t>(elementCount(c.shape), seed, 0, 60000);
    std::vector<uint16_t> want16(want.size());
    for (uint64_t i = 0; i < want16.size(); ++i) {
      std::vector<int64_t> coords = unravel(i, out);
      for (size_t d = 0; d < coords.size(); ++d) coords[d] = picks[d][static_cast<size_t>(coords[d])];
      want16[i] = x16[ravel(coords, c.shape)];
    }
    std::vector<int32_t> axes32(c.axes.begin(), c.axes.end());
    std::vector<int32_t> steps32(c.steps.begin(), c.steps.end());
    std::vector<Operand> inputs = {operand(c.shape, x16), operand<int32_t>({n}, starts32, true),
                                   operand<int32_t>({n}, ends32, true),
                                   c.axes.empty() ? omitted() : operand<int32_t>({n}, axes32, true)};
    if (!c.steps.empty()) inputs.push_back(operand<int32_t>({n}, steps32, true));
    EXPECT_EQ(run<uint16_t>("Slice", inputs, DType::kU16, out), want16) << "case " << seed << " i32";
  }
}

TEST(SliceKernel, Opset1Attributes) {
  const std::vector<float> x = iota<float>(12);
  EXPECT_EQ(run<float>("Slice", {operand<float>({3, 4}, x)}, DType::kF32, {2, 2},
                       params({{"starts", std::vector<int64_t>{1, 1}},
                               {"ends", std::vector<int64_t>{3, 3}}})),
            (std::vector<float>{5, 6, 9, 10}));
  EXPECT_EQ(run<float>("Slice", {operand<float>({3, 4}, x)}, DType::kF32, {3, 1},
                       params({{"starts", std::vector<int64_t>{-1}},
                               {"ends", std::vector<int64_t>{1000}},
                               {"axes", std::vector<int64_t>{1}}})),
            (std::vector<float>{3, 7, 11}));
}

TEST(SliceKernel, PrepareErrors) {
  auto ints = [](std::vector<int64_t> v) { return operand<int64_t>({static_cast<int64_t>(v.size())}, v, true); };
  Operand x = operand<float>({4, 4}, iota<float>(16));
  EXPECT_EQ(prepareError("Slice", {x, ints({0}), ints({2})}, {output(DType::kF32, {3, 4})}),
            "Slice: output is f32[3, 4] but the inputs give f32[2, 4]");
  EXPECT_EQ(prepareError("Slice", {x, ints({0}), ints({2}), ints({0}), ints({0})}, {output(DType::kF32, {2, 4})}),
            "Slice: an axis is out of range or repeated, or a step is 0");
  EXPECT_EQ(prepareError("Slice", {x, ints({0}), ints({2, 3})}, {output(DType::kF32, {2, 4})}),
            "Slice: ends has 2 entries, starts 1");
  EXPECT_EQ(prepareError("Slice", {x, operand<float>({1}, {0.0f}), ints({2})}, {output(DType::kF32, {2, 4})}),
            "Slice: starts must be i32 or i64, got f32");
  // Steps of INT64_MIN and INT64_MAX (end - start + step - 1 overflowed).
  EXPECT_EQ(run<float>("Slice", {x, ints({3}), ints({0}), ints({0}), ints({INT64_MIN})}, DType::kF32, {1, 4}),
            (std::vector<float>{12, 13, 14, 15}));
  EXPECT_EQ(run<float>("Slice", {x, ints({0}), ints({4}), ints({0}), ints({INT64_MAX})}, DType::kF32, {1, 4}),
            (std::vector<float>{0, 1, 2, 3}));
  // Omitted ends (a crafted package's step): its values were read anyway.
  EXPECT_EQ(prepareError("Slice", {x, ints({0}), omitted()}, {output(DType::kF32, {2, 4})}),
            "Slice: expects data, starts and ends inputs, then optional axes and steps");
}

// ------------------------------------------------------------------- Gather

template <typename I>
void checkGather(const Shape& shape, int64_t axis, const Shape& indices_shape, uint32_t seed) {
  const size_t ax = static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(shape.size()) : axis);
  const int64_t dim = shape[ax];
  const std::vector<double> x = randomValues<double>(elementCount(shape), seed, -1, 1);
  const std::vector<I> indices = randomValues<I>(elementCount(indices_shape), seed + 1, static_cast<double>(-dim),
                                                 static_cast<double>(dim - 1));
  Shape out(shape.begin(), shape.begin() + static_cast<std::ptrdiff_t>(ax));
  out.insert(out.end(), indices_shape.begin(), indices_shape.end());
  out.insert(out.end(), shape.begin() + static_cast<std::ptrdiff_t>(ax) + 1, shape.end());
  std::vector<double> want(elementCount(out));
  for (uint64_t i = 0; i < want.size(); ++i) {
    const std::vector<int64_t> oc = unravel(i, out);
    std::vector<int64_t> ic(oc.begin(), oc.begin() + static_cast<std::ptrdiff_t>(ax));
    std::vector<int64_t> jc(oc.begin() + static_cast<std::ptrdiff_t>(ax),
                            oc.begin() + static_cast<std::ptrdiff_t>(ax + indices_shape.size()));
    int64_t index = static_cast<int64_t>(indices[ravel(jc, indices_shape)]);
    if (index < 0) index += dim;
    ic.push_back(index);
    ic.insert(ic.end(), oc.begin() + static_cast<std::ptrdiff_t>(ax + indices_shape.size()), oc.end());
    want[i] = x[ravel(ic, shape)];
  }
  for (bool constant : {true, false}) {
    EXPECT_EQ(run<double>("Gather", {operand(shape, x), operand(indices_shape, indices, constant)}, DType::kF64, out,
                          params({{"axis", axis}})),
              want)
        << "axis " << axis;
  }
}

TEST(GatherKernel, MatchesReference) {
  uint32_t seed = 20;
  checkGather<int64_t>({10}, 0, {4}, seed++);
  checkGather<int32_t>({10}, 0, {}, seed++);
  checkGather<int64_t>({5, 6}, 0, {2, 3}, seed++);
  checkGather<int32_t>({5, 6}, 1, {7}, seed++);
  checkGather<int64_t>({3, 4, 5}, -1, {2, 2}, seed++);
  checkGather<int64_t>({3, 4, 5}, 1, {}, seed++);
  checkGather<int32_t>({2, 9, 3, 2}, -3, {5, 1}, seed++);
}

TEST(GatherKernel, PrepareErrors) {
  Operand x = operand<float>({3, 2}, iota<float>(6));
  EXPECT_EQ(prepareError("Gather", {x, operand<int64_t>({1}, {3}, true)}, {output(DType::kF32, {1, 2})}),
            "Gather: index 3 is out of range for axis 0 of size 3");
  EXPECT_EQ(prepareError("Gather", {x, operand<float>({1}, {0.0f})}, {output(DType::kF32, {1, 2})}),
            "Gather: indices must be i32 or i64, got f32");
  EXPECT_EQ(prepareError("Gather", {x, operand<int64_t>({1}, {0})}, {output(DType::kF32, {1, 2})},
                         params({{"axis", int64_t{2}}})),
            "Gather: axis 2 is out of range for rank 2");
}

// ----------------------------------------------------------- Expand, Tile

TEST(ExpandKernel, MatchesReference) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{1}, {5}}, {{3, 1}, {3, 4}}, {{3, 1}, {2, 3, 4}}, {{1, 4}, {3, 4}}, {{2, 1, 3}, {2, 5, 3}}, {{}, {2, 2}}, {{4}, {4}}};
  uint32_t seed = 30;
  for (const auto& [in, out] : cases) {
    const std::vector<int16_t> x = randomValues<int16_t>(elementCount(in), seed++, -1000, 1000);
    std::vector<int16_t> want(elementCount(out));
    for (uint64_t i = 0; i < want.size(); ++i) want[i] = x[broadcastIndex(out, in, i)];
    for (bool constant : {true, false}) {
      EXPECT_EQ(run<int16_t>("Expand", {operand(in, x), operand<int64_t>({static_cast<int64_t>(out.size())}, out, constant)},
                             DType::kI16, out),
                want);
    }
  }
  // shape may have fewer dimensions, or ones, where the input has more.
  EXPECT_EQ(run<float>("Expand", {operand<float>({2, 1}, {1, 2}), operand<int64_t>({1}, {3}, true)}, DType::kF32, {2, 3}),
            (std::vector<float>{1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(prepareError("Expand", {operand<float>({2}, {1, 2}), operand<int64_t>({1}, {3}, true)},
                         {output(DType::kF32, {3})}),
            "Expand: input f32[2] does not broadcast to shape [3]");
}

TEST(TileKernel, MatchesReference) {
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{3}, {2}}, {{2, 3}, {2, 1}}, {{2, 3}, {1, 3}}, {{2, 1, 3}, {2, 4, 2}}, {{2, 3}, {0, 2}}, {{}, {}}};
  uint32_t seed = 40;
  for (const auto& [in, repeats] : cases) {
    Shape out(in.size());
    for (size_t d = 0; d < in.size(); ++d) out[d] = in[d] * repeats[d];
    const std::vector<float> x = randomValues<float>(elementCount(in), seed++, -1, 1);
    std::vector<float> want(elementCount(out));
    for (uint64_t i = 0; i < want.size(); ++i) {
      std::vector<int64_t> coords = unravel(i, out);
      for (size_t d = 0; d < coords.size(); ++d) coords[d] %= in[d];
      want[i] = x[ravel(coords, in)];
    }
    for (bool constant : {true, false}) {
      EXPECT_EQ(run<float>("Tile", {operand(in, x), operand<int64_t>({static_cast<int64_t>(in.size())}, repeats, constant)},
                           DType::kF32, out),
                want);
    }
  }
  EXPECT_EQ(prepareError("Tile", {operand<float>({2}, {1, 2}), operand<int64_t>({1}, {2}, true)},
                         {output(DType::kF32, {6})}),
            "Tile: output is f32[6] but the inputs give f32[4]");
  // size * repeats overflowed (undefined behaviour; found by graph_run_fuzz).
  EXPECT_EQ(prepareError("Tile", {operand<float>({2}, {1, 2}), operand<int64_t>({1}, {int64_t{1} << 62}, true)},
                         {output(DType::kF32, {6})}),
            "Tile: repeats [4611686018427387904] is negative or too large");
}

// -------------------------------------------------------------------- Where

TEST(WhereKernel, MatchesReference) {
  const std::vector<std::array<Shape, 3>> cases = {{Shape{7}, Shape{7}, Shape{7}},
                                                   {Shape{2, 3}, Shape{3}, Shape{}},
                                                   {Shape{2, 1, 4}, Shape{3, 1}, Shape{1, 4}},
                                                   {Shape{1}, Shape{5, 40}, Shape{5, 1}},
                                                   {Shape{3, 40}, Shape{3, 40}, Shape{3, 40}}};
  uint32_t seed = 50;
  for (const auto& shapes : cases) {
    const Shape out = ::kiln::testing::broadcastShape(::kiln::testing::broadcastShape(shapes[0], shapes[1]), shapes[2]);
    const std::vector<uint8_t> c = randomValues<uint8_t>(elementCount(shapes[0]), seed++, 0, 1);
    const std::vector<int64_t> a = randomValues<int64_t>(elementCount(shapes[1]), seed++, -100, 100);
    const std::vector<int64_t> b = randomValues<int64_t>(elementCount(shapes[2]), seed++, -100, 100);
    Operand cond = operand(shapes[0], c);
    cond.info.dtype = DType::kBool;
    std::vector<int64_t> want(elementCount(out));
    for (uint64_t i = 0; i < want.size(); ++i) {
      want[i] = c[broadcastIndex(out, shapes[0], i)] ? a[broadcastIndex(out, shapes[1], i)]
                                                     : b[broadcastIndex(out, shapes[2], i)];
    }
    EXPECT_EQ(run<int64_t>("Where", {cond, operand(shapes[1], a), operand(shapes[2], b)}, DType::kI64, out), want);
  }
  EXPECT_EQ(prepareError("Where", {operand<float>({1}, {1}), operand<float>({1}, {1}), operand<float>({1}, {1})},
                         {output(DType::kF32, {1})}),
            "Where: condition must be bool, got f32");
}

// ---------------------------------------------------------------------- Pad

int64_t padReference(const std::string& mode, int64_t j, int64_t n) {
  if (j >= 0 && j < n) return j;
  if (mode == "constant") return -1;
  if (mode == "edge") return j < 0 ? 0 : n - 1;
  // reflect, numpy's: bounce off the ends until inside.
  if (n == 1) return 0;
  while (j < 0 || j >= n) j = j < 0 ? -j : 2 * (n - 1) - j;
  return j;
}

TEST(PadKernel, MatchesReference) {
  struct PadCase {
    Shape shape;
    std::vector<int64_t> pads;
  };
  const std::vector<PadCase> cases = {{{5}, {2, 3}},           {{3, 4}, {1, 2, 2, 1}},  {{2, 3, 4}, {0, 1, 2, 0, 2, 3}},
                                      {{4, 6}, {-1, 2, 0, -3}}, {{3, 3}, {0, 0, 0, 0}},   {{1, 2, 5, 5}, {0, 0, 4, 4, 0, 0, 4, 4}},
                                      {{4}, {7, 9}}};
  uint32_t seed = 70;
  for (const std::string mode : {"constant", "edge", "reflect"}) {
    for (const PadCase& c : cases) {
      const size_t rank = c.shape.size();
      if (mode == "reflect" && c.shape == Shape{4}) continue;  // more pad than input: numpy-only
      Shape out(rank);
      for (size_t d = 0; d < rank; ++d) out[d] = c.shape[d] + c.pads[d] + c.pads[d + rank];
      const std::vector<float> x = randomValues<float>(elementCount(c.shape), seed++, -1, 1);
      const float value = 0.75f;
      std::vector<float> want(elementCount(out));
      for (uint64_t i = 0; i < want.size(); ++i) {
        std::vector<int64_t> coords = unravel(i, out);
        bool inside = true;
        for (size_t d = 0; d < rank; ++d) {
          coords[d] = padReference(mode, coords[d] - c.pads[d], c.shape[d]);
          inside = inside && coords[d] >= 0;
        }
        want[i] = inside ? x[ravel(coords, c.shape)] : value;
      }
      for (bool constant : {true, false}) {
        std::vector<Operand> inputs = {operand(c.shape, x),
                                       operand<int64_t>({static_cast<int64_t>(c.pads.size())}, c.pads, constant),
                                       operand<float>({}, {value}, constant)};
        EXPECT_EQ(run<float>("Pad", inputs, DType::kF32, out, params({{"mode", mode}})), want)
            << mode << " " << ::testing::PrintToString(c.pads) << (constant ? " constant" : " from call");
      }
    }
  }
}

TEST(PadKernel, AxesAttributesAndDefaults) {
  const std::vector<uint8_t> x = iota<uint8_t>(6, 1);
  // axes input: pad only the last axis; constant default 0.
  EXPECT_EQ(run<uint8_t>("Pad", {operand<uint8_t>({2, 3}, x), operand<int64_t>({2}, {1, 1}, true), omitted(),
                                 operand<int64_t>({1}, {-1}, true)},
                         DType::kU8, {2, 5}),
            (std::vector<uint8_t>{0, 1, 2, 3, 0, 0, 4, 5, 6, 0}));
  // Opset 2: pads and value attributes.
  EXPECT_EQ(run<float>("Pad", {operand<float>({2}, {1, 2})}, DType::kF32, {4},
                       params({{"pads", std::vector<int64_t>{1, 1}}, {"value", 9.0}})),
            (std::vector<float>{9, 1, 2, 9}));
}

TEST(PadKernel, PrepareErrors) {
  Operand x = operand<float>({2, 3}, iota<float>(6));
  EXPECT_EQ(prepareError("Pad", {x, operand<int64_t>({4}, {1, 0, 1, 0}, true)}, {output(DType::kF32, {4, 4})}),
            "Pad: pads [1, 0, 1, 0] do not take input f32[2, 3] to output f32[4, 4]");
  EXPECT_EQ(prepareError("Pad", {x, operand<int64_t>({2}, {1, 1}, true)}, {output(DType::kF32, {4, 3})}),
            "Pad: pads has 2 entries, expected 4");
  EXPECT_EQ(prepareError("Pad", {x, operand<int64_t>({4}, {0, 0, 0, 0}, true)}, {output(DType::kF32, {2, 3})},
                         params({{"mode", std::string("mirror")}})),
            "Pad: mode is 'mirror', expected 'constant', 'reflect', 'edge' or 'wrap'");
  // Pads that sum to the right size only by wrapping around: 3 + (-2^63) +
  // (2^63 - 1) = 2 (graph_run_fuzz). A pad may remove at most the input and
  // add at most the output.
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  for (const std::string mode : {"constant", "reflect", "edge", "wrap"}) {
    EXPECT_NE(prepareError("Pad", {x, operand<int64_t>({4}, {0, kMin, 0, kMax}, true)}, {output(DType::kF32, {2, 2})},
                           params({{"mode", mode}})).find("do not take input f32[2, 3] to output f32[2, 2]"),
              std::string::npos) << mode;
  }
  EXPECT_NE(prepareError("Pad", {x, operand<int64_t>({4}, {0, -4, 0, 3}, true)}, {output(DType::kF32, {2, 2})})
                .find("do not take"),
            std::string::npos);
  // An end pad of 2^63 - 1 onto 2 elements, the output [4, 2^63 - 1, 0]
  // empty: the sum passed int64 (UBSan; graph_run_fuzz).
  Operand empty = operand<uint8_t>({4, 2, 0}, {});
  empty.info.dtype = DType::kBool;
  EXPECT_NE(prepareError("Pad", {empty, operand<int64_t>({6}, {0, 0, 0, 0, kMax, 0}, true)},
                         {output(DType::kBool, {4, kMax, 0})})
                .find("do not take"),
            std::string::npos);
}

// Pads read at run time that do not fit are refused by the call, which
// leaves the output as it was.
TEST(PadKernel, RunTimePadsThatDoNotFitAreRefused) {
  std::vector<Operand> inputs = {operand<float>({2, 3}, iota<float>(6)), operand<int64_t>({4}, {0, 0, 0, 0})};
  std::vector<Operand> outputs = {output(DType::kF32, {2, 2})};
  PreparedKernel kernel("Pad", inputs, outputs);
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  for (const std::vector<int64_t>& pads : {std::vector<int64_t>{0, 0, 0, 0}, {0, kMin, 0, kMax}}) {
    inputs[1] = operand<int64_t>({4}, pads);
    outputs[0].bytes.assign(outputs[0].bytes.size(), std::byte{0x5a});
    EXPECT_THROW(kernel.run(inputs, outputs), UsageError);
    EXPECT_EQ(outputs[0].bytes, std::vector<std::byte>(outputs[0].bytes.size(), std::byte{0x5a}));
  }
  inputs[1] = operand<int64_t>({4}, {0, 0, 0, -1});
  kernel.run(inputs, outputs);
  float first;
  std::memcpy(&first, outputs[0].bytes.data(), sizeof first);
  EXPECT_EQ(first, 0.0f);
}

// ------------------------------------------------------------------- Resize

// The ONNX formulas, written out again.
double resizeSource(const std::string& ctm, int64_t i, double scale, int64_t in, int64_t out) {
  if (ctm == "half_pixel") return (i + 0.5) / scale - 0.5;
  if (ctm == "pytorch_half_pixel") return out > 1 ? (i + 0.5) / scale - 0.5 : 0;
  if (ctm == "align_corners") return out == 1 ? 0 : i * static_cast<double>(in - 1) / static_cast<double>(out - 1);
  return i / scale;  // asymmetric
}

int64_t nearestIndex(const std::string& nearest, double x, int64_t in) {
  double r;
  if (nearest == "floor") {
    r = std::floor(x);
  } else if (x == std::floor(x) + 0.5) {
    r = std::floor(x);  // round_prefer_floor
  } else {
    r = std::round(x);
  }
  return std::min<int64_t>(std::max<int64_t>(static_cast<int64_t>(r), 0), in - 1);
}

std::vector<double> resizeReference(const std::vector<float>& x, const Shape& in, const Shape& out, double sh,
                                    double sw, const std::string& mode, const std::string& ctm,
                                    const std::string& nearest) {
  const int64_t planes = in[0] * in[1];
  const int64_t ih = in[2], iw = in[3], oh = out[2], ow = out[3];
  std::vector<double> y;
  for (int64_t p = 0; p < planes; ++p) {
    const float* plane = x.data() + p * ih * iw;
    for (int64_t oy = 0; oy < oh; ++oy) {
      for (int64_t ox = 0; ox < ow; ++ox) {
        const double fy = resizeSource(ctm, oy, sh, ih, oh);
        const double fx = resizeSource(ctm, ox, sw, iw, ow);
        if (mode == "nearest") {
          y.push_back(plane[nearestIndex(nearest, fy, ih) * iw + nearestIndex(nearest, fx, iw)]);
          continue;
        }
        auto at = [&](int64_t r, int64_t c) {
          return static_cast<double>(plane[std::clamp<int64_t>(r, 0, ih - 1) * iw + std::clamp<int64_t>(c, 0, iw - 1)]);
        };
        const double y0 = std::floor(fy), x0 = std::floor(fx);
        const double wy = fy - y0, wx = fx - x0;
        const int64_t r = static_cast<int64_t>(y0), c = static_cast<int64_t>(x0);
        y.push_back((1 - wy) * ((1 - wx) * at(r, c) + wx * at(r, c + 1)) +
                    wy * ((1 - wx) * at(r + 1, c) + wx * at(r + 1, c + 1)));
      }
    }
  }
  return y;
}

TEST(ResizeKernel, OnnxExamples) {
  const std::vector<float> x = {1, 2, 3, 4};
  auto resize = [&](const std::vector<float>& data, Shape in, std::vector<float> scales, Shape out, ParamMap p) {
    return run<float>("Resize",
                      {operand<float>(in, data), omitted(), operand<float>({4}, scales, true)}, DType::kF32, out, p);
  };
  EXPECT_EQ(resize(x, {1, 1, 2, 2}, {1, 1, 2, 3}, {1, 1, 4, 6}, {}),
            (std::vector<float>{1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 3, 3, 3, 4, 4, 4}));
  EXPECT_EQ(resize(x, {1, 1, 2, 2}, {1, 1, 2, 2}, {1, 1, 4, 4}, params({{"mode", std::string("linear")}})),
            (std::vector<float>{1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3, 3.25, 3.75, 4}));
  const std::vector<float> x8 = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(resize(x8, {1, 1, 2, 4}, {1, 1, 0.6f, 0.6f}, {1, 1, 1, 2}, {}), (std::vector<float>{1, 3}));
  const std::vector<float> linear = resize(x8, {1, 1, 2, 4}, {1, 1, 0.6f, 0.6f}, {1, 1, 1, 2},
                                           params({{"mode", std::string("linear")}}));
  EXPECT_NEAR(linear[0], 2.6666665, 1e-6);
  EXPECT_NEAR(linear[1], 4.3333331, 1e-6);
}

// An empty output whose other axis is 2^31 long: prepare built a source
// table per output index of that axis (gigabytes; found by graph_run_fuzz).
TEST(ResizeKernel, EmptyOutputsBuildNoTables) {
  const int64_t wide = int64_t{1} << 31;
  EXPECT_TRUE(run<float>("Resize", {operand<float>({1, 1, 0, 2}, {}), omitted(), omitted(),
                                    operand<int64_t>({4}, {1, 1, 0, wide}, true)},
                         DType::kF32, {1, 1, 0, wide})
                  .empty());
  // The general path (cubic), likewise.
  EXPECT_TRUE(run<float>("Resize", {operand<float>({1, 1, 0, 2}, {}), omitted(), omitted(),
                                    operand<int64_t>({4}, {1, 1, 0, wide}, true)},
                         DType::kF32, {1, 1, 0, wide}, params({{"mode", std::string("cubic")}}))
                  .empty());
}

TEST(ResizeKernel, MatchesReference) {
  struct ResizeCase {
    Shape in, out;
    bool sizes;
  };
  const std::vector<ResizeCase> cases = {{{1, 2, 3, 4}, {1, 2, 6, 8}, false},  {{2, 1, 5, 7}, {2, 1, 3, 4}, true},
                                         {{1, 3, 4, 4}, {1, 3, 7, 9}, true},   {{1, 1, 6, 6}, {1, 1, 3, 2}, false},
                                         {{1, 1, 1, 5}, {1, 1, 1, 10}, false}, {{1, 2, 3, 3}, {1, 2, 1, 1}, true}};
  uint32_t seed = 80;
  for (const std::string mode : {"nearest", "linear"}) {
    for (const std::string ctm : {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"}) {
      for (const std::string nearest : {"round_prefer_floor", "floor"}) {
        if (mode == "linear" && nearest == "floor") continue;
        for (const ResizeCase& c : cases) {
          const std::vector<float> x = randomValues<float>(elementCount(c.in), seed++, -1, 1);
          std::vector<float> scales(4, 1.0f);
          if (!c.sizes) {
            scales[2] = static_cast<float>(c.out[2]) / static_cast<float>(c.in[2]);
            scales[3] = static_cast<float>(c.out[3]) / static_cast<float>(c.in[3]);
          }
          const double sh = c.sizes ? static_cast<double>(c.out[2]) / c.in[2] : scales[2];
          const double sw = c.sizes ? static_cast<double>(c.out[3]) / c.in[3] : scales[3];
          const std::vector<double> want = resizeReference(x, c.in, c.out, sh, sw, mode, ctm, nearest);
          const ParamMap p = params(
              {{"mode", mode}, {"coordinate_transformation_mode", ctm}, {"nearest_mode", nearest}});
          for (bool constant : {true, false}) {
            std::vector<Operand> inputs = {operand(c.in, x), omitted()};
            if (c.sizes) {
              inputs.push_back(omitted());
              inputs.push_back(operand<int64_t>({4}, c.out, constant));
            } else {
              inputs.push_back(operand<float>({4}, scales, constant));
            }
            const std::vector<float> got = run<float>("Resize", inputs, DType::kF32, c.out, p);
            ASSERT_EQ(got.size(), want.size());
            size_t bad = 0;
            for (size_t i = 0; i < got.size(); ++i) bad += std::abs(got[i] - want[i]) > 1e-5;
            EXPECT_EQ(bad, 0u) << mode << " " << ctm << " " << nearest << " in "
                               << ::testing::PrintToString(c.in) << " out " << ::testing::PrintToString(c.out)
                               << (constant ? " constant" : " from call");
          }
        }
      }
    }
  }
}

TEST(ResizeKernel, NearestMovesAnyElementType) {
  EXPECT_EQ(run<uint8_t>("Resize",
                         {operand<uint8_t>({1, 1, 1, 2}, {7, 9}), omitted(), omitted(),
                          operand<int64_t>({4}, {1, 1, 2, 4}, true)},
                         DType::kU8, {1, 1, 2, 4}),
            (std::vector<uint8_t>{7, 7, 9, 9, 7, 7, 9, 9}));
}

TEST(ResizeKernel, PrepareErrors) {
  Operand x = operand<float>({1, 1, 2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(prepareError("Resize", {x, omitted(), operand<float>({4}, {1, 1, 2, 2}, true)},
                         {output(DType::kF32, {1, 1, 4, 4})}, params({{"mode", std::string("area")}})),
            "Resize: mode 'area' is not nearest, linear or cubic");
  EXPECT_EQ(prepareError("Resize", {x, omitted(), operand<float>({4}, {1, 1, 2, 2})}, {output(DType::kF32, {1, 1, 4, 4})},
                         params({{"mode", std::string("cubic")}})),
            "Resize: scales must be a constant for this mode (input 2 is computed)");
  EXPECT_EQ(prepareError("Resize", {x, omitted(), operand<float>({4}, {1, 1, 2, 2}, true)},
                         {output(DType::kF32, {1, 1, 4, 5})}),
            "Resize: scale 2 takes dimension 3 from 2 to 4, the output has 5");
  EXPECT_EQ(prepareError("Resize", {x, omitted(), operand<float>({4}, {1, 1, 2, 2}, true)},
                         {output(DType::kF32, {1, 2, 4, 4})}),
            "Resize: scale 1 takes axis 1 from 1 to 1, the output f32[1, 2, 4, 4] has 2");
  EXPECT_EQ(prepareError("Resize", {x, omitted(), omitted(), omitted()}, {output(DType::kF32, {1, 1, 4, 4})}),
            "Resize: needs scales or sizes");
  EXPECT_EQ(prepareError("Resize", {operand<int32_t>({1, 1, 1, 1}, {1}), omitted(), operand<float>({4}, {1, 1, 2, 2}, true)},
                         {output(DType::kI32, {1, 1, 2, 2})}, params({{"mode", std::string("linear")}})),
            "Resize: linear mode needs f32 or f64 data, got i32");
}

// -------------------------------------------------------------- allocations

TEST(DataMovementAllocations, RunsDoNotAllocate) {
  struct Case {
    std::string op;
    std::vector<Operand> inputs;
    Shape out;
    ParamMap params;
  };
  std::vector<Case> cases;
  cases.push_back({"Transpose", {operand<float>({8, 33, 17}, randomValues<float>(8 * 33 * 17, 1, -1, 1))}, {17, 8, 33},
                   params({{"perm", std::vector<int64_t>{2, 0, 1}}})});
  cases.push_back({"Transpose", {operand<float>({4, 5, 6}, randomValues<float>(120, 2, -1, 1))}, {4, 6, 5},
                   params({{"perm", std::vector<int64_t>{0, 2, 1}}})});
  cases.push_back({"Slice",
                   {operand<float>({10, 10}, randomValues<float>(100, 3, -1, 1)), operand<int64_t>({1}, {8}),
                    operand<int64_t>({1}, {1}), operand<int64_t>({1}, {1}), operand<int64_t>({1}, {-2})},
                   {10, 4},
                   {}});
  cases.push_back({"Pad",
                   {operand<float>({3, 4}, randomValues<float>(12, 4, -1, 1)), operand<int64_t>({4}, {1, 2, 1, 2})},
                   {5, 8},
                   params({{"mode", std::string("reflect")}})});
  for (Case& c : cases) {
    std::vector<Operand> outputs = {output(DType::kF32, c.out)};
    const PreparedKernel kernel(c.op, c.inputs, outputs, c.params);
    const auto bound = kernel.bind(c.inputs, outputs);
    kernel.run(bound->call);
    ::kiln::testing::startCountingAllocations();
    for (int i = 0; i < 100; ++i) kernel.run(bound->call);
    const ::kiln::testing::AllocationCount count = ::kiln::testing::stopCountingAllocations();
    EXPECT_EQ(count.news, 0u) << c.op;
    EXPECT_EQ(count.mallocs, 0u) << c.op;
  }
}

}  // namespace
}  // namespace kiln

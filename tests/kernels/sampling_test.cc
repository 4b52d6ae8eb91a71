// Spatial-sampling kernels (src/kernels/cpu/sampling.cc) against values from
// onnx's reference implementation (onnx.reference, run once; the inputs are
// written here) and against identities (an identity grid, zero offsets).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

using ::kiln::testing::omitted;
using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::params;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;

std::vector<float> runKernel(const std::string& op, std::vector<Operand> inputs, const Ints& out_shape,
                             const ParamMap& p = {}) {
  std::vector<Operand> outputs{output(DType::kF32, out_shape)};
  const PreparedKernel kernel(op, inputs, outputs, p);
  kernel.run(inputs, outputs);
  return outputs[0].values<float>();
}

void expectNear(const std::vector<float>& got, const std::vector<float>& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tolerance) << "element " << i;
}

std::vector<float> iota(size_t n, float scale) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(i) * scale;
  return out;
}

// ---------------------------------------------------------------- GridSample

struct GridCase {
  const char* mode;
  const char* padding;
  int64_t align_corners;
  std::vector<float> want;
};

TEST(GridSampleKernel, EveryModePaddingAndAlignment) {
  // X = 0..11 as [1, 1, 3, 4]; six grid points, some outside [-1, 1].
  const Operand x = operand<float>({1, 1, 3, 4}, iota(12, 1));
  const Operand grid = operand<float>(
      {1, 2, 3, 2}, {-1.2f, -1.0f, -0.3f, 0.4f, 0.5f, -0.7f, 1.1f, 0.9f, 0.05f, 0.95f, -0.9f, 1.3f});
  const std::vector<GridCase> cases{
      {"nearest", "zeros", 0, {0, 9, 2, 0, 10, 0}},
      {"nearest", "zeros", 1, {0, 5, 2, 11, 10, 8}},
      {"nearest", "border", 0, {0, 9, 2, 11, 10, 8}},
      {"nearest", "reflection", 1, {0, 5, 2, 11, 10, 8}},
      {"linear", "zeros", 0, {0, 7.299999f, 2.375f, 2.145002f, 5.519999f, 0.280001f}},
      {"linear", "zeros", 1, {0, 6.65f, 3.45f, 9.010001f, 9.375f, 5.705f}},
      {"linear", "border", 0, {0, 7.299999f, 2.5f, 11, 9.6f, 8}},
      {"linear", "border", 1, {0, 6.65f, 3.45f, 10.599999f, 9.375f, 8.15f}},
      {"linear", "reflection", 0, {0, 7.299999f, 2.5f, 11, 9.6f, 8}},
      {"linear", "reflection", 1, {0.3f, 6.65f, 3.45f, 10.450001f, 9.375f, 6.95f}},
      {"cubic", "zeros", 0, {-0.034125f, 8.601134f, 2.613912f, 2.202509f, 6.015497f, 0.227558f}},
      {"cubic", "zeros", 1, {-0.11025f, 7.708508f, 3.665824f, 10.002013f, 9.72998f, 6.7954f}},
      {"cubic", "border", 0, {-0.375f, 7.593249f, 2.458375f, 11.443626f, 9.997543f, 7.889751f}},
      {"cubic", "border", 1, {0, 7.055367f, 3.259032f, 10.699f, 9.406549f, 8.113345f}},
      {"cubic", "reflection", 0, {-0.8175f, 7.593249f, 2.451247f, 11.840005f, 10.309121f, 7.985002f}},
      {"cubic", "reflection", 1, {0.121499f, 7.343368f, 2.853189f, 10.909935f, 9.541923f, 7.546065f}},
  };
  for (const GridCase& c : cases) {
    SCOPED_TRACE(std::string(c.mode) + " " + c.padding + " align_corners " + std::to_string(c.align_corners));
    expectNear(runKernel("GridSample", {x, grid}, {1, 1, 2, 3},
                         params({{"mode", std::string(c.mode)}, {"padding_mode", std::string(c.padding)},
                                 {"align_corners", c.align_corners}})),
               c.want, 2e-5);
  }
}

TEST(GridSampleKernel, VolumetricIdentityGridReturnsTheInput) {
  // With align_corners, the grid of the pixels' own coordinates samples X
  // exactly (x varies fastest, then y, then z).
  const Operand x = operand<float>({1, 2, 2, 3, 4}, iota(48, 0.5f));
  std::vector<float> grid;
  for (int z = 0; z < 2; ++z) {
    for (int y = 0; y < 3; ++y) {
      for (int w = 0; w < 4; ++w) {
        grid.push_back(-1 + 2 * static_cast<float>(w) / 3);
        grid.push_back(-1 + 2 * static_cast<float>(y) / 2);
        grid.push_back(-1 + 2 * static_cast<float>(z));
      }
    }
  }
  for (const char* mode : {"nearest", "linear"}) {
    expectNear(runKernel("GridSample", {x, operand<float>({1, 2, 3, 4, 3}, grid)}, {1, 2, 2, 3, 4},
                         params({{"mode", std::string(mode)}, {"align_corners", int64_t{1}}})),
               iota(48, 0.5f), 1e-5);
  }
}

TEST(GridSampleKernel, Errors) {
  const Operand x = operand<float>({1, 1, 3, 4}, iota(12, 1));
  EXPECT_THAT(prepareError("GridSample", {x, operand<float>({1, 2, 3, 3}, iota(18, 0))}, {output(DType::kF32, {1, 1, 2, 3})}),
              HasSubstr("must be [N, C, D1..Dr] and [N, O1..Or, r]"));
  EXPECT_THAT(prepareError("GridSample", {x, operand<float>({1, 2, 3, 2}, iota(12, 0))}, {output(DType::kF32, {1, 1, 2, 3})},
                           params({{"mode", std::string("area")}})),
              HasSubstr("mode 'area' is not nearest, linear or cubic"));
}

// ---------------------------------------------------------------- AffineGrid

TEST(AffineGridKernel, IdentityAndShift) {
  // theta 0: identity; theta 1: x' = x + 0.5, y' = 2y.
  const Operand theta = operand<float>({2, 2, 3}, {1, 0, 0, 0, 1, 0, 1, 0, 0.5f, 0, 2, 0});
  const std::vector<float> y = runKernel("AffineGrid", {theta, operand<int64_t>({4}, {2, 1, 2, 3})}, {2, 2, 3, 2});
  // Pixel centres: x at -2/3, 0, 2/3; y at -1/2, 1/2.
  const float third = 2.0f / 3;
  expectNear(y, {-third, -0.5f, 0, -0.5f, third, -0.5f, -third, 0.5f, 0, 0.5f, third, 0.5f,
                 -third + 0.5f, -1, 0.5f, -1, third + 0.5f, -1, -third + 0.5f, 1, 0.5f, 1, third + 0.5f, 1},
             1e-6);
  // align_corners and 3-D: corners at -1 and 1.
  const Operand theta3 = operand<float>({1, 3, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0});
  expectNear(runKernel("AffineGrid", {theta3, operand<int64_t>({5}, {1, 1, 2, 1, 2})}, {1, 2, 1, 2, 3},
                       params({{"align_corners", int64_t{1}}})),
             {-1, -1, -1, 1, -1, -1, -1, -1, 1, 1, -1, 1}, 1e-6);
  EXPECT_THAT(prepareError("AffineGrid", {operand<float>({1, 2, 4}, iota(8, 0)), operand<int64_t>({4}, {1, 1, 2, 2})},
                           {output(DType::kF32, {1, 2, 2, 2})}),
              HasSubstr("must be [N, 2, 3] or [N, 3, 4]"));
}

// ------------------------------------------------------------------ RoiAlign

TEST(RoiAlignKernel, AverageAndMaxInBothCoordinateModes) {
  // X = 0, 0.5, ..., 14.5 as [1, 1, 5, 6]; three rois, the last partly outside.
  const Operand x = operand<float>({1, 1, 5, 6}, iota(30, 0.5f));
  const Operand rois = operand<float>({3, 4}, {0.5f, 0.2f, 3.7f, 4.1f, 1.0f, 1.0f, 1.4f, 1.3f, -1, -1, 7, 6});
  const Operand indices = operand<int64_t>({3}, {0, 0, 0});
  struct Case {
    const char* mode;
    const char* transform;
    std::vector<float> want;
  };
  const std::vector<Case> cases{
      {"avg", "half_pixel", {2.29167f, 2.825f, 3.35833f, 8.14167f, 8.675f, 9.20833f, 2.00833f, 2.075f, 2.14167f, 2.45833f,
                             2.525f, 2.59167f, 1.21528f, 2.625f, 2.28472f, 4.96528f, 8.25f, 6.03472f}},
      {"avg", "output_half_pixel", {4.04167f, 4.575f, 5.10833f, 9.89167f, 10.425f, 10.9583f, 4.33333f, 4.5f, 4.66667f,
                                    5.83333f, 6, 6.16667f, 2.93113f, 4.17188f, 3.41088f, 8.25694f, 9.1875f, 6.59722f}},
      {"max", "half_pixel", {2.345f, 2.90333f, 3.5175f, 6.745f, 7.69167f, 8.6975f, 1.14042f, 1.40875f, 1.67708f, 1.43792f,
                             1.77625f, 2.11458f, 3.375f, 2.57812f, 4.78125f, 12, 8.25f, 14.5f}},
      {"max", "output_half_pixel", {3.30146f, 3.86458f, 4.47188f, 5.86979f, 6.63541f, 7.44187f, 2.1875f, 1.5f, 2.5f,
                                    4.0625f, 2.625f, 4.375f, 5.625f, 7.03125f, 7.96875f, 12, 13.5f, 14.5f}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.mode) + " " + c.transform);
    expectNear(runKernel("RoiAlign", {x, rois, indices}, {3, 1, 2, 3},
                         params({{"mode", std::string(c.mode)}, {"coordinate_transformation_mode", std::string(c.transform)},
                                 {"output_height", int64_t{2}}, {"output_width", int64_t{3}}})),
               c.want, 1e-4);
  }
  EXPECT_THAT(prepareError("RoiAlign", {x, rois, operand<int64_t>({2}, {0, 0})}, {output(DType::kF32, {3, 1, 1, 1})}),
              HasSubstr("batch_indices i64[2] must be i64[3]"));
}

// ---------------------------------------------------------------- DeformConv

TEST(DeformConvKernel, OffsetsMaskBiasAndGroups) {
  const Operand x = operand<float>({1, 2, 3, 3}, iota(18, 0.25f));
  const std::vector<float> w{1, -1, 0.5f, 2, 0.25f, 1, -2, 1, 3, 1, 1, -1, 0, 1, 2, 1};
  std::vector<float> offset(64);
  for (size_t i = 0; i < offset.size(); ++i) offset[i] = (static_cast<float>(i % 7) - 3) * 0.3f;
  std::vector<float> mask(32);
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<float>(i % 5) * 0.25f;
  const Operand bias = operand<float>({2}, {0.5f, -1});
  expectNear(runKernel("DeformConv",
                       {x, operand<float>({2, 2, 2, 2}, w), operand<float>({1, 16, 2, 2}, offset), bias,
                        operand<float>({1, 8, 2, 2}, mask)},
                       {1, 2, 2, 2}, params({{"kernel_shape", Ints{2, 2}}, {"offset_group", int64_t{2}}})),
             {-3.90438f, 5.35063f, 2.31031f, -0.91375f, 8.6725f, 0.9775f, 2.69875f, 7.495f}, 1e-4);
  // group 2: each output channel sees one input channel.
  const std::vector<float> w_half{1, -1, 0.5f, 2, 3, 1, 1, -1};
  expectNear(runKernel("DeformConv",
                       {x, operand<float>({2, 1, 2, 2}, w_half), operand<float>({1, 16, 2, 2}, offset), bias,
                        operand<float>({1, 8, 2, 2}, mask)},
                       {1, 2, 2, 2}, params({{"offset_group", int64_t{2}}, {"group", int64_t{2}}})),
             {1.39625f, 2.915f, 2.02125f, 0.5025f, 1.43f, 2.94875f, 9.45625f, 8.85875f}, 1e-4);
  // Padding and strides, constant offsets of 0.4, no bias or mask.
  expectNear(runKernel("DeformConv",
                       {operand<float>({1, 1, 3, 3}, iota(9, 0.25f)), operand<float>({1, 1, 2, 2}, {1, -1, 0.5f, 2}),
                        operand<float>({1, 8, 2, 2}, std::vector<float>(32, 0.4f))},
                       {1, 1, 2, 2}, params({{"pads", Ints{1, 1, 1, 1}}, {"strides", Ints{2, 2}}})),
             {0.82f, 1.305f, 1.37f, 2.465f}, 1e-4);
  EXPECT_THAT(prepareError("DeformConv", {x, operand<float>({2, 2, 2, 2}, w), operand<float>({1, 8, 2, 2}, iota(32, 0))},
                           {output(DType::kF32, {1, 2, 2, 2})}, params({{"offset_group", int64_t{2}}})),
              HasSubstr("offset is f32[1, 8, 2, 2] but must be [1, 16, 2, 2]"));
}

}  // namespace
}  // namespace kiln

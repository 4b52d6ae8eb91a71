// Signal-processing kernels (src/kernels/cpu/signal.cc) against direct
// double-precision transforms written here, the window formulas and
// onnx's reference MelWeightMatrix.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "tests/kernels/kernel_test_util.h"

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
using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;
using Complex = std::complex<double>;

std::vector<float> runKernel(const std::string& op, std::vector<Operand> inputs, const Ints& out_shape,
                             const ParamMap& p = {}) {
  std::vector<Operand> outputs{output(DType::kF32, out_shape)};
  const PreparedKernel kernel(op, inputs, outputs, p);
  kernel.run(inputs, outputs);
  return outputs[0].values<float>();
}

void expectNear(const std::vector<float>& got, const std::vector<double>& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tolerance) << "element " << i;
}

// The DFT of `x` (length m, cut or zero-padded to n).
std::vector<Complex> dft(const std::vector<Complex>& x, int64_t n, bool inverse) {
  std::vector<Complex> out(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t t = 0; t < std::min<int64_t>(n, static_cast<int64_t>(x.size())); ++t) {
      const double angle = (inverse ? 2 : -2) * std::numbers::pi * static_cast<double>(k * t) / static_cast<double>(n);
      out[static_cast<size_t>(k)] += x[static_cast<size_t>(t)] * std::polar(1.0, angle);
    }
    if (inverse) out[static_cast<size_t>(k)] /= static_cast<double>(n);
  }
  return out;
}

TEST(DftKernel, ForwardRealAlongAnInnerAxis) {
  // x [2, 5, 3, 1]: transform along axis 1 (length 5, padded to 8).
  const std::vector<float> x = randomValues<float>(30, 1, -1, 1);
  const std::vector<float> y = runKernel("DFT", {operand<float>({2, 5, 3, 1}, x), operand<int64_t>({}, {8}, true)},
                                         {2, 8, 3, 2}, params({{"axis", int64_t{1}}}));
  std::vector<double> want(y.size());
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t c = 0; c < 3; ++c) {
      std::vector<Complex> signal;
      for (int64_t t = 0; t < 5; ++t) signal.emplace_back(x[static_cast<size_t>((b * 5 + t) * 3 + c)], 0);
      const std::vector<Complex> spectrum = dft(signal, 8, false);
      for (int64_t k = 0; k < 8; ++k) {
        want[static_cast<size_t>(((b * 8 + k) * 3 + c) * 2)] = spectrum[static_cast<size_t>(k)].real();
        want[static_cast<size_t>(((b * 8 + k) * 3 + c) * 2 + 1)] = spectrum[static_cast<size_t>(k)].imag();
      }
    }
  }
  expectNear(y, want, 1e-5);
}

TEST(DftKernel, InverseOnesidedAndRoundTrip) {
  // Opset 20: the axis as a constant input. A complex inverse of a forward
  // transform returns the signal.
  const std::vector<float> x = randomValues<float>(14, 2, -1, 1);  // [1, 7, 2]
  const std::vector<float> spectrum =
      runKernel("DFT", {operand<float>({1, 7, 2}, x), omitted(), operand<int64_t>({}, {1}, true)}, {1, 7, 2});
  const std::vector<float> back = runKernel("DFT", {operand<float>({1, 7, 2}, spectrum)}, {1, 7, 2},
                                            params({{"axis", int64_t{1}}, {"inverse", int64_t{1}}}));
  expectNear(back, std::vector<double>(x.begin(), x.end()), 1e-5);

  // rfft (onesided) of a real signal of 8, then irfft back to it.
  const std::vector<float> real = randomValues<float>(8, 3, -1, 1);
  const std::vector<float> half =
      runKernel("DFT", {operand<float>({1, 8, 1}, real)}, {1, 5, 2}, params({{"axis", int64_t{1}}, {"onesided", int64_t{1}}}));
  std::vector<Complex> signal;
  for (float v : real) signal.emplace_back(v, 0);
  const std::vector<Complex> full = dft(signal, 8, false);
  for (int64_t k = 0; k < 5; ++k) {
    EXPECT_NEAR(half[static_cast<size_t>(2 * k)], full[static_cast<size_t>(k)].real(), 1e-5);
    EXPECT_NEAR(half[static_cast<size_t>(2 * k + 1)], full[static_cast<size_t>(k)].imag(), 1e-5);
  }
  const std::vector<float> restored = runKernel("DFT", {operand<float>({1, 5, 2}, half)}, {1, 8, 1},
                                                params({{"axis", int64_t{1}}, {"inverse", int64_t{1}}, {"onesided", int64_t{1}}}));
  expectNear(restored, std::vector<double>(real.begin(), real.end()), 1e-5);
}

// Opset 20 with the axis a run-time input: every axis keeps its length, so
// the step runs whichever axis the call names.
TEST(DftKernel, RunTimeAxis) {
  const std::vector<float> x = randomValues<float>(24, 6, -1, 1);  // [2, 3, 4, 1]
  for (int64_t axis : {0, 1, 2, -2}) {
    const std::vector<float> fixed =
        runKernel("DFT", {operand<float>({2, 3, 4, 1}, x)}, {2, 3, 4, 2}, params({{"axis", axis}}));
    const std::vector<float> runtime =
        runKernel("DFT", {operand<float>({2, 3, 4, 1}, x), omitted(), operand<int64_t>({}, {axis})}, {2, 3, 4, 2});
    EXPECT_EQ(runtime, fixed) << "axis " << axis;
  }
}

TEST(DftKernel, Errors) {
  const Operand x = operand<float>({1, 4, 4, 1}, std::vector<float>(16));
  EXPECT_THAT(prepareError("DFT", {x, omitted(), operand<int64_t>({}, {1})}, {output(DType::kF32, {1, 3, 3, 2})},
                           params({{"onesided", int64_t{1}}})),
              HasSubstr("fits no axis"));
  EXPECT_THAT(prepareError("DFT", {x, operand<int64_t>({}, {4})}, {output(DType::kF32, {1, 4, 4, 2})},
                           params({{"axis", int64_t{1}}})),
              HasSubstr("dft_length must be a constant"));
  EXPECT_THAT(prepareError("DFT", {x}, {output(DType::kF32, {1, 4, 4, 2})}),
              HasSubstr("the default differs between opset 17 (1) and 20 (-2)"));
  EXPECT_THAT(prepareError("DFT", {x}, {output(DType::kF32, {1, 4, 4, 1})}, params({{"axis", int64_t{2}}})),
              HasSubstr("must be f32[1, 4, 4, 2]"));
}

TEST(StftKernel, WindowedFramesMatchTheirDfts) {
  // Signal of 20, frames of 8 every 5 samples: 3 frames, 5 one-sided bins.
  const std::vector<float> x = randomValues<float>(20, 4, -1, 1);
  const std::vector<float> window = randomValues<float>(8, 5, 0, 1);
  const std::vector<float> y =
      runKernel("STFT", {operand<float>({1, 20, 1}, x), operand<int64_t>({}, {5}), operand<float>({8}, window)}, {1, 3, 5, 2});
  std::vector<double> want;
  for (int64_t f = 0; f < 3; ++f) {
    std::vector<Complex> frame;
    for (int64_t t = 0; t < 8; ++t) frame.emplace_back(x[static_cast<size_t>(f * 5 + t)] * window[static_cast<size_t>(t)], 0);
    const std::vector<Complex> spectrum = dft(frame, 8, false);
    for (int64_t k = 0; k < 5; ++k) {
      want.push_back(spectrum[static_cast<size_t>(k)].real());
      want.push_back(spectrum[static_cast<size_t>(k)].imag());
    }
  }
  expectNear(y, want, 1e-5);
  EXPECT_THAT(prepareError("STFT", {operand<float>({1, 20, 1}, x), operand<int64_t>({}, {5}), omitted(), operand<int64_t>({}, {8})},
                           {output(DType::kF32, {1, 3, 5, 2})}),
              HasSubstr("frame_length must be a constant"));
}

TEST(WindowKernels, Formulas) {
  const Operand size = operand<int32_t>({}, {4});
  expectNear(runKernel("HannWindow", {size}, {4}), {0, 0.5, 1, 0.5}, 1e-7);
  expectNear(runKernel("HannWindow", {size}, {4}, params({{"periodic", int64_t{0}}})), {0, 0.75, 0.75, 0}, 1e-7);
  const double a = 25.0 / 46.0;
  const double b = 21.0 / 46.0;
  expectNear(runKernel("HammingWindow", {size}, {4}), {a - b, a, a + b, a}, 1e-7);
  expectNear(runKernel("BlackmanWindow", {size}, {4}), {0, 0.34, 1, 0.34}, 1e-7);
  expectNear(runKernel("BlackmanWindow", {operand<int32_t>({}, {1})}, {1}, params({{"periodic", int64_t{0}}})), {1}, 0);
}

TEST(MelWeightMatrixKernel, OnnxReference) {
  // 3 mel bins, dft_length 32, 8 kHz, 100 to 3800 Hz (onnx's reference).
  const std::vector<float> y = runKernel(
      "MelWeightMatrix",
      {operand<int32_t>({}, {3}), operand<int32_t>({}, {32}), operand<int32_t>({}, {8000}), operand<float>({}, {100}),
       operand<float>({}, {3800})},
      {17, 3});
  std::vector<double> want(51, 0.0);
  const std::vector<double> head{0, 0, 0, 1, 0, 0, 0.5, 0.5, 0, 0, 1, 0, 0, 2.0 / 3, 1.0 / 3, 0, 1.0 / 3, 2.0 / 3,
                                 0, 0, 1, 0, 0, 0.75, 0, 0, 0.5, 0, 0, 0.25};
  std::copy(head.begin(), head.end(), want.begin());
  expectNear(y, want, 1e-6);
}

}  // namespace
}  // namespace kiln

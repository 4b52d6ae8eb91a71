// Conv and ConvTranspose against double-precision references written here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "core/float_formats.h"
#include "kernels/kernel.h"
#include "kiln/error.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/support/allocation_counter.h"

namespace kiln {
namespace {

using ::kiln::testing::channelsLast;
using ::kiln::testing::elementCount;
using ::kiln::testing::omitted;
using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::kiln::testing::randomValues;
using ::kiln::testing::unravel;
using Ints = std::vector<int64_t>;

// oneDNN may sum in another order: compare within this fraction of sum |terms|.
constexpr double kTolerance = 1e-4;

struct Reference {
  std::vector<double> values;
  std::vector<double> magnitudes;
};

::testing::AssertionResult matches(const std::vector<float>& got, const Reference& want) {
  if (got.size() != want.values.size()) {
    return ::testing::AssertionFailure() << "got " << got.size() << " elements, want " << want.values.size();
  }
  size_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(got[i] - want.values[i]) <= kTolerance * want.magnitudes[i] + 1e-6)) {
      if (mismatches++ == 0) {
        first = "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " +
                std::to_string(want.values[i]);
      }
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << got.size() << " elements differ; first: " << first;
}

int64_t ravel(const Ints& shape, const Ints& coords) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + coords[d];
  return flat;
}

struct Attrs {
  Ints strides{};
  Ints dilations{};
  Ints pads{};  // begin values then end values; empty: all zero
  int64_t group = 1;
  std::string auto_pad{};  // empty: not set
  Ints output_padding{};   // ConvTranspose
};

ParamMap params(const Attrs& a, size_t spatial) {
  ParamMap p;
  if (!a.strides.empty()) p.set("strides", a.strides);
  if (!a.dilations.empty()) p.set("dilations", a.dilations);
  if (!a.pads.empty()) p.set("pads", a.pads);
  if (a.group != 1) p.set("group", a.group);
  if (!a.auto_pad.empty()) p.set("auto_pad", a.auto_pad);
  if (!a.output_padding.empty()) p.set("output_padding", a.output_padding);
  (void)spatial;
  return p;
}

// ------------------------------------------------------------------- Conv

// The explicit pads and the output shape, from the ONNX formulas.
void convGeometry(const Ints& x, const Ints& w, const Attrs& a, Ints& pad_begin, Ints& out) {
  const size_t n = x.size() - 2;
  pad_begin.assign(n, 0);
  out = {x[0], w[0]};
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = a.strides.empty() ? 1 : a.strides[i];
    const int64_t d = a.dilations.empty() ? 1 : a.dilations[i];
    const int64_t extent = (w[i + 2] - 1) * d + 1;
    if (a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER") {
      const int64_t o = (x[i + 2] + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (o - 1) * s + extent - x[i + 2]);
      pad_begin[i] = a.auto_pad == "SAME_UPPER" ? total / 2 : (total + 1) / 2;
      out.push_back(o);
    } else {
      const int64_t pb = a.pads.empty() || a.auto_pad == "VALID" ? 0 : a.pads[i];
      const int64_t pe = a.pads.empty() || a.auto_pad == "VALID" ? 0 : a.pads[i + n];
      pad_begin[i] = pb;
      out.push_back((x[i + 2] + pb + pe - extent) / s + 1);
    }
  }
}

Reference convReference(const Ints& xs, const std::vector<float>& x, const Ints& ws, const std::vector<float>& w,
                        const std::vector<float>* bias, const Attrs& a, const Ints& pad_begin, const Ints& out) {
  const size_t n = xs.size() - 2;
  const int64_t cg = ws[1];
  const int64_t mg = ws[0] / a.group;
  const Ints kernel(ws.begin() + 2, ws.end());
  const int64_t taps = static_cast<int64_t>(elementCount(kernel));
  Reference ref;
  for (int64_t flat = 0; flat < static_cast<int64_t>(elementCount(out)); ++flat) {
    const Ints o = unravel(out, flat);
    const int64_t batch = o[0], m = o[1], g = m / mg;
    double sum = bias ? (*bias)[static_cast<size_t>(m)] : 0.0;
    double magnitude = std::abs(sum);
    for (int64_t c = 0; c < cg; ++c) {
      for (int64_t t = 0; t < taps; ++t) {
        const Ints k = unravel(kernel, t);
        Ints xi{batch, g * cg + c};
        bool inside = true;
        for (size_t i = 0; i < n; ++i) {
          const int64_t s = a.strides.empty() ? 1 : a.strides[i];
          const int64_t d = a.dilations.empty() ? 1 : a.dilations[i];
          const int64_t pos = o[i + 2] * s - pad_begin[i] + k[i] * d;
          inside = inside && pos >= 0 && pos < xs[i + 2];
          xi.push_back(pos);
        }
        if (!inside) continue;
        Ints wi{m, c};
        wi.insert(wi.end(), k.begin(), k.end());
        const double term = static_cast<double>(x[static_cast<size_t>(ravel(xs, xi))]) *
                            w[static_cast<size_t>(ravel(ws, wi))];
        sum += term;
        magnitude += std::abs(term);
      }
    }
    ref.values.push_back(sum);
    ref.magnitudes.push_back(magnitude);
  }
  return ref;
}

std::string describe(const Ints& x, const Ints& w, const Attrs& a) {
  return "x " + TensorInfo{DType::kF32, x}.shapeString() + " w " + TensorInfo{DType::kF32, w}.shapeString() +
         " group " + std::to_string(a.group) + " auto_pad '" + a.auto_pad + "'";
}

void checkConv(const Ints& xs, const Ints& ws, const Attrs& a, bool with_bias, uint32_t seed) {
  const std::vector<float> x = randomValues<float>(elementCount(xs), seed, -1, 1);
  const std::vector<float> w = randomValues<float>(elementCount(ws), seed + 1, -1, 1);
  const std::vector<float> b = randomValues<float>(static_cast<size_t>(ws[0]), seed + 2, -1, 1);
  Ints pad_begin, out;
  convGeometry(xs, ws, a, pad_begin, out);
  const Reference want = convReference(xs, x, ws, w, with_bias ? &b : nullptr, a, pad_begin, out);
  for (bool constant : {false, true}) {
    std::vector<Operand> inputs = {operand(xs, x), operand(ws, w, constant)};
    if (with_bias) inputs.push_back(operand<float>({ws[0]}, b, constant));
    std::vector<Operand> outputs = {output(DType::kF32, out)};
    const PreparedKernel kernel("Conv", inputs, outputs, params(a, xs.size() - 2));
    kernel.run(inputs, outputs);
    EXPECT_TRUE(matches(outputs[0].values<float>(), want))
        << describe(xs, ws, a) << (constant ? " (constant weights)" : "") << (with_bias ? " with bias" : "");
    // A second call with other inputs: nothing of the first is kept.
    const std::vector<float> x2 = randomValues<float>(x.size(), seed + 3, -1, 1);
    inputs[0] = operand(xs, x2);
    kernel.run(inputs, outputs);
    EXPECT_TRUE(matches(outputs[0].values<float>(),
                        convReference(xs, x2, ws, w, with_bias ? &b : nullptr, a, pad_begin, out)))
        << describe(xs, ws, a) << " second call";
  }
}

TEST(ConvKernel, TwoDimensional) {
  uint32_t seed = 1;
  checkConv({1, 1, 5, 5}, {1, 1, 3, 3}, {}, false, seed += 10);
  checkConv({2, 3, 8, 7}, {4, 3, 3, 3}, {}, true, seed += 10);
  checkConv({2, 3, 8, 7}, {4, 3, 3, 2}, {.strides = {2, 3}}, true, seed += 10);
  checkConv({1, 4, 9, 9}, {6, 4, 3, 3}, {.dilations = {2, 1}}, true, seed += 10);
  checkConv({1, 4, 9, 10}, {6, 4, 3, 3}, {.pads = {1, 0, 2, 1}}, true, seed += 10);  // asymmetric
  checkConv({2, 5, 11, 13}, {8, 5, 5, 3}, {.strides = {2, 2}, .dilations = {1, 2}, .pads = {2, 1, 0, 3}}, false,
            seed += 10);
  checkConv({1, 16, 14, 14}, {32, 16, 1, 1}, {}, true, seed += 10);  // pointwise
  checkConv({1, 32, 20, 20}, {64, 32, 3, 3}, {.pads = {1, 1, 1, 1}}, true, seed += 10);
}

TEST(ConvKernel, GroupsAndDepthwise) {
  uint32_t seed = 100;
  checkConv({2, 4, 7, 7}, {6, 2, 3, 3}, {.group = 2}, true, seed += 10);
  checkConv({1, 6, 9, 8}, {9, 2, 3, 3}, {.strides = {2, 1}, .pads = {1, 1, 1, 1}, .group = 3}, false, seed += 10);
  checkConv({2, 8, 10, 10}, {8, 1, 3, 3}, {.pads = {1, 1, 1, 1}, .group = 8}, true, seed += 10);  // depthwise
  checkConv({1, 8, 12, 11}, {16, 1, 5, 5}, {.strides = {2, 2}, .dilations = {2, 2}, .pads = {4, 3, 4, 4}, .group = 8},
            true, seed += 10);  // depthwise multiplier 2
}

TEST(ConvKernel, AutoPad) {
  uint32_t seed = 200;
  for (const char* mode : {"SAME_UPPER", "SAME_LOWER", "VALID"}) {
    checkConv({1, 3, 7, 8}, {4, 3, 3, 3}, {.auto_pad = mode}, true, seed += 10);
    checkConv({1, 3, 7, 8}, {4, 3, 4, 2}, {.strides = {2, 3}, .auto_pad = mode}, true, seed += 10);
    checkConv({1, 2, 9, 6}, {4, 1, 3, 3}, {.dilations = {2, 2}, .group = 2, .auto_pad = mode}, false, seed += 10);
  }
  // NOTSET with pads given explicitly.
  checkConv({1, 3, 7, 8}, {4, 3, 3, 3}, {.pads = {1, 1, 1, 1}, .auto_pad = "NOTSET"}, true, seed += 10);
}

TEST(ConvKernel, OneAndThreeDimensional) {
  uint32_t seed = 300;
  checkConv({2, 3, 17}, {5, 3, 4}, {}, true, seed += 10);
  checkConv({2, 4, 17}, {6, 2, 3}, {.strides = {2}, .dilations = {3}, .pads = {2, 1}, .group = 2}, true, seed += 10);
  checkConv({1, 2, 5, 6, 7}, {3, 2, 3, 3, 3}, {}, true, seed += 10);
  checkConv({1, 4, 6, 7, 5}, {4, 1, 2, 3, 3}, {.strides = {2, 1, 2}, .pads = {0, 1, 1, 1, 1, 0}, .group = 4}, false,
            seed += 10);
  checkConv({1, 2, 5, 6, 7}, {2, 2, 3, 3, 3}, {.auto_pad = "SAME_LOWER"}, true, seed += 10);
}

TEST(ConvKernel, EmptyBatchDoesNothing) {
  std::vector<Operand> inputs = {operand<float>({0, 2, 5, 5}, {}), operand<float>({3, 2, 3, 3}, std::vector<float>(54, 1))};
  std::vector<Operand> outputs = {output(DType::kF32, {0, 3, 3, 3})};
  const PreparedKernel kernel("Conv", inputs, outputs);
  kernel.run(inputs, outputs);
}

TEST(ConvKernel, ConcurrentRunsOnOneState) {
  const Ints xs = {1, 8, 12, 12}, ws = {16, 8, 3, 3};
  const std::vector<float> w = randomValues<float>(elementCount(ws), 7, -1, 1);
  std::vector<Operand> inputs = {operand(xs, randomValues<float>(elementCount(xs), 8, -1, 1)), operand(ws, w, true)};
  std::vector<Operand> outputs = {output(DType::kF32, {1, 16, 10, 10})};
  const PreparedKernel kernel("Conv", inputs, outputs);
  constexpr int kThreads = 6;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::vector<float> x = randomValues<float>(elementCount(xs), 1000 + t, -1, 1);
      std::vector<Operand> my_inputs = {operand(xs, x), operand(ws, w)};
      std::vector<Operand> my_outputs = {output(DType::kF32, {1, 16, 10, 10})};
      const Reference want = convReference(xs, x, ws, w, nullptr, {}, {0, 0}, {1, 16, 10, 10});
      for (int i = 0; i < 10; ++i) {
        kernel.run(my_inputs, my_outputs);
        if (!matches(my_outputs[0].values<float>(), want)) ++failures[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

// f64 and f16 run on the direct loop: against the same double reference,
// to their own precision.
TEST(ConvKernel, OtherFloatTypesOnTheLoop) {
  const Ints xs{2, 4, 6, 5};
  const Ints ws{6, 2, 3, 2};
  const Attrs a{.strides = {2, 1}, .dilations = {1, 2}, .pads = {1, 0, 2, 1}, .group = 2};
  const std::vector<float> x = randomValues<float>(elementCount(xs), 70, -1, 1);
  const std::vector<float> w = randomValues<float>(elementCount(ws), 71, -1, 1);
  const std::vector<float> b = randomValues<float>(6, 72, -1, 1);
  Ints pad_begin, out;
  convGeometry(xs, ws, a, pad_begin, out);
  const Reference want = convReference(xs, x, ws, w, &b, a, pad_begin, out);
  auto widen = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  std::vector<Operand> inputs = {operand(xs, widen(x)), operand(ws, widen(w)), operand<double>({6}, widen(b))};
  std::vector<Operand> outputs = {output(DType::kF64, out)};
  PreparedKernel("Conv", inputs, outputs, params(a, 2)).run(inputs, outputs);
  const std::vector<double> got = outputs[0].values<double>();
  ASSERT_EQ(got.size(), want.values.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want.values[i], 1e-12) << i;

  auto half = [](const std::vector<float>& v, const Ints& shape) {
    std::vector<uint16_t> bits;
    for (float f : v) bits.push_back(floatToHalf(f));
    Operand op = operand(shape, bits);
    op.info.dtype = DType::kF16;
    return op;
  };
  // Inputs rounded to f16 first: the reference of those values.
  std::vector<float> x16, w16, b16;
  for (float f : x) x16.push_back(halfToFloat(floatToHalf(f)));
  for (float f : w) w16.push_back(halfToFloat(floatToHalf(f)));
  for (float f : b) b16.push_back(halfToFloat(floatToHalf(f)));
  const Reference want16 = convReference(xs, x16, ws, w16, &b16, a, pad_begin, out);
  std::vector<Operand> inputs16 = {half(x, xs), half(w, ws), half(b, {6})};
  std::vector<Operand> outputs16 = {output(DType::kF16, out)};
  PreparedKernel("Conv", inputs16, outputs16, params(a, 2)).run(inputs16, outputs16);
  const std::vector<uint16_t> got16 = outputs16[0].values<uint16_t>();
  for (size_t i = 0; i < got16.size(); ++i) {
    EXPECT_NEAR(halfToFloat(got16[i]), want16.values[i], 1e-3 * (1 + std::abs(want16.values[i]))) << i;
  }
}

TEST(ConvKernel, PrepareErrors) {
  using ::testing::HasSubstr;
  const auto x = operand<float>({1, 4, 5, 5}, std::vector<float>(100, 0));
  const auto w = operand<float>({6, 2, 3, 3}, std::vector<float>(108, 0));
  ParamMap group2;
  group2.set("group", int64_t{2});
  EXPECT_EQ(prepareError("Conv", {x, w}, {output(DType::kF32, {1, 6, 3, 3})}, group2), "(no error)");
  EXPECT_THAT(prepareError("Conv", {x, w}, {output(DType::kF32, {1, 6, 3, 3})}),
              HasSubstr("Conv: the input f32[1, 4, 5, 5] has 4 channels but the weights f32[6, 2, 3, 3] take 2"));
  EXPECT_THAT(prepareError("Conv", {x, w}, {output(DType::kF32, {1, 6, 5, 5})}, group2),
              HasSubstr("Conv: output is f32[1, 6, 5, 5] but the inputs give f32[1, 6, 3, 3]"));
  ParamMap bad_pad = group2;
  bad_pad.set("auto_pad", std::string("SAME"));
  EXPECT_THAT(prepareError("Conv", {x, w}, {output(DType::kF32, {1, 6, 3, 3})}, bad_pad),
              HasSubstr("auto_pad is 'SAME', not NOTSET, VALID, SAME_UPPER or SAME_LOWER"));
  // Dilations and pads from a crafted package overflowed the window
  // arithmetic (UBSan; found by package_fuzz).
  for (const char* key : {"dilations", "pads"}) {
    ParamMap huge = group2;
    huge.set(key, std::string(key) == "pads" ? Ints{INT64_MAX, 0, 0, 0} : Ints{INT64_MAX, 1});
    EXPECT_THAT(prepareError("Conv", {x, w}, {output(DType::kF32, {1, 6, 3, 3})}, huge),
                HasSubstr("spatial axis 0: the window arithmetic overflows"))
        << key;
  }
  ParamMap bad_strides = group2;
  bad_strides.set("strides", Ints{1});
  EXPECT_THAT(prepareError("Conv", {x, w}, {output(DType::kF32, {1, 6, 3, 3})}, bad_strides),
              HasSubstr("attribute 'strides' has 1 values, 2 expected"));
  ParamMap kernel_shape = group2;
  kernel_shape.set("kernel_shape", Ints{2, 2});
  EXPECT_THAT(prepareError("Conv", {x, w}, {output(DType::kF32, {1, 6, 3, 3})}, kernel_shape),
              HasSubstr("kernel_shape [2, 2] differs from the weights' spatial sizes [3, 3]"));
  EXPECT_THAT(prepareError("Conv", {x, w, operand<float>({5}, std::vector<float>(5, 0))},
                           {output(DType::kF32, {1, 6, 3, 3})}, group2),
              HasSubstr("the bias f32[5] must be [6]"));
  EXPECT_THAT(prepareError("Conv", {operand<double>({1, 4, 5, 5}, std::vector<double>(100, 0)), w},
                           {output(DType::kF64, {1, 6, 3, 3})}, group2),
              HasSubstr("Conv: input 1 is f32[6, 2, 3, 3]; every input must be static and f64"));
  EXPECT_THAT(prepareError("Conv", {operand<int32_t>({1, 4, 5, 5}, std::vector<int32_t>(100, 0)), w},
                           {output(DType::kI32, {1, 6, 3, 3})}, group2),
              HasSubstr("Conv: no kernel for i32 inputs (supports f32; f16, bf16, f64 of one type)"));
  EXPECT_THAT(prepareError("Conv", {operand<float>({1, 4, 2, 2}, std::vector<float>(16, 0)), w},
                           {output(DType::kF32, {1, 6, 1, 1})}, group2),
              HasSubstr("the kernel spans 3 elements (dilations included) but the padded input has 2"));
  EXPECT_THAT(prepareError("Conv", {operand<float>({1, 4, 2, 2, 2, 2}, std::vector<float>(64, 0)),
                                    operand<float>({1, 4, 1, 1, 1, 1}, std::vector<float>(4, 0))},
                           {output(DType::kF32, {1, 1, 2, 2, 2, 2})}),
              HasSubstr("with 1 to 3 spatial axes"));
}

// ---------------------------------------------------------- ConvTranspose

Reference convTransposeReference(const Ints& xs, const std::vector<float>& x, const Ints& ws,
                                 const std::vector<float>& w, const std::vector<float>* bias, const Attrs& a,
                                 const Ints& pad_begin, const Ints& out) {
  const size_t n = xs.size() - 2;
  const int64_t cg = xs[1] / a.group;
  const int64_t mg = ws[1];
  const Ints kernel(ws.begin() + 2, ws.end());
  Reference ref;
  ref.values.assign(elementCount(out), 0.0);
  ref.magnitudes.assign(elementCount(out), 0.0);
  for (int64_t flat = 0; flat < static_cast<int64_t>(elementCount(out)); ++flat) {
    const Ints o = unravel(out, flat);
    if (bias) {
      ref.values[static_cast<size_t>(flat)] = (*bias)[static_cast<size_t>(o[1])];
      ref.magnitudes[static_cast<size_t>(flat)] = std::abs((*bias)[static_cast<size_t>(o[1])]);
    }
  }
  for (int64_t xf = 0; xf < static_cast<int64_t>(elementCount(xs)); ++xf) {
    const Ints xi = unravel(xs, xf);
    const int64_t g = xi[1] / cg;
    for (int64_t m = 0; m < mg; ++m) {
      for (int64_t t = 0; t < static_cast<int64_t>(elementCount(kernel)); ++t) {
        const Ints k = unravel(kernel, t);
        Ints oi{xi[0], g * mg + m};
        bool inside = true;
        for (size_t i = 0; i < n; ++i) {
          const int64_t s = a.strides.empty() ? 1 : a.strides[i];
          const int64_t d = a.dilations.empty() ? 1 : a.dilations[i];
          const int64_t pos = xi[i + 2] * s + k[i] * d - pad_begin[i];
          inside = inside && pos >= 0 && pos < out[i + 2];
          oi.push_back(pos);
        }
        if (!inside) continue;
        Ints wi{xi[1], m};
        wi.insert(wi.end(), k.begin(), k.end());
        const double term = static_cast<double>(x[static_cast<size_t>(xf)]) * w[static_cast<size_t>(ravel(ws, wi))];
        ref.values[static_cast<size_t>(ravel(out, oi))] += term;
        ref.magnitudes[static_cast<size_t>(ravel(out, oi))] += std::abs(term);
      }
    }
  }
  return ref;
}

void checkConvTranspose(const Ints& xs, const Ints& ws, const Attrs& a, bool with_bias, uint32_t seed) {
  const size_t n = xs.size() - 2;
  const std::vector<float> x = randomValues<float>(elementCount(xs), seed, -1, 1);
  const std::vector<float> w = randomValues<float>(elementCount(ws), seed + 1, -1, 1);
  const int64_t m = ws[1] * a.group;
  const std::vector<float> b = randomValues<float>(static_cast<size_t>(m), seed + 2, -1, 1);
  Ints pad_begin(n, 0);
  Ints out{xs[0], m};
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = a.strides.empty() ? 1 : a.strides[i];
    const int64_t d = a.dilations.empty() ? 1 : a.dilations[i];
    const int64_t op = a.output_padding.empty() ? 0 : a.output_padding[i];
    const int64_t full = s * (xs[i + 2] - 1) + op + (ws[i + 2] - 1) * d + 1;
    if (a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER") {
      const int64_t total = full - xs[i + 2] * s;
      pad_begin[i] = a.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      out.push_back(xs[i + 2] * s);
    } else {
      const int64_t pb = a.pads.empty() ? 0 : a.pads[i];
      const int64_t pe = a.pads.empty() ? 0 : a.pads[i + n];
      pad_begin[i] = pb;
      out.push_back(full - pb - pe);
    }
  }
  const Reference want = convTransposeReference(xs, x, ws, w, with_bias ? &b : nullptr, a, pad_begin, out);
  for (bool constant : {false, true}) {
    std::vector<Operand> inputs = {operand(xs, x), operand(ws, w, constant)};
    if (with_bias) inputs.push_back(operand<float>({m}, b, constant));
    std::vector<Operand> outputs = {output(DType::kF32, out)};
    const PreparedKernel kernel("ConvTranspose", inputs, outputs, params(a, n));
    kernel.run(inputs, outputs);
    EXPECT_TRUE(matches(outputs[0].values<float>(), want))
        << describe(xs, ws, a) << (constant ? " (constant weights)" : "");
  }
}

TEST(ConvTransposeKernel, Shapes) {
  uint32_t seed = 500;
  checkConvTranspose({1, 1, 3, 3}, {1, 1, 3, 3}, {}, false, seed += 10);
  checkConvTranspose({2, 3, 5, 4}, {3, 4, 3, 3}, {.strides = {2, 2}}, true, seed += 10);
  checkConvTranspose({1, 4, 5, 5}, {4, 2, 3, 2}, {.strides = {2, 3}, .pads = {1, 0, 1, 1}, .group = 2}, true,
                     seed += 10);
  checkConvTranspose({1, 2, 4, 5}, {2, 3, 3, 3}, {.strides = {2, 2}, .pads = {1, 1, 1, 1}, .output_padding = {1, 1}},
                     true, seed += 10);
  checkConvTranspose({1, 2, 4, 5}, {2, 3, 3, 3}, {.strides = {3, 2}, .output_padding = {2, 1}}, false, seed += 10);
  checkConvTranspose({1, 2, 4, 5}, {2, 3, 2, 3}, {.dilations = {2, 2}}, true, seed += 10);
  checkConvTranspose({1, 6, 5, 5}, {6, 1, 3, 3}, {.strides = {2, 2}, .group = 6}, true, seed += 10);  // depthwise
  checkConvTranspose({2, 3, 7}, {3, 2, 4}, {.strides = {2}, .pads = {1, 2}}, true, seed += 10);
  checkConvTranspose({1, 2, 3, 4, 3}, {2, 2, 2, 3, 2}, {.strides = {2, 1, 2}}, true, seed += 10);
  for (const char* mode : {"SAME_UPPER", "SAME_LOWER"}) {
    checkConvTranspose({1, 2, 5, 4}, {2, 3, 3, 3}, {.strides = {2, 2}, .auto_pad = mode}, true, seed += 10);
  }
}

// kiln.NhwcConvTranspose whose kernel equals its strides runs as one matmul
// (patch_conv_transpose.h), its post-ops included; with weights per call it
// takes oneDNN's deconvolution.
void checkPatchConvTranspose(const Ints& xs, const Ints& ws, bool with_bias, const std::string& post_ops,
                             uint32_t seed) {
  const Attrs a{.strides = {ws[2], ws[3]}};
  const std::vector<float> x = randomValues<float>(elementCount(xs), seed, -1, 1);
  const std::vector<float> w = randomValues<float>(elementCount(ws), seed + 1, -1, 1);
  const std::vector<float> b = randomValues<float>(static_cast<size_t>(ws[1]), seed + 2, -1, 1);
  const Ints out{xs[0], ws[1], xs[2] * ws[2], xs[3] * ws[3]};
  const std::vector<float> residual = randomValues<float>(elementCount(out), seed + 3, -1, 1);
  Reference want = convTransposeReference(xs, x, ws, w, with_bias ? &b : nullptr, a, {0, 0}, out);
  want.values = channelsLast(out, want.values);
  want.magnitudes = channelsLast(out, want.magnitudes);
  const std::vector<float> residual_nhwc = channelsLast(out, residual);
  for (size_t i = 0; i < want.values.size(); ++i) {
    if (post_ops.starts_with("Add")) want.values[i] += residual_nhwc[i];
    if (post_ops.ends_with("Relu")) want.values[i] = std::max(want.values[i], 0.0);
  }
  ParamMap p = params(a, 2);
  if (!post_ops.empty()) {
    p.set("post_ops", post_ops);
    const size_t count = post_ops.find(',') == std::string::npos ? 1 : 2;
    p.set("post_op_alpha", std::vector<double>(count, 0.0));
    p.set("post_op_beta", std::vector<double>(count, 0.0));
  }
  const Ints xs_nhwc{xs[0], xs[2], xs[3], xs[1]};
  const Ints out_nhwc{out[0], out[2], out[3], out[1]};
  for (bool constant : {true, false}) {
    std::vector<Operand> inputs = {operand(xs_nhwc, channelsLast(xs, x)), operand(ws, w, constant)};
    inputs.push_back(with_bias ? operand<float>({ws[1]}, b, constant) : omitted());
    if (post_ops.starts_with("Add")) inputs.push_back(operand(out_nhwc, residual_nhwc));
    std::vector<Operand> outputs = {output(DType::kF32, out_nhwc)};
    const PreparedKernel kernel("kiln.NhwcConvTranspose", inputs, outputs, p);
    kernel.run(inputs, outputs);
    EXPECT_TRUE(matches(outputs[0].values<float>(), want))
        << describe(xs, ws, a) << " post-ops '" << post_ops << "'" << (constant ? " (constant weights)" : "");
    if (!post_ops.empty()) break;  // the deconvolution would run them on oneDNN's reference kernel
  }
}

TEST(ConvTransposeKernel, NonOverlappingPatchesAsOneProduct) {
  uint32_t seed = 700;
  checkPatchConvTranspose({1, 24, 6, 5}, {24, 24, 2, 2}, false, "", seed += 10);  // DBNet's upsampling
  checkPatchConvTranspose({2, 8, 3, 4}, {8, 5, 2, 2}, true, "", seed += 10);
  checkPatchConvTranspose({1, 24, 4, 4}, {24, 1, 2, 2}, true, "", seed += 10);  // to one channel
  checkPatchConvTranspose({2, 3, 3, 2}, {3, 4, 3, 2}, true, "", seed += 10);    // kernel 3 x 2, strides 3 x 2
  checkPatchConvTranspose({1, 5, 3, 3}, {5, 7, 1, 1}, true, "", seed += 10);    // 1 x 1, stride 1
  checkPatchConvTranspose({1, 16, 4, 3}, {16, 16, 2, 2}, true, "Relu", seed += 10);
  checkPatchConvTranspose({2, 16, 3, 3}, {16, 8, 2, 2}, false, "Add,Relu", seed += 10);
}

// output_shape larger than the input, kernel and strides give (ONNX's
// test_convtranspose_output_shape): the padding total is negative, split by
// floor division, so the extra rows and columns come at the end, as with
// output_padding; asking for more than the end can take is an error.
TEST(ConvTransposeKernel, OutputShapeBeyondTheFullSize) {
  const Ints xs{1, 1, 3, 3};
  const Ints ws{1, 2, 3, 3};
  const std::vector<float> x = randomValues<float>(elementCount(xs), 900, -1, 1);
  const std::vector<float> w = randomValues<float>(elementCount(ws), 901, -1, 1);
  const Attrs a{.strides = {3, 2}};
  const Ints out{1, 2, 10, 8};  // the full size is [9, 7]
  const Reference want = convTransposeReference(xs, x, ws, w, nullptr, a, {0, 0}, out);
  ParamMap p = params(a, 2);
  p.set("output_shape", Ints{10, 8});
  std::vector<Operand> inputs = {operand(xs, x), operand(ws, w)};
  std::vector<Operand> outputs = {output(DType::kF32, out)};
  const PreparedKernel kernel("ConvTranspose", inputs, outputs, p);
  kernel.run(inputs, outputs);
  EXPECT_TRUE(matches(outputs[0].values<float>(), want));
  p.set("output_shape", Ints{11, 7});
  EXPECT_THAT(prepareError("ConvTranspose", inputs, {output(DType::kF32, {1, 2, 11, 7})}, p),
              ::testing::HasSubstr("output size 11 is larger than the 9"));
}

TEST(ConvTransposeKernel, PrepareErrors) {
  using ::testing::HasSubstr;
  const auto x = operand<float>({1, 4, 3, 3}, std::vector<float>(36, 0));
  const auto w = operand<float>({3, 2, 3, 3}, std::vector<float>(54, 0));
  EXPECT_THAT(prepareError("ConvTranspose", {x, w}, {output(DType::kF32, {1, 2, 5, 5})}),
              HasSubstr("ConvTranspose: the input f32[1, 4, 3, 3] has 4 channels but the weights f32[3, 2, 3, 3] take 3"));
  const auto w4 = operand<float>({4, 2, 3, 3}, std::vector<float>(72, 0));
  EXPECT_EQ(prepareError("ConvTranspose", {x, w4}, {output(DType::kF32, {1, 2, 5, 5})}), "(no error)");
  EXPECT_THAT(prepareError("ConvTranspose", {x, w4}, {output(DType::kF32, {1, 2, 6, 6})}),
              HasSubstr("output is f32[1, 2, 6, 6] but the inputs give f32[1, 2, 5, 5]"));
}


// ------------------------------------------------------------- allocation

// Conv, ConvTranspose, MaxPool and AveragePool run through oneDNN, whose
// dnnl_primitive_execute allocates a few small objects per call (see
// allocation_test.cc); oneDNN's gemm-based convolution and deconvolution
// (what it picks for plain NCHW activations) allocate more inside execute
// than its matmul. Measured with oneDNN 2.6 per call (operator new / malloc):
// Conv 9 / 11 on 2 threads, ConvTranspose 12 / 15, MaxPool and AveragePool
// 8 / 8. The kernels themselves make no memory object, stream or scratchpad
// per call; the bounds below catch a regression, and the figures are printed.
TEST(ConvAllocations, OneDnnRunsAllocateOnlyAFewSmallBlocks) {
  struct Case {
    std::string op;
    std::vector<Operand> inputs;
    std::vector<Operand> outputs;
    ParamMap params;
  };
  const auto f = [](const Ints& shape, uint32_t seed, bool constant = false) {
    return operand(shape, randomValues<float>(elementCount(shape), seed, -1, 1), constant);
  };
  ParamMap pads;
  pads.set("pads", Ints{1, 1, 1, 1});
  ParamMap pool;
  pool.set("kernel_shape", Ints{3, 3});
  pool.set("strides", Ints{2, 2});
  std::vector<Case> cases;
  cases.push_back({"Conv", {f({1, 16, 14, 14}, 1), f({32, 16, 3, 3}, 2, true), f({32}, 3, true)},
                   {output(DType::kF32, {1, 32, 14, 14})}, pads});
  cases.push_back({"Conv", {f({1, 16, 14, 14}, 1), f({32, 16, 3, 3}, 2), f({32}, 3)},
                   {output(DType::kF32, {1, 32, 14, 14})}, pads});
  cases.push_back({"ConvTranspose", {f({1, 16, 7, 7}, 4), f({16, 8, 3, 3}, 5, true)},
                   {output(DType::kF32, {1, 8, 9, 9})}, {}});
  cases.push_back({"MaxPool", {f({1, 16, 14, 14}, 6)}, {output(DType::kF32, {1, 16, 6, 6})}, pool});
  cases.push_back({"AveragePool", {f({1, 16, 14, 14}, 7)}, {output(DType::kF32, {1, 16, 6, 6})}, pool});
#if defined(_OPENMP)
  const uint64_t threads = static_cast<uint64_t>(omp_get_max_threads());
#else
  const uint64_t threads = 1;
#endif
  for (Case& c : cases) {
    const PreparedKernel kernel(c.op, c.inputs, c.outputs, c.params);
    const auto bound = kernel.bind(c.inputs, c.outputs);
    kernel.run(bound->call);
    constexpr uint64_t kCalls = 100;
    ::kiln::testing::startCountingAllocations();
    for (uint64_t i = 0; i < kCalls; ++i) kernel.run(bound->call);
    const ::kiln::testing::AllocationCount count = ::kiln::testing::stopCountingAllocations();
    std::cout << "[ note     ] " << c.op << " via oneDNN, per call: " << static_cast<double>(count.news) / kCalls
              << " operator new and " << static_cast<double>(count.mallocs) / kCalls << " malloc-family calls"
              << (::kiln::testing::countsMallocs() ? "" : " (malloc not counted in this build)") << "\n";
    // A few blocks per call, and a few more per thread that joins it: per
    // call, the 3x3 Conv made 9 malloc-family calls on 1 thread, 11 on 2, 15
    // on 4, 23 on 8 and 27 on 16; ConvTranspose 12 operator new and 15
    // mallocs on any number.
    EXPECT_LE(count.news, (12 + threads) * kCalls) << c.op;
    EXPECT_LE(count.mallocs, (13 + 2 * threads) * kCalls) << c.op;
  }
}

}  // namespace
}  // namespace kiln

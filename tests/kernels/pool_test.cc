// MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool against
// double-precision references written here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "kiln/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

using ::kiln::testing::channelsLast;
using ::kiln::testing::elementCount;
using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::kiln::testing::randomValues;
using ::kiln::testing::unravel;
using Ints = std::vector<int64_t>;

::testing::AssertionResult near(const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "got " << got.size() << " elements, want " << want.size();
  }
  size_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(got[i] - want[i]) <= 1e-5 * (1 + std::abs(want[i])))) {
      if (mismatches++ == 0) {
        first = "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " + std::to_string(want[i]);
      }
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << got.size() << " elements differ; first: " << first;
}

struct Attrs {
  Ints kernel{};
  Ints strides{};
  Ints dilations{};
  Ints pads{};
  std::string auto_pad{};
  bool ceil_mode = false;
  bool count_include_pad = false;
};

ParamMap params(const Attrs& a) {
  ParamMap p;
  p.set("kernel_shape", a.kernel);
  if (!a.strides.empty()) p.set("strides", a.strides);
  if (!a.dilations.empty()) p.set("dilations", a.dilations);
  if (!a.pads.empty()) p.set("pads", a.pads);
  if (!a.auto_pad.empty()) p.set("auto_pad", a.auto_pad);
  if (a.ceil_mode) p.set("ceil_mode", int64_t{1});
  if (a.count_include_pad) p.set("count_include_pad", int64_t{1});
  return p;
}

// Pads (begin, end) and output sizes by the ONNX formulas; then the pooling.
std::vector<double> poolReference(const Ints& xs, const std::vector<float>& x, const Attrs& a, bool max, Ints& out) {
  const size_t n = xs.size() - 2;
  Ints pb(n), pe(n);
  out = {xs[0], xs[1]};
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = a.strides.empty() ? 1 : a.strides[i];
    const int64_t d = a.dilations.empty() ? 1 : a.dilations[i];
    const int64_t extent = (a.kernel[i] - 1) * d + 1;
    const int64_t in = xs[i + 2];
    if (a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER") {
      const int64_t o = (in + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (o - 1) * s + extent - in);
      pb[i] = a.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe[i] = total - pb[i];
      out.push_back(o);
    } else {
      pb[i] = a.pads.empty() || a.auto_pad == "VALID" ? 0 : a.pads[i];
      pe[i] = a.pads.empty() || a.auto_pad == "VALID" ? 0 : a.pads[i + n];
      const double exact = static_cast<double>(in + pb[i] + pe[i] - extent) / static_cast<double>(s) + 1;
      int64_t o = static_cast<int64_t>(a.ceil_mode ? std::ceil(exact) : std::floor(exact));
      if (a.ceil_mode && (o - 1) * s >= in + pb[i]) --o;  // the last window starts inside
      out.push_back(o);
    }
  }
  const Ints spatial_out(out.begin() + 2, out.end());
  std::vector<double> y;
  for (int64_t flat = 0; flat < static_cast<int64_t>(elementCount(out)); ++flat) {
    const Ints o = unravel(out, flat);
    double acc = max ? -std::numeric_limits<double>::infinity() : 0.0;
    int64_t valid = 0, padded = 0;
    for (int64_t t = 0; t < static_cast<int64_t>(elementCount(a.kernel)); ++t) {
      const Ints k = unravel(a.kernel, t);
      bool inside = true, in_pads = true;
      int64_t index = o[0] * xs[1] + o[1];
      for (size_t i = 0; i < n; ++i) {
        const int64_t s = a.strides.empty() ? 1 : a.strides[i];
        const int64_t d = a.dilations.empty() ? 1 : a.dilations[i];
        const int64_t pos = o[i + 2] * s - pb[i] + k[i] * d;
        inside = inside && pos >= 0 && pos < xs[i + 2];
        in_pads = in_pads && pos >= -pb[i] && pos < xs[i + 2] + pe[i];
        index = index * xs[i + 2] + pos;
      }
      if (in_pads) ++padded;
      if (!inside) continue;
      ++valid;
      const double v = x[static_cast<size_t>(index)];
      acc = max ? std::max(acc, v) : acc + v;
    }
    if (!max) acc /= static_cast<double>(a.count_include_pad ? padded : valid);
    y.push_back(acc);
  }
  return y;
}

void checkPool(const char* op, const Ints& xs, const Attrs& a, uint32_t seed) {
  const bool max = std::string(op) == "MaxPool";
  const std::vector<float> x = randomValues<float>(elementCount(xs), seed, -2, 2);
  Ints out;
  const std::vector<double> want = poolReference(xs, x, a, max, out);
  std::vector<Operand> inputs = {operand(xs, x)};
  std::vector<Operand> outputs = {output(DType::kF32, out)};
  const PreparedKernel kernel(op, inputs, outputs, params(a));
  kernel.run(inputs, outputs);
  EXPECT_TRUE(near(outputs[0].values<float>(), want))
      << op << " x " << TensorInfo{DType::kF32, xs}.shapeString() << " out " << TensorInfo{DType::kF32, out}.shapeString()
      << " auto_pad '" << a.auto_pad << "' ceil_mode " << a.ceil_mode << " count_include_pad " << a.count_include_pad;
}

void checkBoth(const Ints& xs, const Attrs& a, uint32_t seed) {
  checkPool("MaxPool", xs, a, seed);
  checkPool("AveragePool", xs, a, seed);
  Attrs include = a;
  include.count_include_pad = true;
  checkPool("AveragePool", xs, include, seed);
}

TEST(PoolKernel, TwoDimensional) {
  uint32_t seed = 1;
  checkBoth({1, 1, 4, 4}, {.kernel = {2, 2}, .strides = {2, 2}}, seed += 10);
  checkBoth({2, 3, 9, 8}, {.kernel = {3, 3}}, seed += 10);
  checkBoth({2, 3, 9, 8}, {.kernel = {3, 2}, .strides = {2, 3}}, seed += 10);
  checkBoth({1, 4, 10, 11}, {.kernel = {3, 3}, .strides = {2, 2}, .pads = {1, 1, 1, 1}}, seed += 10);
  checkBoth({1, 4, 10, 11}, {.kernel = {3, 3}, .strides = {2, 1}, .pads = {0, 2, 1, 0}}, seed += 10);  // asymmetric
  checkBoth({1, 16, 14, 14}, {.kernel = {2, 2}, .strides = {2, 2}}, seed += 10);
}

// kiln.NhwcMaxPool: windows of unit stride along W run as maxima of whole
// shifted rows (pool.cc, runRowMaxPool); the others on oneDNN.
void checkNhwcMaxPool(const Ints& xs, const Attrs& a, uint32_t seed) {
  std::vector<float> x = randomValues<float>(elementCount(xs), seed, -2, 2);
  Ints out;
  const std::vector<double> want_nchw = poolReference(xs, x, a, true, out);
  const std::vector<float> want = channelsLast(out, std::vector<float>(want_nchw.begin(), want_nchw.end()));
  Ints xs_last = {xs[0]}, out_last = {out[0]};
  xs_last.insert(xs_last.end(), xs.begin() + 2, xs.end());
  out_last.insert(out_last.end(), out.begin() + 2, out.end());
  xs_last.push_back(xs[1]);
  out_last.push_back(out[1]);
  std::vector<Operand> inputs = {operand(xs_last, channelsLast(xs, x))};
  std::vector<Operand> outputs = {output(DType::kF32, out_last)};
  const PreparedKernel kernel("kiln.NhwcMaxPool", inputs, outputs, params(a));
  kernel.run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<float>(), want) << TensorInfo{DType::kF32, xs}.shapeString() << " auto_pad '"
                                              << a.auto_pad << "' ceil_mode " << a.ceil_mode;
}

TEST(PoolKernel, ChannelsLastMaxPool) {
  uint32_t seed = 50;
  checkNhwcMaxPool({1, 24, 9, 8}, {.kernel = {2, 2}, .auto_pad = "SAME_UPPER"}, seed += 10);  // PP-OCRv6's detector
  checkNhwcMaxPool({2, 16, 7, 6}, {.kernel = {5, 5}, .pads = {2, 2, 2, 2}}, seed += 10);      // YOLO's SPPF
  checkNhwcMaxPool({1, 5, 10, 11}, {.kernel = {3, 3}, .strides = {2, 1}, .pads = {0, 2, 1, 0}}, seed += 10);
  checkNhwcMaxPool({1, 3, 4, 3}, {.kernel = {3, 4}, .pads = {1, 2, 1, 2}}, seed += 10);  // wider than the row
  checkNhwcMaxPool({1, 7, 1, 9}, {.kernel = {1, 3}, .pads = {0, 1, 0, 1}}, seed += 10);  // a Conv1D export
  checkNhwcMaxPool({1, 4, 9, 9}, {.kernel = {3, 3}, .strides = {2, 2}, .ceil_mode = true}, seed += 10);  // oneDNN
  checkNhwcMaxPool({1, 4, 9, 9}, {.kernel = {2, 2}, .dilations = {2, 1}}, seed += 10);                   // oneDNN
  // NaN propagates.
  std::vector<float> x(2 * 3 * 3, 1.0f);
  x[4 * 2] = std::numeric_limits<float>::quiet_NaN();  // pixel (1, 1), channel 0
  std::vector<Operand> inputs = {operand<float>({1, 3, 3, 2}, x)};
  std::vector<Operand> outputs = {output(DType::kF32, {1, 3, 3, 2})};
  const PreparedKernel kernel("kiln.NhwcMaxPool", inputs, outputs, params({.kernel = {2, 2}, .auto_pad = "SAME_UPPER"}));
  kernel.run(inputs, outputs);
  const std::vector<float> y = outputs[0].values<float>();
  for (int64_t p = 0; p < 9; ++p) {
    const bool reaches = p / 3 <= 1 && p % 3 <= 1;  // windows (oy, ox) that cover pixel (1, 1)
    EXPECT_EQ(std::isnan(y[static_cast<size_t>(p * 2)]), reaches) << p;
    EXPECT_EQ(y[static_cast<size_t>(p * 2 + 1)], 1.0f) << p;
  }
}

TEST(PoolKernel, Dilations) {
  uint32_t seed = 100;
  checkBoth({1, 2, 10, 9}, {.kernel = {2, 3}, .dilations = {2, 2}}, seed += 10);
  checkBoth({1, 2, 10, 9}, {.kernel = {3, 2}, .strides = {2, 2}, .dilations = {2, 3}, .pads = {1, 2, 2, 1}},
            seed += 10);
}

TEST(PoolKernel, CeilMode) {
  uint32_t seed = 200;
  checkBoth({1, 2, 7, 7}, {.kernel = {2, 2}, .strides = {2, 2}, .ceil_mode = true}, seed += 10);
  checkBoth({1, 2, 8, 7}, {.kernel = {3, 3}, .strides = {2, 2}, .pads = {1, 1, 1, 1}, .ceil_mode = true}, seed += 10);
  checkBoth({1, 3, 6, 10}, {.kernel = {3, 2}, .strides = {2, 3}, .pads = {0, 1, 0, 0}, .ceil_mode = true}, seed += 10);
  // The extra window would start in the right padding: dropped.
  checkBoth({1, 1, 5, 5}, {.kernel = {2, 2}, .strides = {2, 2}, .pads = {0, 0, 1, 1}, .ceil_mode = true}, seed += 10);
  // Exact fit: ceil_mode changes nothing.
  checkBoth({1, 1, 6, 6}, {.kernel = {2, 2}, .strides = {2, 2}, .ceil_mode = true}, seed += 10);
  checkBoth({1, 2, 9, 9}, {.kernel = {2, 2}, .strides = {3, 3}, .dilations = {2, 1}, .ceil_mode = true}, seed += 10);
}

TEST(PoolKernel, AutoPad) {
  uint32_t seed = 300;
  for (const char* mode : {"SAME_UPPER", "SAME_LOWER", "VALID"}) {
    checkBoth({1, 2, 7, 8}, {.kernel = {3, 3}, .auto_pad = mode}, seed += 10);
    checkBoth({1, 2, 7, 8}, {.kernel = {2, 3}, .strides = {2, 3}, .auto_pad = mode}, seed += 10);
  }
}

TEST(PoolKernel, OneAndThreeDimensional) {
  uint32_t seed = 400;
  checkBoth({2, 3, 17}, {.kernel = {3}, .strides = {2}, .pads = {1, 0}}, seed += 10);
  checkBoth({2, 3, 17}, {.kernel = {4}, .strides = {3}, .pads = {1, 2}, .ceil_mode = true}, seed += 10);
  checkBoth({1, 2, 5, 6, 7}, {.kernel = {2, 2, 3}, .strides = {1, 2, 2}}, seed += 10);
  checkBoth({1, 2, 5, 6, 7}, {.kernel = {3, 3, 3}, .strides = {2, 2, 2}, .pads = {1, 1, 1, 0, 1, 1}, .ceil_mode = true},
            seed += 10);
}

// MaxPool's Indices count over the whole input, row-major or, with
// storage_order 1, with the spatial axes column-major; LpPool takes the
// p-norm of each window.
TEST(PoolKernel, MaxPoolIndicesAndLpPool) {
  // x[n][c] is a 2 x 3 plane; one 2 x 2 window per output column.
  std::vector<Operand> inputs{operand<float>({1, 2, 2, 3}, {1, 5, 2, 3, 4, 6, -1, -5, -2, -3, -4, -6})};
  ParamMap p;
  p.set("kernel_shape", Ints{2, 2});
  for (int64_t order : {0, 1}) {
    p.set("storage_order", order);
    std::vector<Operand> outputs{output(DType::kF32, {1, 2, 1, 2}), output(DType::kI64, {1, 2, 1, 2})};
    PreparedKernel("MaxPool", inputs, outputs, p).run(inputs, outputs);
    EXPECT_EQ(outputs[0].values<float>(), (std::vector<float>{5, 6, -1, -2}));
    // Row-major: (0,1)=1, (1,2)=5, plane 1 (0,0)=6, (0,2)=8; column-major: (h,w) -> w*2+h.
    EXPECT_EQ(outputs[1].values<int64_t>(),
              order == 0 ? (std::vector<int64_t>{1, 5, 6, 8}) : (std::vector<int64_t>{2, 5, 6, 10}));
  }
  ParamMap lp;
  lp.set("kernel_shape", Ints{2, 2});
  for (int64_t power : {1, 2, 3}) {
    lp.set("p", power);
    std::vector<Operand> outputs{output(DType::kF32, {1, 2, 1, 2})};
    PreparedKernel("LpPool", inputs, outputs, lp).run(inputs, outputs);
    const std::vector<float> y = outputs[0].values<float>();
    const float* x = inputs[0].data<float>();
    for (int64_t c = 0; c < 2; ++c) {
      for (int64_t w = 0; w < 2; ++w) {
        double sum = 0;
        for (int64_t i = 0; i < 2; ++i) {
          for (int64_t j = 0; j < 2; ++j) sum += std::pow(std::abs(x[c * 6 + i * 3 + w + j]), static_cast<double>(power));
        }
        EXPECT_NEAR(y[static_cast<size_t>(c * 2 + w)], std::pow(sum, 1.0 / static_cast<double>(power)), 1e-4)
            << "p " << power << " c " << c << " w " << w;
      }
    }
  }
}

TEST(PoolKernel, PrepareErrors) {
  using ::testing::HasSubstr;
  const auto x = operand<float>({1, 2, 4, 4}, std::vector<float>(32, 0));
  ParamMap p;
  p.set("kernel_shape", Ints{2, 2});
  EXPECT_EQ(prepareError("MaxPool", {x}, {output(DType::kF32, {1, 2, 3, 3})}, p), "(no error)");
  EXPECT_EQ(prepareError("MaxPool", {x}, {output(DType::kF32, {1, 2, 3, 3}), output(DType::kI64, {1, 2, 3, 3})}, p),
            "(no error)");
  EXPECT_THAT(prepareError("MaxPool", {x}, {output(DType::kF32, {1, 2, 3, 3}), output(DType::kF32, {1, 2, 3, 3})}, p),
              HasSubstr("MaxPool: the Indices output is f32[1, 2, 3, 3], expected i64[1, 2, 3, 3]"));
  EXPECT_THAT(prepareError("AveragePool", {x}, {output(DType::kF32, {1, 2, 3, 3})}),
              HasSubstr("AveragePool: needs the 'kernel_shape' attribute"));
  EXPECT_THAT(prepareError("AveragePool", {x}, {output(DType::kF32, {1, 2, 2, 2})}, p),
              HasSubstr("output is f32[1, 2, 2, 2] but the inputs give f32[1, 2, 3, 3]"));
  ParamMap wrong = p;
  wrong.set("pads", Ints{1, 1});
  EXPECT_THAT(prepareError("MaxPool", {x}, {output(DType::kF32, {1, 2, 3, 3})}, wrong),
              HasSubstr("attribute 'pads' has 2 values, 4 expected"));
  EXPECT_THAT(prepareError("MaxPool", {operand<int32_t>({1, 2, 4, 4}, std::vector<int32_t>(32, 0))},
                           {output(DType::kI32, {1, 2, 3, 3})}, p),
              HasSubstr("MaxPool: no kernel for i32 inputs (supports f32)"));
  EXPECT_THAT(prepareError("GlobalMaxPool", {operand<float>({2, 3}, std::vector<float>(6, 0))},
                           {output(DType::kF32, {2, 3})}),
              HasSubstr("needs an input [N, C, spatial...] of rank 3 or more"));
}

// ------------------------------------------------------------ global pools

void checkGlobal(const Ints& xs, uint32_t seed) {
  const std::vector<float> x = randomValues<float>(elementCount(xs), seed, -2, 2);
  const int64_t rows = xs[0] * xs[1];
  const int64_t size = static_cast<int64_t>(elementCount(xs)) / rows;
  std::vector<double> avg, mx;
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0, m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < size; ++i) {
      s += x[static_cast<size_t>(r * size + i)];
      m = std::max(m, static_cast<double>(x[static_cast<size_t>(r * size + i)]));
    }
    avg.push_back(s / static_cast<double>(size));
    mx.push_back(m);
  }
  Ints out{xs[0], xs[1]};
  out.insert(out.end(), xs.size() - 2, 1);
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
    std::vector<Operand> inputs = {operand(xs, x)};
    std::vector<Operand> outputs = {output(DType::kF32, out)};
    const PreparedKernel kernel(op, inputs, outputs);
    kernel.run(inputs, outputs);
    EXPECT_TRUE(near(outputs[0].values<float>(), std::string(op) == "GlobalMaxPool" ? mx : avg))
        << op << " " << TensorInfo{DType::kF32, xs}.shapeString();
  }
}

TEST(GlobalPoolKernel, Shapes) {
  checkGlobal({1, 1, 1, 1}, 1);
  checkGlobal({2, 3, 7}, 2);
  checkGlobal({2, 5, 7, 9}, 3);
  checkGlobal({1, 64, 14, 14}, 4);
  checkGlobal({1, 3, 4, 5, 6}, 5);
}

// kiln.NhwcGlobal*Pool: [N, H, W, C] in, [N, 1, 1, C] out; channel counts
// that fill whole blocks (of 16 or 64: enough images take the wider), end in
// a partial one, or are below one, sizes split across threads, and a NaN
// that the maximum keeps.
TEST(GlobalPoolKernel, ChannelsLastMatchesReference) {
  uint32_t seed = 20;
  for (const Ints& xs : {Ints{2, 5, 7, 150}, Ints{3, 40, 30, 64}, Ints{1, 3, 3, 5}, Ints{8, 4, 4, 200}, Ints{6, 3, 2, 104}}) {
    std::vector<float> x = randomValues<float>(elementCount(xs), seed++, -2, 2);
    const int64_t channels = xs[3];
    const int64_t size = xs[1] * xs[2];
    if (xs[0] > 1) x[static_cast<size_t>(size * channels + 3 * channels + channels - 1)] = NAN;  // image 1
    std::vector<double> avg, mx;
    for (int64_t n = 0; n < xs[0]; ++n) {
      for (int64_t c = 0; c < channels; ++c) {
        double s = 0, m = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < size; ++i) {
          const double v = x[static_cast<size_t>((n * size + i) * channels + c)];
          s += v;
          m = std::isnan(v) || std::isnan(m) ? NAN : std::max(m, v);
        }
        avg.push_back(s / static_cast<double>(size));
        mx.push_back(m);
      }
    }
    for (const char* op : {"kiln.NhwcGlobalAveragePool", "kiln.NhwcGlobalMaxPool"}) {
      std::vector<Operand> inputs = {operand(xs, x)};
      std::vector<Operand> outputs = {output(DType::kF32, {xs[0], 1, 1, channels})};
      const PreparedKernel kernel(op, inputs, outputs);
      kernel.run(inputs, outputs);
      const std::vector<float> got = outputs[0].values<float>();
      const std::vector<double>& want = std::string(op) == "kiln.NhwcGlobalMaxPool" ? mx : avg;
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(want[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << op << " element " << i;
        } else {
          EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << op << " element " << i;
        }
      }
    }
  }
}

// No channels: nothing to write (the by-rows path once divided by the
// row's 0 bytes; graph_run_fuzz, under UBSan).
TEST(GlobalPoolKernel, ChannelsLastWithoutChannelsWritesNothing) {
  for (const char* op : {"kiln.NhwcGlobalAveragePool", "kiln.NhwcGlobalMaxPool"}) {
    std::vector<Operand> inputs = {operand<float>({3, 300, 300, 0}, {})};
    std::vector<Operand> outputs = {output(DType::kF32, {3, 1, 1, 0})};
    PreparedKernel(op, inputs, outputs).run(inputs, outputs);
    EXPECT_TRUE(outputs[0].values<float>().empty()) << op;
  }
}

TEST(GlobalPoolKernel, MaxPropagatesNaN) {
  std::vector<float> x(40, 1.0f);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  std::vector<Operand> inputs = {operand<float>({1, 1, 40}, x)};
  std::vector<Operand> outputs = {output(DType::kF32, {1, 1, 1})};
  const PreparedKernel kernel("GlobalMaxPool", inputs, outputs);
  kernel.run(inputs, outputs);
  EXPECT_TRUE(std::isnan(outputs[0].values<float>()[0]));
}

}  // namespace
}  // namespace kiln

// Elementwise kernels against double-precision references written here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/float_formats.h"
#include "kernels/kernel.h"
#include "kiln/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

using ::kiln::testing::broadcastIndex;
using ::kiln::testing::broadcastShape;
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

// Relative tolerance for f32 results against the double reference.
constexpr double kF32Tolerance = 1e-6;
constexpr double kF64Tolerance = 1e-12;

// Every element within rtol * |want| + atol (NaN where want is NaN); reports
// the first mismatch and how many there were.
template <typename T>
::testing::AssertionResult allClose(const std::vector<T>& got, const std::vector<double>& want, double rtol,
                                    double atol = 0) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "got " << got.size() << " elements, want " << want.size();
  }
  size_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const bool ok = std::isnan(want[i]) ? std::isnan(g) : std::abs(g - want[i]) <= rtol * std::abs(want[i]) + atol;
    if (!ok && mismatches++ == 0) {
      std::ostringstream text;
      text << std::setprecision(17) << "element " << i << ": got " << g << ", want " << want[i];
      first = text.str();
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << got.size() << " elements differ; first: " << first;
}

template <typename T>
std::vector<double> asDoubles(const std::vector<T>& values) {
  return std::vector<double>(values.begin(), values.end());
}

// A bool operand (std::vector<bool> has no data()): one byte 0 or 1 each.
Operand boolOperand(std::vector<int64_t> shape, const std::vector<int>& values) {
  Operand op = output(DType::kBool, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) op.bytes[i] = static_cast<std::byte>(values[i] != 0);
  return op;
}

const std::vector<std::vector<int64_t>> kUnaryShapes = {{}, {1}, {5}, {3, 17}, {2, 3, 33}};

// ----------------------------------------------------------------- registry

TEST(ElementwiseKernels, AllAreRegistered) {
  const KernelRegistry& registry = KernelRegistry::cpu();
  for (const char* op :
       {"Relu",  "Sigmoid", "Tanh",      "Exp", "Log",         "Sqrt",      "Erf",      "Abs",   "Neg",  "Reciprocal",
        "Floor", "Ceil",    "LeakyRelu", "Elu", "HardSigmoid", "HardSwish", "Softplus", "Gelu",  "Clip", "Identity",
        "Add",   "Sub",     "Mul",       "Div", "Pow",         "Max",       "Min",      "Equal", "Less", "Greater",
        "Sign", "Round", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
        "Softsign", "Celu", "Selu", "ThresholdedRelu", "Shrink", "Mish", "Swish", "Not", "BitwiseNot", "IsNaN",
        "IsInf", "Sum", "Mean", "PRelu", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "BitwiseAnd",
        "BitwiseOr", "BitwiseXor", "Mod", "BitShift"}) {
    EXPECT_NE(registry.find(op), nullptr) << op;
  }
}

// -------------------------------------------------------------------- unary

struct UnaryCase {
  std::string op;
  ParamMap params;
  std::function<double(double)> reference;
  double lo;
  double hi;
  double atol = 0;  // where the f32 formula rounds an intermediate that cancels
};

std::vector<UnaryCase> unaryCases() {
  const double sqrt_half = std::sqrt(0.5);
  const double sqrt_2_pi = std::sqrt(2.0 / M_PI);
  return {
      {"Relu", {}, [](double x) { return x > 0 ? x : 0; }, -5, 5},
      {"Sigmoid", {}, [](double x) { return 1 / (1 + std::exp(-x)); }, -20, 20},
      {"Tanh", {}, [](double x) { return std::tanh(x); }, -5, 5},
      {"Exp", {}, [](double x) { return std::exp(x); }, -20, 20},
      {"Log", {}, [](double x) { return std::log(x); }, 1e-3, 1e3},
      {"Sqrt", {}, [](double x) { return std::sqrt(x); }, 0, 100},
      {"Erf", {}, [](double x) { return std::erf(x); }, -3, 3},
      {"Abs", {}, [](double x) { return std::abs(x); }, -5, 5},
      {"Neg", {}, [](double x) { return -x; }, -5, 5},
      {"Reciprocal", {}, [](double x) { return 1 / x; }, -10, 10},
      {"Floor", {}, [](double x) { return std::floor(x); }, -10, 10},
      {"Ceil", {}, [](double x) { return std::ceil(x); }, -10, 10},
      {"LeakyRelu", {}, [](double x) { return x < 0 ? 0.01 * x : x; }, -5, 5},
      {"LeakyRelu", params({{"alpha", 0.3}}), [](double x) { return x < 0 ? 0.3 * x : x; }, -5, 5},
      {"Elu", {}, [](double x) { return x < 0 ? std::exp(x) - 1 : x; }, -5, 5},
      {"Elu", params({{"alpha", 2.5}}), [](double x) { return x < 0 ? 2.5 * (std::exp(x) - 1) : x; }, -5, 5},
      {"HardSigmoid", {}, [](double x) { return std::clamp(0.2 * x + 0.5, 0.0, 1.0); }, -4, 4, 1e-7},
      {"HardSigmoid", params({{"alpha", 0.5}, {"beta", 0.25}}),
       [](double x) { return std::clamp(0.5 * x + 0.25, 0.0, 1.0); }, -4, 4, 1e-7},
      {"HardSwish", {}, [](double x) { return x * std::clamp(x / 6 + 0.5, 0.0, 1.0); }, -5, 5, 5e-7},
      {"Softplus", {}, [](double x) { return std::log1p(std::exp(x)); }, -20, 20},
      // 0.5 x (1 + erf(x / sqrt 2)) and 0.5 x (1 + tanh(u)), written without
      // their cancellation for negative x (which costs even double 1e-9).
      {"Gelu", {}, [=](double x) { return 0.5 * x * std::erfc(-x * sqrt_half); }, -6, 6},
      {"Gelu", params({{"approximate", std::string("none")}}),
       [=](double x) { return 0.5 * x * std::erfc(-x * sqrt_half); }, -6, 6},
      {"Gelu", params({{"approximate", std::string("tanh")}}),
       [=](double x) { return x / (1 + std::exp(-2 * sqrt_2_pi * (x + 0.044715 * x * x * x))); }, -6, 6},
      {"Sign", {}, [](double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }, -5, 5},
      {"Round", {}, [](double x) { return std::nearbyint(x); }, -10, 10},
      {"Sin", {}, [](double x) { return std::sin(x); }, -6, 6, 1e-7},
      {"Cos", {}, [](double x) { return std::cos(x); }, -6, 6, 1e-7},
      {"Tan", {}, [](double x) { return std::tan(x); }, -1.5, 1.5},
      {"Asin", {}, [](double x) { return std::asin(x); }, -1, 1},
      {"Acos", {}, [](double x) { return std::acos(x); }, -1, 1},
      {"Atan", {}, [](double x) { return std::atan(x); }, -10, 10},
      {"Sinh", {}, [](double x) { return std::sinh(x); }, -5, 5},
      {"Cosh", {}, [](double x) { return std::cosh(x); }, -5, 5},
      {"Asinh", {}, [](double x) { return std::asinh(x); }, -10, 10},
      {"Acosh", {}, [](double x) { return std::acosh(x); }, 1, 10},
      {"Atanh", {}, [](double x) { return std::atanh(x); }, -0.99, 0.99},
      {"Softsign", {}, [](double x) { return x / (1 + std::abs(x)); }, -10, 10},
      {"Celu", {}, [](double x) { return std::max(0.0, x) + std::min(0.0, std::exp(x) - 1); }, -5, 5},
      {"Celu", params({{"alpha", 2.0}}),
       [](double x) { return std::max(0.0, x) + std::min(0.0, 2 * (std::exp(x / 2) - 1)); }, -5, 5},
      {"Selu",
       {},
       [](double x) { return 1.05070102214813232421875 * (x > 0 ? x : 1.67326319217681884765625 * (std::exp(x) - 1)); },
       -5,
       5},
      {"Selu", params({{"alpha", 2.0}, {"gamma", 3.0}}),
       [](double x) { return 3 * (x > 0 ? x : 2 * (std::exp(x) - 1)); }, -5, 5},
      {"ThresholdedRelu", {}, [](double x) { return x > 1 ? x : 0; }, -5, 5},
      {"ThresholdedRelu", params({{"alpha", 2.5}}), [](double x) { return x > 2.5 ? x : 0; }, -5, 5},
      {"Shrink", {}, [](double x) { return x < -0.5 ? x : (x > 0.5 ? x : 0); }, -5, 5},
      {"Shrink", params({{"lambd", 1.5}, {"bias", 0.25}}),
       [](double x) { return x < -1.5 ? x + 0.25 : (x > 1.5 ? x - 0.25 : 0); }, -5, 5},
      {"Mish", {}, [](double x) { return x * std::tanh(std::log1p(std::exp(x))); }, -10, 10},
      {"Swish", {}, [](double x) { return x / (1 + std::exp(-x)); }, -10, 10},
      {"Swish", params({{"alpha", 0.5}}), [](double x) { return x / (1 + std::exp(-0.5 * x)); }, -10, 10},
  };
}

template <typename T>
void checkUnary(const UnaryCase& c, double rtol, double atol) {
  uint32_t seed = 1;
  for (const std::vector<int64_t>& shape : kUnaryShapes) {
    const std::vector<T> x = randomValues<T>(elementCount(shape), seed++, c.lo, c.hi);
    std::vector<Operand> inputs = {operand(shape, x)};
    std::vector<Operand> outputs = {output(dtypeOf<T>(), shape)};
    PreparedKernel kernel(c.op, inputs, outputs, c.params);
    kernel.run(inputs, outputs);
    std::vector<double> want;
    for (T v : x) want.push_back(c.reference(static_cast<double>(v)));
    EXPECT_TRUE(allClose(outputs[0].values<T>(), want, rtol, atol))
        << c.op << " " << dtypeName(dtypeOf<T>()) << " shape " << TensorInfo{DType::kF32, shape}.shapeString();
  }
}

TEST(UnaryKernels, F32MatchesDoubleReference) {
  for (const UnaryCase& c : unaryCases()) checkUnary<float>(c, kF32Tolerance, c.atol);
}

TEST(UnaryKernels, F64MatchesDoubleReference) {
  for (const UnaryCase& c : unaryCases()) checkUnary<double>(c, kF64Tolerance, c.atol == 0 ? 0 : 1e-15);
}

TEST(UnaryKernels, AbsAndNegOfIntegersWrapLikeNumpy) {
  const int32_t min32 = std::numeric_limits<int32_t>::min();
  const int64_t min64 = std::numeric_limits<int64_t>::min();
  const std::vector<int32_t> x32 = {-3, 0, 7, min32, std::numeric_limits<int32_t>::max()};
  const std::vector<int64_t> x64 = {-3, 0, 7, min64, std::numeric_limits<int64_t>::max()};
  auto run = [](const char* op, auto x) {
    using T = typename decltype(x)::value_type;
    std::vector<Operand> inputs = {operand<T>({static_cast<int64_t>(x.size())}, x)};
    std::vector<Operand> outputs = {output(dtypeOf<T>(), {static_cast<int64_t>(x.size())})};
    PreparedKernel(op, inputs, outputs).run(inputs, outputs);
    return outputs[0].values<T>();
  };
  EXPECT_EQ(run("Abs", x32), (std::vector<int32_t>{3, 0, 7, min32, std::numeric_limits<int32_t>::max()}));
  EXPECT_EQ(run("Neg", x32), (std::vector<int32_t>{3, 0, -7, min32, -std::numeric_limits<int32_t>::max()}));
  EXPECT_EQ(run("Abs", x64), (std::vector<int64_t>{3, 0, 7, min64, std::numeric_limits<int64_t>::max()}));
  EXPECT_EQ(run("Neg", x64), (std::vector<int64_t>{3, 0, -7, min64, -std::numeric_limits<int64_t>::max()}));
}

TEST(UnaryKernels, NanPropagates) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const char* op : {"Relu", "LeakyRelu", "HardSigmoid", "HardSwish", "Sigmoid", "Softplus", "Gelu", "Elu"}) {
    std::vector<Operand> inputs = {operand<float>({2}, {nan, 1.0f})};
    std::vector<Operand> outputs = {output(DType::kF32, {2})};
    PreparedKernel(op, inputs, outputs).run(inputs, outputs);
    EXPECT_TRUE(std::isnan(outputs[0].values<float>()[0])) << op;
  }
}

TEST(UnaryKernels, ExtremeInputsStayFinite) {
  // The stable forms: no overflow to inf / inf, no 1 + tiny rounding to 1.
  std::vector<Operand> inputs = {operand<float>({4}, {-100.0f, 100.0f, -30.0f, 30.0f})};
  std::vector<Operand> outputs = {output(DType::kF32, {4})};
  PreparedKernel("Sigmoid", inputs, outputs).run(inputs, outputs);
  std::vector<float> y = outputs[0].values<float>();
  EXPECT_FLOAT_EQ(y[1], 1.0f);
  EXPECT_GE(y[0], 0.0f);
  EXPECT_NEAR(y[2], std::exp(-30.0), 1e-6 * std::exp(-30.0));
  PreparedKernel("Softplus", inputs, outputs).run(inputs, outputs);
  y = outputs[0].values<float>();
  EXPECT_FLOAT_EQ(y[1], 100.0f);
  EXPECT_NEAR(y[2], std::exp(-30.0), 1e-6 * std::exp(-30.0));
  EXPECT_FLOAT_EQ(y[3], 30.0f);
}

TEST(UnaryKernels, GeluRefusesAnUnknownApproximation) {
  std::vector<Operand> inputs = {operand<float>({1}, {1.0f})};
  std::vector<Operand> outputs = {output(DType::kF32, {1})};
  EXPECT_EQ(prepareError("Gelu", inputs, outputs, params({{"approximate", std::string("fast")}})),
            "Gelu: approximate is 'fast', expected 'none' or 'tanh'");
}

TEST(UnaryKernels, PrepareErrors) {
  std::vector<Operand> ints = {operand<uint32_t>({3}, {1, 2, 3})};
  EXPECT_EQ(prepareError("Relu", ints, {output(DType::kU32, {3})}),
            "Relu: no kernel for u32 inputs (supports f32, f64, f16, bf16, i8, i16, i32, i64)");
  EXPECT_EQ(prepareError("Exp", {operand<uint8_t>({1}, {1})}, {output(DType::kU8, {1})}),
            "Exp: no kernel for u8 inputs (supports f32, f64, f16, bf16)");
  EXPECT_EQ(prepareError("Abs", {boolOperand({1}, {1})}, {output(DType::kBool, {1})}),
            "Abs: no kernel for bool inputs (supports f32, f64, f16, bf16, i8, i16, i32, i64, u8, u16, u32, u64)");
  EXPECT_EQ(prepareError("Not", {operand<float>({1}, {1})}, {output(DType::kF32, {1})}),
            "Not: no kernel for f32 inputs (supports bool)");
  EXPECT_EQ(prepareError("IsNaN", {operand<float>({1}, {1})}, {output(DType::kF32, {1})}),
            "IsNaN: output is f32[1] but the inputs give bool[1]");
  std::vector<Operand> x = {operand<float>({3}, {1, 2, 3})};
  EXPECT_EQ(prepareError("Relu", x, {output(DType::kF32, {4})}), "Relu: output is f32[4] but the inputs give f32[3]");
  EXPECT_EQ(prepareError("Relu", x, {output(DType::kF64, {3})}), "Relu: output is f64[3] but the inputs give f32[3]");
  EXPECT_EQ(prepareError("Relu", {x[0], x[0]}, {output(DType::kF32, {3})}), "Relu: expects 1 inputs, got 2");
  EXPECT_EQ(prepareError("LeakyRelu", x, {output(DType::kF32, {3})}, params({{"alpha", int64_t{1}}})),
            "parameter 'alpha' is not a float");
}

// --------------------------------------------------------------------- Clip

std::vector<float> runClip(std::vector<Operand> inputs, const ParamMap& p = {}) {
  std::vector<Operand> outputs = {output(DType::kF32, inputs[0].info.shape)};
  PreparedKernel(std::string("Clip"), inputs, outputs, p).run(inputs, outputs);
  return outputs[0].values<float>();
}

TEST(ClipKernel, BoundsFromConstantsInputsAttributesOrNone) {
  const std::vector<float> x = randomValues<float>(37, 7, -3, 3);
  auto want = [&](double lo, double hi) {
    std::vector<double> out;
    for (float v : x) out.push_back(std::min(std::max(static_cast<double>(v), lo), hi));
    return out;
  };
  const double inf = std::numeric_limits<double>::infinity();
  for (bool constant : {true, false}) {
    SCOPED_TRACE(constant ? "constant bounds" : "bounds read at run");
    EXPECT_TRUE(allClose(
        runClip({operand<float>({37}, x), operand<float>({}, {-1.0f}, constant), operand<float>({}, {0.5f}, constant)}),
        want(-1, 0.5), 0));
    EXPECT_TRUE(allClose(runClip({operand<float>({37}, x), operand<float>({1}, {-1.0f}, constant)}), want(-1, inf), 0));
    EXPECT_TRUE(allClose(runClip({operand<float>({37}, x), omitted(), operand<float>({}, {2.0f}, constant)}),
                         want(-inf, 2), 0));
    // min above max: every value becomes max.
    EXPECT_TRUE(allClose(
        runClip({operand<float>({37}, x), operand<float>({}, {2.0f}, constant), operand<float>({}, {1.0f}, constant)}),
        want(2, 1), 0));
  }
  EXPECT_TRUE(allClose(runClip({operand<float>({37}, x)}), want(-inf, inf), 0));
  // Opset 6: attributes.
  EXPECT_TRUE(
      allClose(runClip({operand<float>({37}, x)}, params({{"min", -0.5}, {"max", 0.25}})), want(-0.5, 0.25), 0));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(runClip({operand<float>({1}, {nan}), operand<float>({}, {0.0f}, true)})[0]));
}

TEST(ClipKernel, IntegersAndDoubles) {
  std::vector<Operand> inputs = {operand<int64_t>({5}, {-9, -1, 0, 4, 9}), operand<int64_t>({}, {-2}),
                                 operand<int64_t>({}, {5}, true)};
  std::vector<Operand> outputs = {output(DType::kI64, {5})};
  PreparedKernel("Clip", inputs, outputs).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<int64_t>(), (std::vector<int64_t>{-2, -1, 0, 4, 5}));

  inputs = {operand<int32_t>({3}, {-9, 0, 9}), operand<int32_t>({}, {-2}, true)};
  outputs = {output(DType::kI32, {3})};
  PreparedKernel("Clip", inputs, outputs).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<int32_t>(), (std::vector<int32_t>{-2, 0, 9}));

  inputs = {operand<double>({3}, {-9, 0.5, 9}), omitted(), operand<double>({}, {1.5})};
  outputs = {output(DType::kF64, {3})};
  PreparedKernel("Clip", inputs, outputs).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<double>(), (std::vector<double>{-9, 0.5, 1.5}));
}

TEST(ClipKernel, PrepareErrors) {
  const Operand x = operand<float>({3}, {1, 2, 3});
  EXPECT_EQ(prepareError("Clip", {x, operand<float>({2}, {0, 1})}, {output(DType::kF32, {3})}),
            "Clip: min must be a scalar, got f32[2]");
  EXPECT_EQ(prepareError("Clip", {x, omitted(), operand<double>({}, {1})}, {output(DType::kF32, {3})}),
            "Clip: max is f64 but the input is f32: they must match");
  EXPECT_EQ(prepareError("Clip", {boolOperand({1}, {1})}, {output(DType::kBool, {1})}),
            "Clip: no kernel for bool inputs (supports f32, f64, f16, bf16, i8, i16, i32, i64, u8, u16, u32, u64)");
  EXPECT_EQ(prepareError("Clip", {x, x, x, x}, {output(DType::kF32, {3})}), "Clip: expects 1 to 3 inputs, got 4");
}

// ----------------------------------------------------------------- Identity

TEST(IdentityKernel, CopiesAnyDType) {
  for (DType dtype : {DType::kF32, DType::kI64, DType::kBool, DType::kF16, DType::kU8, DType::kF64}) {
    Operand x = output(dtype, {3, 5});
    for (size_t i = 0; i < x.bytes.size(); ++i) x.bytes[i] = static_cast<std::byte>(i * 7 + 1);
    std::vector<Operand> inputs = {x};
    std::vector<Operand> outputs = {output(dtype, {3, 5})};
    PreparedKernel("Identity", inputs, outputs).run(inputs, outputs);
    EXPECT_EQ(outputs[0].bytes, x.bytes) << dtypeName(dtype);
  }
  EXPECT_EQ(prepareError("Identity", {operand<float>({2}, {1, 2})}, {output(DType::kF32, {3})}),
            "Identity: output is f32[3] but the inputs give f32[2]");
}

// ------------------------------------------------------------------- binary

// The broadcasting patterns of the kernel's fast paths and then some: same
// shape, scalars on either side, a bias over the last dimension, per-channel
// NCHW, outer products, rank differences, and empty tensors.
const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> kBroadcastPatterns = {
    {{2, 3, 5}, {2, 3, 5}},
    {{70}, {70}},
    {{2, 3, 37}, {}},
    {{}, {4, 33}},
    {{1}, {3, 20}},
    {{2, 3, 37}, {37}},
    {{2, 4, 3, 5}, {4, 1, 1}},
    {{2, 4, 3, 5}, {1, 4, 1, 1}},
    {{3, 1}, {1, 20}},
    {{2, 1, 17}, {3, 1}},
    {{17}, {2, 3, 17}},
    {{5, 1, 1, 7}, {5, 6, 1, 7}},
    {{2, 3, 1, 4}, {1, 3, 5, 1}},
    {{}, {}},
    {{0, 3}, {3}},
    {{4, 0}, {1}},
    // Short rows repeated over the next dimension (a per-channel scale of a
    // channels-last tensor): several rows per call through a tile, split
    // across threads, with tile and dimension boundaries inside a range.
    {{3, 40, 50, 8}, {3, 1, 1, 8}},
    {{2, 1, 100}, {2, 45, 100}},
};

struct BinaryCase {
  std::string op;
  std::function<double(double, double)> reference;
  bool floats_only = false;
  bool comparison = false;
};

std::vector<BinaryCase> binaryCases() {
  return {
      {"Add", [](double a, double b) { return a + b; }},
      {"Sub", [](double a, double b) { return a - b; }},
      {"Mul", [](double a, double b) { return a * b; }},
      {"Div", [](double a, double b) { return a / b; }},
      {"Pow", [](double a, double b) { return std::pow(a, b); }, true},
      {"Max", [](double a, double b) { return std::max(a, b); }},
      {"Min", [](double a, double b) { return std::min(a, b); }},
      {"Equal", [](double a, double b) { return a == b ? 1.0 : 0.0; }, false, true},
      {"Less", [](double a, double b) { return a < b ? 1.0 : 0.0; }, false, true},
      {"Greater", [](double a, double b) { return a > b ? 1.0 : 0.0; }, false, true},
      {"LessOrEqual", [](double a, double b) { return a <= b ? 1.0 : 0.0; }, false, true},
      {"GreaterOrEqual", [](double a, double b) { return a >= b ? 1.0 : 0.0; }, false, true},
      {"Sum", [](double a, double b) { return a + b; }},
      {"Mean", [](double a, double b) { return (a + b) / 2; }, true},
      {"PRelu", [](double a, double b) { return a < 0 ? a * b : a; }},
  };
}

// Inputs that suit the op: positive bases for Pow, no zero divisors, and
// small integers for comparisons so that equal pairs occur.
template <typename T>
std::vector<T> binaryInput(const BinaryCase& c, size_t count, uint32_t seed, bool second) {
  if (c.comparison) return randomValues<T>(count, seed, std::is_unsigned_v<T> ? 0 : -2, std::is_unsigned_v<T> ? 4 : 2);
  // The narrow and unsigned integers: small values whose products fit (and
  // whose differences wrap).
  if constexpr (std::is_integral_v<T> && (std::is_unsigned_v<T> || sizeof(T) == 1)) {
    std::vector<T> values = randomValues<T>(count, seed, 0, 11);
    if (c.op == "Div" && second) {
      for (T& v : values) v = v == 0 ? T(3) : v;
    }
    return values;
  }
  if (c.op == "Pow") return second ? randomValues<T>(count, seed, -3, 3) : randomValues<T>(count, seed, 0.1, 4);
  std::vector<T> values = randomValues<T>(count, seed, -50, 50);
  if (c.op == "Div" && second) {
    for (T& v : values) {
      if (std::is_integral_v<T> ? v == 0 : std::abs(static_cast<double>(v)) < 0.5) v = T(3);
    }
  }
  return values;
}

template <typename T>
void checkBinary(const BinaryCase& c, double rtol) {
  uint32_t seed = 100;
  for (const auto& [a_shape, b_shape] : kBroadcastPatterns) {
    const std::vector<int64_t> out_shape = broadcastShape(a_shape, b_shape);
    const std::vector<T> a = binaryInput<T>(c, elementCount(a_shape), seed++, false);
    const std::vector<T> b = binaryInput<T>(c, elementCount(b_shape), seed++, true);
    std::vector<Operand> inputs = {operand(a_shape, a), operand(b_shape, b)};
    std::vector<Operand> outputs = {output(c.comparison ? DType::kBool : dtypeOf<T>(), out_shape)};
    PreparedKernel kernel(c.op, inputs, outputs);
    kernel.run(inputs, outputs);
    std::vector<double> want(elementCount(out_shape));
    for (size_t i = 0; i < want.size(); ++i) {
      const double av = static_cast<double>(a[broadcastIndex(out_shape, a_shape, i)]);
      const double bv = static_cast<double>(b[broadcastIndex(out_shape, b_shape, i)]);
      want[i] = c.reference(av, bv);
      if (std::is_integral_v<T> && c.op == "Div") want[i] = std::trunc(want[i]);
      // Integer results wrap around.
      if (std::is_integral_v<T> && !c.comparison) {
        want[i] = static_cast<double>(static_cast<T>(static_cast<int64_t>(want[i])));
      }
    }
    const std::string where = c.op + " " + std::string(dtypeName(dtypeOf<T>())) + " " +
                              TensorInfo{DType::kF32, a_shape}.shapeString() + " with " +
                              TensorInfo{DType::kF32, b_shape}.shapeString();
    if (c.comparison) {
      EXPECT_TRUE(allClose(outputs[0].values<uint8_t>(), want, 0)) << where;
    } else {
      EXPECT_TRUE(allClose(outputs[0].values<T>(), want, rtol)) << where;
    }
  }
}

TEST(BinaryKernels, F32MatchesDoubleReferenceForEveryBroadcastPattern) {
  for (const BinaryCase& c : binaryCases()) checkBinary<float>(c, kF32Tolerance);
}

TEST(BinaryKernels, F64MatchesDoubleReferenceForEveryBroadcastPattern) {
  for (const BinaryCase& c : binaryCases()) checkBinary<double>(c, kF64Tolerance);
}

TEST(BinaryKernels, IntegersAreExactForEveryBroadcastPattern) {
  for (const BinaryCase& c : binaryCases()) {
    if (c.floats_only) continue;
    checkBinary<int8_t>(c, 0);
    checkBinary<int16_t>(c, 0);
    checkBinary<int32_t>(c, 0);
    checkBinary<int64_t>(c, 0);
    checkBinary<uint8_t>(c, 0);
    checkBinary<uint16_t>(c, 0);
    checkBinary<uint32_t>(c, 0);
    checkBinary<uint64_t>(c, 0);
  }
}

template <typename T>
std::vector<T> runBinary(const char* op, const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<Operand> inputs = {operand<T>({static_cast<int64_t>(a.size())}, a),
                                 operand<T>({static_cast<int64_t>(b.size())}, b)};
  std::vector<Operand> outputs = {output(dtypeOf<T>(), {static_cast<int64_t>(a.size())})};
  PreparedKernel(op, inputs, outputs).run(inputs, outputs);
  return outputs[0].values<T>();
}

TEST(BinaryKernels, IntegerEdgeCasesNeitherTrapNorOverflow) {
  const int32_t min32 = std::numeric_limits<int32_t>::min();
  const int32_t max32 = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(runBinary<int32_t>("Div", {7, -7, 7, 5, min32}, {2, 2, 0, -1, -1}),
            (std::vector<int32_t>{3, -3, 0, -5, min32}));
  EXPECT_EQ(runBinary<int32_t>("Add", {max32}, {1}), (std::vector<int32_t>{min32}));
  EXPECT_EQ(runBinary<int32_t>("Sub", {min32}, {1}), (std::vector<int32_t>{max32}));
  EXPECT_EQ(runBinary<int32_t>("Mul", {max32}, {2}), (std::vector<int32_t>{-2}));
  const int64_t min64 = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(runBinary<int64_t>("Div", {-9, min64, 1}, {4, -1, 0}), (std::vector<int64_t>{-2, min64, 0}));
}

TEST(BinaryKernels, MaxAndMinPropagateNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const char* op : {"Max", "Min"}) {
    const std::vector<float> y = runBinary<float>(op, {nan, 1, 2}, {1, nan, 3});
    EXPECT_TRUE(std::isnan(y[0])) << op;
    EXPECT_TRUE(std::isnan(y[1])) << op;
    EXPECT_EQ(y[2], op == std::string("Max") ? 3 : 2);
  }
  std::vector<Operand> inputs = {operand<float>({1}, {nan}), operand<float>({1}, {nan})};
  std::vector<Operand> outputs = {output(DType::kBool, {1})};
  PreparedKernel("Equal", inputs, outputs).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<uint8_t>()[0], 0);
}

TEST(BinaryKernels, PowWithConstantTwoSquares) {
  const std::vector<float> x = randomValues<float>(40, 3, -4, 4);
  for (const auto& exponent_shape : {std::vector<int64_t>{}, std::vector<int64_t>{40}}) {
    std::vector<Operand> inputs = {operand<float>({40}, x),
                                   operand<float>(exponent_shape, std::vector<float>(elementCount(exponent_shape), 2),
                                                  /*constant=*/true)};
    std::vector<Operand> outputs = {output(DType::kF32, {40})};
    PreparedKernel("Pow", inputs, outputs).run(inputs, outputs);
    const std::vector<float> y = outputs[0].values<float>();
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], x[i] * x[i]);  // pow(x, 2) is exactly x * x
  }
  // A constant exponent other than 2 takes the general path.
  std::vector<Operand> inputs = {operand<float>({3}, {2, 3, 0.5f}), operand<float>({}, {3.0f}, true)};
  std::vector<Operand> outputs = {output(DType::kF32, {3})};
  PreparedKernel("Pow", inputs, outputs).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<float>(), (std::vector<float>{8, 27, 0.125f}));
}

TEST(BinaryKernels, PowWithConstantHalfIsPowNotJustSqrt) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = randomValues<float>(37, 4, 0, 9);
  x[0] = -0.0f;  // pow: +0 (sqrt: -0)
  x[1] = -inf;   // pow: +inf (sqrt: NaN)
  x[2] = -4.0f;  // NaN
  x[3] = inf;
  for (DType dtype : {DType::kF32, DType::kF64}) {
    std::vector<Operand> inputs;
    if (dtype == DType::kF32) {
      inputs = {operand<float>({37}, x), operand<float>({}, {0.5f}, /*constant=*/true)};
    } else {
      inputs = {operand<double>({37}, std::vector<double>(x.begin(), x.end())),
                operand<double>({1}, {0.5}, /*constant=*/true)};
    }
    std::vector<Operand> outputs = {output(dtype, {37})};
    PreparedKernel("Pow", inputs, outputs).run(inputs, outputs);
    for (size_t i = 0; i < x.size(); ++i) {
      const double got = dtype == DType::kF32 ? outputs[0].values<float>()[i] : outputs[0].values<double>()[i];
      const double want = dtype == DType::kF32 ? std::pow(x[i], 0.5f) : std::pow(static_cast<double>(x[i]), 0.5);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << i;
      } else {
        EXPECT_EQ(got, want) << dtypeName(dtype) << " element " << i;
        EXPECT_EQ(std::signbit(got), std::signbit(want)) << dtypeName(dtype) << " element " << i;
      }
    }
  }
}

TEST(BinaryKernels, VariadicMaxAndMin) {
  const std::vector<int64_t> s0 = {2, 1, 5}, s1 = {3, 1}, s2 = {5};
  const std::vector<int64_t> out_shape = {2, 3, 5};
  const std::vector<float> a = randomValues<float>(10, 1, -5, 5);
  const std::vector<float> b = randomValues<float>(3, 2, -5, 5);
  const std::vector<float> c = randomValues<float>(5, 3, -5, 5);
  for (const char* op : {"Max", "Min"}) {
    std::vector<Operand> inputs = {operand(s0, a), operand(s1, b), operand(s2, c)};
    std::vector<Operand> outputs = {output(DType::kF32, out_shape)};
    PreparedKernel(op, inputs, outputs).run(inputs, outputs);
    std::vector<double> want(30);
    for (size_t i = 0; i < want.size(); ++i) {
      const double x = a[broadcastIndex(out_shape, s0, i)];
      const double y = b[broadcastIndex(out_shape, s1, i)];
      const double z = c[broadcastIndex(out_shape, s2, i)];
      want[i] = op == std::string("Max") ? std::max({x, y, z}) : std::min({x, y, z});
    }
    EXPECT_TRUE(allClose(outputs[0].values<float>(), want, 0)) << op;
  }
  std::vector<Operand> inputs = {operand<int32_t>({3}, {4, -1, 2})};
  std::vector<Operand> outputs = {output(DType::kI32, {3})};
  PreparedKernel("Max", inputs, outputs).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<int32_t>(), (std::vector<int32_t>{4, -1, 2}));
}

TEST(BinaryKernels, RunInPlaceOverTheFirstInput) {
  const std::vector<float> a = randomValues<float>(6 * 37, 11, -5, 5);
  const std::vector<float> b = randomValues<float>(37, 12, -5, 5);
  std::vector<Operand> inputs = {operand<float>({6, 37}, a), operand<float>({37}, b)};
  std::vector<Operand> outputs = {output(DType::kF32, {6, 37})};
  PreparedKernel kernel("Sub", inputs, outputs);
  auto bound = kernel.bind(inputs, outputs);
  bound->outputs[0].data = bound->inputs[0].data;
  kernel.run(bound->call);
  std::vector<double> want(a.size());
  for (size_t i = 0; i < a.size(); ++i) want[i] = static_cast<double>(a[i]) - b[i % 37];
  EXPECT_TRUE(allClose(inputs[0].values<float>(), want, kF32Tolerance));
}

TEST(BinaryKernels, PrepareErrors) {
  const Operand f23 = operand<float>({2, 3}, std::vector<float>(6, 1));
  const Operand f4 = operand<float>({4}, std::vector<float>(4, 1));
  EXPECT_EQ(prepareError("Add", {f23, f4}, {output(DType::kF32, {2, 4})}),
            "Add: input shapes [2, 3] and [4] do not broadcast: output dimension 1 would be both 3 and 4");
  EXPECT_EQ(prepareError("Add", {f23, operand<int64_t>({3}, {1, 2, 3})}, {output(DType::kF32, {2, 3})}),
            "Add: input 1 is i64 but input 0 is f32: they must match");
  EXPECT_EQ(prepareError("Add", {boolOperand({1}, {1}), boolOperand({1}, {1})}, {output(DType::kBool, {1})}),
            "Add: no kernel for bool inputs (supports f32, f64, f16, bf16, i8, i16, i32, i64, u8, u16, u32, u64)");
  EXPECT_EQ(prepareError("Pow", {operand<uint8_t>({1}, {1}), operand<int32_t>({1}, {1})}, {output(DType::kU8, {1})}),
            "Pow: no kernel for u8 inputs (supports f32, f64, f16, bf16, i8, i16, i32, i64)");
  EXPECT_EQ(prepareError("Pow", {operand<float>({1}, {1}), boolOperand({1}, {1})}, {output(DType::kF32, {1})}),
            "Pow (exponent): no kernel for bool inputs (supports f32, f64, f16, bf16, i8, i16, i32, i64, u8, u16, u32, "
            "u64)");
  EXPECT_EQ(prepareError("And", {operand<int32_t>({1}, {1}), operand<int32_t>({1}, {1})}, {output(DType::kBool, {1})}),
            "And: no kernel for i32 inputs (supports bool)");
  EXPECT_EQ(prepareError("BitwiseAnd", {f23, f23}, {output(DType::kF32, {2, 3})}),
            "BitwiseAnd: no kernel for f32 inputs (supports i8, i16, i32, i64, u8, u16, u32, u64)");
  EXPECT_EQ(prepareError("Mod", {f23, f23}, {output(DType::kF32, {2, 3})}, params({{"fmod", int64_t{2}}})),
            "Mod: fmod is 2, expected 0 or 1");
  EXPECT_EQ(prepareError("BitShift", {operand<uint8_t>({1}, {1}), operand<uint8_t>({1}, {1})},
                         {output(DType::kU8, {1})}, params({{"direction", std::string("UP")}})),
            "BitShift: direction is 'UP', expected 'LEFT' or 'RIGHT'");
  EXPECT_EQ(prepareError("Mean", {operand<int32_t>({1}, {1})}, {output(DType::kI32, {1})}),
            "Mean: no kernel for i32 inputs (supports f32, f64, f16, bf16)");
  EXPECT_EQ(prepareError("Mul", {f23, f23}, {output(DType::kF32, {2, 4})}),
            "Mul: output is f32[2, 4] but the inputs give f32[2, 3]");
  EXPECT_EQ(prepareError("Less", {f23, f23}, {output(DType::kF32, {2, 3})}),
            "Less: output is f32[2, 3] but the inputs give bool[2, 3]");
  EXPECT_EQ(prepareError("Add", {f23}, {output(DType::kF32, {2, 3})}), "Add: expects 2 inputs, got 1");
  Operand dynamic = f23;
  dynamic.info.shape = {kDynamicDim, 3};
  EXPECT_EQ(prepareError("Add", {dynamic, f23}, {output(DType::kF32, {2, 3})}),
            "Add: needs static shapes, input 0 is f32[?, 3]");
  EXPECT_THAT(prepareError("Max", {f23, f4, f23}, {output(DType::kF32, {2, 3})}), HasSubstr("do not broadcast"));
}

// ------------------------------------------- f16 and bf16, integers, logic

// f16 / bf16 operands from floats (rounded to the type) and back.
Operand halfOperand(DType dtype, std::vector<int64_t> shape, const std::vector<float>& values) {
  Operand op = output(dtype, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = dtype == DType::kF16 ? floatToHalf(values[i]) : floatToBfloat16(values[i]);
    std::memcpy(op.bytes.data() + 2 * i, &bits, 2);
  }
  return op;
}

std::vector<float> halfValues(const Operand& op) {
  std::vector<float> out;
  for (uint16_t bits : op.values<uint16_t>()) {
    out.push_back(op.info.dtype == DType::kF16 ? halfToFloat(bits) : bfloat16ToFloat(bits));
  }
  return out;
}

float roundTo(DType dtype, float value) {
  return dtype == DType::kF16 ? halfToFloat(floatToHalf(value)) : bfloat16ToFloat(floatToBfloat16(value));
}

TEST(HalfKernels, ComputeInF32AndRoundOnStore) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(dtypeName(dtype));
    std::vector<float> a = randomValues<float>(40, 11, -50, 50);
    std::vector<float> b = randomValues<float>(8, 12, 0.5, 9);
    for (float& v : a) v = roundTo(dtype, v);
    for (float& v : b) v = roundTo(dtype, v);
    const std::vector<std::pair<const char*, std::function<float(float, float)>>> ops = {
        {"Add", [](float x, float y) { return x + y; }},
        {"Sub", [](float x, float y) { return x - y; }},
        {"Mul", [](float x, float y) { return x * y; }},
        {"Div", [](float x, float y) { return x / y; }},
        {"Max", [](float x, float y) { return std::max(x, y); }},
        {"Pow", [](float x, float y) { return std::pow(std::abs(x), y / 4); }},
        {"Mean", nullptr}};  // computed below: the sum is rounded before the division
    for (const auto& [op, f] : ops) {
      std::vector<float> base = a;
      std::vector<float> exponent = b;
      if (std::string(op) == "Pow") {
        for (float& v : base) v = std::abs(v);
        for (float& v : exponent) v = roundTo(dtype, v / 4);
      }
      std::vector<Operand> inputs = {halfOperand(dtype, {5, 8}, base), halfOperand(dtype, {8}, exponent)};
      std::vector<Operand> outputs = {output(dtype, {5, 8})};
      PreparedKernel(op, inputs, outputs).run(inputs, outputs);
      const std::vector<float> got = halfValues(outputs[0]);
      for (size_t i = 0; i < got.size(); ++i) {
        float want = 0;
        if (std::string(op) == "Pow") {
          want = roundTo(dtype, std::pow(base[i], exponent[i % 8]));
        } else if (std::string(op) == "Mean") {
          want = roundTo(dtype, roundTo(dtype, base[i] + exponent[i % 8]) / 2);
        } else {
          want = roundTo(dtype, f(base[i], exponent[i % 8]));
        }
        EXPECT_EQ(got[i], want) << op << " element " << i;
      }
    }
    // Unary ops and a comparison.
    std::vector<Operand> inputs = {halfOperand(dtype, {40}, a)};
    std::vector<Operand> outputs = {output(dtype, {40})};
    PreparedKernel("Sin", inputs, outputs).run(inputs, outputs);
    std::vector<float> got = halfValues(outputs[0]);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(got[i], roundTo(dtype, std::sin(a[i])));
    PreparedKernel("Relu", inputs, outputs).run(inputs, outputs);
    got = halfValues(outputs[0]);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(got[i], std::max(a[i], 0.0f));
    inputs.push_back(halfOperand(dtype, {}, {0.0f}));
    outputs = {output(DType::kBool, {40})};
    PreparedKernel("Less", inputs, outputs).run(inputs, outputs);
    const std::vector<uint8_t> less = outputs[0].values<uint8_t>();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(less[i], a[i] < 0 ? 1 : 0);
  }
}

template <typename T>
std::vector<T> runWith(const char* op, std::vector<Operand> inputs, DType out, const ParamMap& p = {}) {
  std::vector<Operand> outputs = {output(out, inputs[0].info.shape)};
  PreparedKernel(op, inputs, outputs, p).run(inputs, outputs);
  return outputs[0].values<T>();
}

template <typename T>
Operand flat(const std::vector<T>& values) {
  return operand<T>({static_cast<int64_t>(values.size())}, values);
}

TEST(ModKernel, IntegersAndFloatsWithAndWithoutFmod) {
  // numpy's mod (the divisor's sign) and fmod (the dividend's sign).
  const std::vector<int32_t> a = {-4, 7, 5, 4, -7, 8, 3, -3};
  const std::vector<int32_t> b = {2, -3, 8, -2, 3, 5, 0, -1};
  EXPECT_EQ(runWith<int32_t>("Mod", {flat(a), flat(b)}, DType::kI32), (std::vector<int32_t>{0, -2, 5, 0, 2, 3, 0, 0}));
  EXPECT_EQ(runWith<int32_t>("Mod", {flat(a), flat(b)}, DType::kI32, params({{"fmod", int64_t{1}}})),
            (std::vector<int32_t>{0, 1, 5, 0, -1, 3, 0, 0}));
  EXPECT_EQ(runWith<int8_t>("Mod", {flat<int8_t>({-128, -7}), flat<int8_t>({-1, 3})}, DType::kI8),
            (std::vector<int8_t>{0, 2}));
  EXPECT_EQ(runWith<uint16_t>("Mod", {flat<uint16_t>({65535, 7}), flat<uint16_t>({10, 0})}, DType::kU16),
            (std::vector<uint16_t>{5, 0}));
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {-4.3f, 7.2f, 5.0f, 4.3f, -7.2f, 1.0f, 1.0f, -0.0f, 0.0f};
  const std::vector<float> y = {2.1f, -3.4f, 8.0f, -2.1f, 3.4f, inf, -inf, 2.0f, -2.0f};
  const std::vector<float> mod = runWith<float>("Mod", {flat(x), flat(y)}, DType::kF32);
  const std::vector<float> fmod =
      runWith<float>("Mod", {flat(x), flat(y)}, DType::kF32, params({{"fmod", int64_t{1}}}));
  for (size_t i = 0; i < x.size(); ++i) {
    const float f = std::fmod(x[i], y[i]);
    EXPECT_EQ(fmod[i], f) << i;
    float m = f;
    if (m != 0 && ((m < 0) != (y[i] < 0))) m += y[i];
    if (m == 0) m = std::copysign(0.0f, y[i]);
    EXPECT_EQ(mod[i], m) << i;
    EXPECT_EQ(std::signbit(mod[i]), std::signbit(m)) << i;
  }
  EXPECT_EQ(mod[6], -inf);  // 1 mod -inf, as numpy
  EXPECT_TRUE(std::isnan(runWith<float>("Mod", {flat<float>({1.0f}), flat<float>({0.0f})}, DType::kF32)[0]));
}

TEST(BitKernels, ShiftsAndBitwiseOpsFollowTheReference) {
  const ParamMap left = params({{"direction", std::string("LEFT")}});
  const ParamMap right = params({{"direction", std::string("RIGHT")}});
  EXPECT_EQ(
      runWith<uint8_t>("BitShift", {flat<uint8_t>({16, 4, 1, 255}), flat<uint8_t>({1, 2, 3, 8})}, DType::kU8, left),
      (std::vector<uint8_t>{32, 16, 8, 0}));
  EXPECT_EQ(
      runWith<uint8_t>("BitShift", {flat<uint8_t>({16, 4, 1, 255}), flat<uint8_t>({1, 2, 3, 9})}, DType::kU8, right),
      (std::vector<uint8_t>{8, 1, 0, 0}));
  // Signed: left wraps; right is arithmetic; negative or too-wide shifts give 0 (or -1).
  EXPECT_EQ(runWith<int8_t>("BitShift", {flat<int8_t>({64, -1, 5, 5}), flat<int8_t>({1, 3, -1, 8})}, DType::kI8, left),
            (std::vector<int8_t>{-128, -8, 0, 0}));
  EXPECT_EQ(runWith<int32_t>("BitShift", {flat<int32_t>({-16, -16, 16, -5}), flat<int32_t>({2, 32, 40, -1})},
                             DType::kI32, right),
            (std::vector<int32_t>{-4, -1, 0, -1}));
  EXPECT_EQ(runWith<uint64_t>("BitShift", {flat<uint64_t>({1}), flat<uint64_t>({63})}, DType::kU64, left),
            (std::vector<uint64_t>{uint64_t{1} << 63}));
  EXPECT_EQ(runWith<int16_t>("BitwiseAnd", {flat<int16_t>({0x0F0F, -1}), flat<int16_t>({0x00FF, 5})}, DType::kI16),
            (std::vector<int16_t>{0x000F, 5}));
  EXPECT_EQ(runWith<uint32_t>("BitwiseOr", {flat<uint32_t>({0xF0, 1}), flat<uint32_t>({0x0F, 2})}, DType::kU32),
            (std::vector<uint32_t>{0xFF, 3}));
  EXPECT_EQ(runWith<uint64_t>("BitwiseXor", {flat<uint64_t>({0xFF, 6}), flat<uint64_t>({0x0F, 3})}, DType::kU64),
            (std::vector<uint64_t>{0xF0, 5}));
  EXPECT_EQ(runWith<int32_t>("BitwiseNot", {flat<int32_t>({0, -1, 5})}, DType::kI32),
            (std::vector<int32_t>{-1, 0, -6}));
  EXPECT_EQ(runWith<uint8_t>("BitwiseNot", {flat<uint8_t>({0, 0xF0})}, DType::kU8), (std::vector<uint8_t>{0xFF, 0x0F}));
}

TEST(LogicKernels, AndOrXorNotBroadcast) {
  std::vector<Operand> inputs = {boolOperand({2, 2}, {1, 0, 1, 0}), boolOperand({2, 1}, {1, 0})};
  auto run = [&](const char* op) {
    std::vector<Operand> outputs = {output(DType::kBool, {2, 2})};
    PreparedKernel(op, inputs, outputs).run(inputs, outputs);
    return outputs[0].values<uint8_t>();
  };
  EXPECT_EQ(run("And"), (std::vector<uint8_t>{1, 0, 0, 0}));
  EXPECT_EQ(run("Or"), (std::vector<uint8_t>{1, 1, 1, 0}));
  EXPECT_EQ(run("Xor"), (std::vector<uint8_t>{0, 1, 1, 0}));
  EXPECT_EQ(run("Equal"), (std::vector<uint8_t>{1, 0, 0, 1}));
  EXPECT_EQ(runWith<uint8_t>("Not", {inputs[0]}, DType::kBool), (std::vector<uint8_t>{0, 1, 0, 1}));
}

TEST(PowKernel, MixedTypesFollowNumpyPowerThenTheBaseType) {
  EXPECT_EQ(runWith<float>("Pow", {flat<float>({2, 3, 4}), flat<int64_t>({3, -1, 0})}, DType::kF32),
            (std::vector<float>{8, 1.0f / 3, 1}));
  EXPECT_EQ(runWith<float>("Pow", {flat<float>({2, 9}), flat<uint32_t>({10, 2})}, DType::kF32),
            (std::vector<float>{1024, 81}));
  // Integer bases: exact integer powers (wrapping), float exponents truncate.
  EXPECT_EQ(runWith<int32_t>("Pow", {flat<int32_t>({2, -3, 7, 2, 1, -1, 2}), flat<int32_t>({10, 3, 0, 31, -5, -3, -1})},
                             DType::kI32),
            (std::vector<int32_t>{1024, -27, 1, std::numeric_limits<int32_t>::min(), 1, -1, 0}));
  EXPECT_EQ(runWith<int64_t>("Pow", {flat<int64_t>({3}), flat<int64_t>({39})}, DType::kI64),
            (std::vector<int64_t>{4052555153018976267}));
  EXPECT_EQ(runWith<int32_t>("Pow", {flat<int32_t>({2, 10, 4}), flat<float>({0.5f, 1.5f, -1})}, DType::kI32),
            (std::vector<int32_t>{1, 31, 0}));
  EXPECT_EQ(runWith<double>("Pow", {flat<double>({2}), flat<float>({0.5f})}, DType::kF64),
            (std::vector<double>{std::sqrt(2.0)}));
}

TEST(VariadicKernels, SumAndMeanOfThreeBroadcastInputs) {
  std::vector<Operand> inputs = {operand<float>({2, 3}, {1, 2, 3, 4, 5, 6}), operand<float>({3}, {10, 20, 30}),
                                 operand<float>({2, 1}, {100, 200})};
  EXPECT_EQ(runWith<float>("Sum", inputs, DType::kF32), (std::vector<float>{111, 122, 133, 214, 225, 236}));
  EXPECT_EQ(runWith<float>("Mean", inputs, DType::kF32),
            (std::vector<float>{37, 122.0f / 3, 133.0f / 3, 214.0f / 3, 75, 236.0f / 3}));
  EXPECT_EQ(runWith<float>("Mean", {inputs[0]}, DType::kF32), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(runWith<int8_t>("Sum", {flat<int8_t>({100, 1}), flat<int8_t>({100, 2}), flat<int8_t>({1, 3})}, DType::kI8),
            (std::vector<int8_t>{-55, 6}));
}

TEST(PredicateKernels, IsNaNAndIsInfWithTheirAttributes) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1, std::nanf(""), inf, -inf, 0};
  EXPECT_EQ(runWith<uint8_t>("IsNaN", {flat(x)}, DType::kBool), (std::vector<uint8_t>{0, 1, 0, 0, 0}));
  EXPECT_EQ(runWith<uint8_t>("IsInf", {flat(x)}, DType::kBool), (std::vector<uint8_t>{0, 0, 1, 1, 0}));
  EXPECT_EQ(runWith<uint8_t>("IsInf", {flat(x)}, DType::kBool, params({{"detect_negative", int64_t{0}}})),
            (std::vector<uint8_t>{0, 0, 1, 0, 0}));
  EXPECT_EQ(runWith<uint8_t>("IsInf", {flat(x)}, DType::kBool, params({{"detect_positive", int64_t{0}}})),
            (std::vector<uint8_t>{0, 0, 0, 1, 0}));
  EXPECT_EQ(runWith<uint8_t>("IsNaN", {halfOperand(DType::kF16, {3}, {1, std::nanf(""), inf})}, DType::kBool),
            (std::vector<uint8_t>{0, 1, 0}));
}

TEST(UnaryKernels, RoundHalfToEvenSignAndIntegerRelu) {
  EXPECT_EQ(runWith<float>("Round", {flat<float>({0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 2.6f, -2.4f})}, DType::kF32),
            (std::vector<float>{0, 2, 2, -0.0f, -2, 3, -2}));
  EXPECT_EQ(runWith<int8_t>("Sign", {flat<int8_t>({-5, 0, 7})}, DType::kI8), (std::vector<int8_t>{-1, 0, 1}));
  EXPECT_EQ(runWith<uint16_t>("Sign", {flat<uint16_t>({0, 9})}, DType::kU16), (std::vector<uint16_t>{0, 1}));
  EXPECT_EQ(runWith<int32_t>("Relu", {flat<int32_t>({-5, 0, 7})}, DType::kI32), (std::vector<int32_t>{0, 0, 7}));
  EXPECT_EQ(runWith<int64_t>("Abs", {flat<int64_t>({-5, 3})}, DType::kI64), (std::vector<int64_t>{5, 3}));
}

TEST(ClipKernel, EveryIntegerTypeAndHalves) {
  EXPECT_EQ(runWith<int8_t>("Clip",
                            {flat<int8_t>({-128, -3, 0, 5, 127}), operand<int8_t>({}, {-2}), operand<int8_t>({}, {4})},
                            DType::kI8),
            (std::vector<int8_t>{-2, -2, 0, 4, 4}));
  EXPECT_EQ(
      runWith<uint64_t>("Clip", {flat<uint64_t>({0, 5, ~uint64_t{0}}), operand<uint64_t>({}, {2}, true)}, DType::kU64),
      (std::vector<uint64_t>{2, 5, ~uint64_t{0}}));
  EXPECT_EQ(runWith<uint8_t>("Clip", {flat<uint8_t>({0, 200}), omitted(), operand<uint8_t>({}, {100})}, DType::kU8),
            (std::vector<uint8_t>{0, 100}));
  std::vector<Operand> inputs = {halfOperand(DType::kF16, {4}, {-3, 0.5f, 2, 9}), halfOperand(DType::kF16, {}, {-1}),
                                 halfOperand(DType::kF16, {}, {2.5f})};
  std::vector<Operand> outputs = {output(DType::kF16, {4})};
  PreparedKernel("Clip", inputs, outputs).run(inputs, outputs);
  EXPECT_EQ(halfValues(outputs[0]), (std::vector<float>{-1, 0.5f, 2, 2.5f}));
}

}  // namespace
}  // namespace kiln

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

const std::vector<std::vector<int64_t>> kUnaryShapes = {{}, {1}, {5}, {3, 17}, {2, 3, 33}};

// ----------------------------------------------------------------- registry

TEST(ElementwiseKernels, AllAreRegistered) {
  const KernelRegistry& registry = KernelRegistry::cpu();
  for (const char* op :
       {"Relu",  "Sigmoid", "Tanh",      "Exp", "Log",         "Sqrt",      "Erf",      "Abs",   "Neg",  "Reciprocal",
        "Floor", "Ceil",    "LeakyRelu", "Elu", "HardSigmoid", "HardSwish", "Softplus", "Gelu",  "Clip", "Identity",
        "Add",   "Sub",     "Mul",       "Div", "Pow",         "Max",       "Min",      "Equal", "Less", "Greater"}) {
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
  std::vector<Operand> ints = {operand<int32_t>({3}, {1, 2, 3})};
  EXPECT_EQ(prepareError("Relu", ints, {output(DType::kI32, {3})}),
            "Relu: no kernel for i32 inputs (supports f32, f64)");
  EXPECT_EQ(prepareError("Exp", {operand<uint8_t>({1}, {1})}, {output(DType::kU8, {1})}),
            "Exp: no kernel for u8 inputs (supports f32, f64)");
  EXPECT_EQ(prepareError("Abs", {operand<int8_t>({1}, {1})}, {output(DType::kI8, {1})}),
            "Abs: no kernel for i8 inputs (supports f32, f64, i32, i64)");
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
  EXPECT_EQ(prepareError("Clip", {operand<uint8_t>({1}, {1})}, {output(DType::kU8, {1})}),
            "Clip: no kernel for u8 inputs (supports f32, f64, i32, i64)");
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
  };
}

// Inputs that suit the op: positive bases for Pow, no zero divisors, and
// small integers for comparisons so that equal pairs occur.
template <typename T>
std::vector<T> binaryInput(const BinaryCase& c, size_t count, uint32_t seed, bool second) {
  if (c.comparison) return randomValues<T>(count, seed, -2, 2);
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

TEST(BinaryKernels, I32AndI64AreExactForEveryBroadcastPattern) {
  for (const BinaryCase& c : binaryCases()) {
    if (c.floats_only) continue;
    checkBinary<int32_t>(c, 0);
    checkBinary<int64_t>(c, 0);
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
  EXPECT_EQ(prepareError("Add", {operand<uint8_t>({1}, {1}), operand<uint8_t>({1}, {1})}, {output(DType::kU8, {1})}),
            "Add: no kernel for u8 inputs (supports f32, f64, i32, i64)");
  EXPECT_EQ(prepareError("Pow", {operand<int32_t>({1}, {1}), operand<int32_t>({1}, {1})}, {output(DType::kI32, {1})}),
            "Pow: no kernel for i32 inputs (supports f32, f64)");
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

}  // namespace
}  // namespace kiln

// The vector kernels (src/kernels/cpu/vector_kernels.h) on every instruction
// set this machine can run, each one forced in turn: the math functions over
// dense sweeps of the whole f32 range against double-precision references,
// their special values, and the binary rows and row helpers against plain
// loops, at every tail length.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/float_formats.h"
#include "kernels/cpu/vector_kernels.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln::vec {
namespace {

using ::kiln::testing::randomValues;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kMin = std::numeric_limits<float>::min();  // smallest normal
constexpr float kMax = std::numeric_limits<float>::max();
constexpr float kDenorm = std::numeric_limits<float>::denorm_min();

// The tables this CPU runs; the generic one at least.
std::vector<const VectorKernels*> runnableTables() {
  std::vector<const VectorKernels*> tables;
  for (Isa isa : kAllIsas) {
    if (const VectorKernels* table = vectorKernelsFor(isa)) {
      tables.push_back(table);
    } else {
      std::cout << "[ note     ] this CPU cannot run the " << isaName(isa) << " kernels: not tested\n";
    }
  }
  return tables;
}

TEST(VectorKernels, EveryEntryIsSetAndTheChosenTableRunsHere) {
  for (const VectorKernels* table : runnableTables()) {
    SCOPED_TRACE(std::string(isaName(table->isa)));
    for (UnaryFn f : table->unary) EXPECT_NE(f, nullptr);
    for (const auto& rows : table->binary) {
      for (BinaryFn f : rows) EXPECT_NE(f, nullptr);
    }
    EXPECT_NE(table->sum, nullptr);
    EXPECT_NE(table->sumSquares, nullptr);
    EXPECT_NE(table->max, nullptr);
    EXPECT_NE(table->min, nullptr);
    EXPECT_NE(table->expSum, nullptr);
    EXPECT_NE(table->affine, nullptr);
    EXPECT_NE(table->quantize8, nullptr);
    EXPECT_NE(table->binaryQuantized, nullptr);
    EXPECT_NE(table->dequantize8, nullptr);
    EXPECT_NE(table->lookup8, nullptr);
    EXPECT_NE(table->normalize, nullptr);
    EXPECT_NE(table->matmulAccumulate, nullptr);
    EXPECT_NE(table->foldColumns, nullptr);
    EXPECT_NE(table->floatsToHalves, nullptr);
    EXPECT_NE(table->halvesToFloats, nullptr);
  }
  EXPECT_NE(vectorKernelsFor(Isa::kGeneric), nullptr);
  EXPECT_NE(vectorKernelsFor(vectorKernels().isa), nullptr);
  std::cout << "[ note     ] kernels chosen for this CPU: " << isaName(vectorKernels().isa) << "\n";
}

// ------------------------------------------------------- math functions

// The error of `got` against the exact `want`, in units in the last place of
// the float nearest `want` (subnormals: of the smallest subnormal); 0 when
// both are the same infinity or both NaN, infinite when only one is.
double ulpError(float got, double want) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got) ? 0 : HUGE_VAL;
  const float nearest = static_cast<float>(want);
  if (std::isinf(nearest) || std::isinf(got)) return got == nearest ? 0 : HUGE_VAL;
  int exponent = 0;
  std::frexp(nearest, &exponent);
  const double ulp = std::ldexp(1.0, std::max(exponent - 24, -149));
  return std::abs(static_cast<double>(got) - want) / ulp;
}

struct MathCase {
  Unary op;
  std::string name;
  std::function<double(double)> reference;
  double max_ulps;  // the bound checked; the sweeps print what each path reaches
  float alpha = 0;
};

std::vector<MathCase> mathCases() {
  const double sqrt_half = std::sqrt(0.5);
  const double two_sqrt_2_pi = 2 * std::sqrt(2 / M_PI);
  return {
      {Unary::kExp, "Exp", [](double x) { return std::exp(x); }, 1},
      {Unary::kLog, "Log", [](double x) { return std::log(x); }, 1},
      {Unary::kErf, "Erf", [](double x) { return std::erf(x); }, 3},
      {Unary::kTanh, "Tanh", [](double x) { return std::tanh(x); }, 3},
      {Unary::kSigmoid, "Sigmoid",
       [](double x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }, 3},
      {Unary::kSoftplus, "Softplus",
       [](double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x))); }, 2},
      {Unary::kElu, "Elu", [](double x) { return x < 0 ? 1.5 * std::expm1(x) : x; }, 2, 1.5f},
      {Unary::kGelu, "Gelu",
       [=](double x) { return std::isinf(x) ? (x > 0 ? x : -0.0) : 0.5 * x * std::erfc(-x * sqrt_half); }, 3},
      {Unary::kGeluTanh, "GeluTanh",
       [=](double x) {
         if (std::isinf(x)) return x > 0 ? x : -0.0;
         return x / (1 + std::exp(-two_sqrt_2_pi * (x + 0.044715 * x * x * x)));
       },
       3},
  };
}

// Every float whose bits are a multiple of `stride`, both signs, then a fine
// grid over [-20, 20] where the functions do their work, then the specials.
std::vector<float> sweepInputs(uint32_t stride) {
  std::vector<float> inputs;
  for (uint32_t bits = 0; bits <= 0x7f800000u; bits += stride) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    inputs.push_back(x);
    inputs.push_back(-x);
  }
  for (int i = -1000000; i <= 1000000; ++i) inputs.push_back(static_cast<float>(i) * 2e-5f);
  for (float x : {kInf, -kInf, kMax, -kMax, kMin, -kMin, kDenorm, -kDenorm, 0.0f, -0.0f}) inputs.push_back(x);
  return inputs;
}

TEST(VectorMath, WithinAFewUlpOfTheExactResultOverTheWholeRange) {
  const std::vector<float> inputs = sweepInputs(4099);
  const std::vector<const VectorKernels*> tables = runnableTables();
  for (const MathCase& c : mathCases()) {
    std::vector<double> want(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) want[i] = c.reference(inputs[i]);
    for (const VectorKernels* table : tables) {
      std::vector<float> got(inputs.size());
      table->unaryFn(c.op)(inputs.data(), got.data(), static_cast<int64_t>(inputs.size()), c.alpha, 0);
      double worst = 0;
      size_t worst_at = 0;
      size_t relative_misses = 0;
      for (size_t i = 0; i < inputs.size(); ++i) {
        const double ulps = ulpError(got[i], want[i]);
        if (ulps > worst) {
          worst = ulps;
          worst_at = i;
        }
        // Where the result is a normal float: 1e-6 relative (a few ulp).
        if (std::abs(want[i]) >= kMin && std::abs(want[i]) <= kMax &&
            !(std::abs(got[i] - want[i]) <= 1e-6 * std::abs(want[i]))) {
          ++relative_misses;
        }
      }
      std::ostringstream where;
      where << std::setprecision(9) << c.name << " on " << isaName(table->isa) << ": worst " << worst << " ulp at x = "
            << inputs[worst_at] << " (got " << got[worst_at] << ", want " << std::setprecision(17) << want[worst_at]
            << ")";
      std::cout << "[ note     ] " << where.str() << "\n";
      EXPECT_LE(worst, c.max_ulps) << where.str();
      EXPECT_EQ(relative_misses, 0u) << where.str();
    }
  }
}

// Inputs whose results are exact, or are where a careless formula overflows,
// cancels or loses its sign.
TEST(VectorMath, SpecialValues) {
  struct Expect {
    Unary op;
    float x;
    float want;  // NaN: any NaN
    double tolerance = 0;  // relative; 0: exactly want, the sign of zero included
  };
  const std::vector<Expect> cases = {
      {Unary::kExp, 0.0f, 1.0f},       {Unary::kExp, -0.0f, 1.0f},         {Unary::kExp, 100.0f, kInf},
      {Unary::kExp, 89.0f, kInf},      {Unary::kExp, -100.0f, static_cast<float>(std::exp(-100.0)), 1e-6}, {Unary::kExp, -104.0f, 0.0f},
      {Unary::kExp, -1000.0f, 0.0f},   {Unary::kExp, kInf, kInf},          {Unary::kExp, -kInf, 0.0f},
      {Unary::kExp, kNaN, kNaN},       {Unary::kExp, 88.72283f, static_cast<float>(std::exp(double{88.72283f})), 1e-6},
      {Unary::kLog, 1.0f, 0.0f},       {Unary::kLog, 0.0f, -kInf},         {Unary::kLog, -0.0f, -kInf},
      {Unary::kLog, -1.0f, kNaN},      {Unary::kLog, -kInf, kNaN},         {Unary::kLog, kInf, kInf},
      {Unary::kLog, kNaN, kNaN},       {Unary::kLog, kDenorm, static_cast<float>(std::log(double{kDenorm})), 1e-6},
      {Unary::kLog, kMax, static_cast<float>(std::log(double{kMax})), 1e-6},
      {Unary::kErf, 0.0f, 0.0f},       {Unary::kErf, 9.0f, 1.0f},          {Unary::kErf, -9.0f, -1.0f},
      {Unary::kErf, 4.0f, 1.0f},       {Unary::kErf, kInf, 1.0f},          {Unary::kErf, -kInf, -1.0f},
      {Unary::kErf, kNaN, kNaN},       {Unary::kErf, 1e-30f, static_cast<float>(std::erf(double{1e-30f})), 1e-6},
      {Unary::kTanh, 0.0f, 0.0f},      {Unary::kTanh, 20.0f, 1.0f},        {Unary::kTanh, -20.0f, -1.0f},
      {Unary::kTanh, kInf, 1.0f},      {Unary::kTanh, -kInf, -1.0f},       {Unary::kTanh, kNaN, kNaN},
      {Unary::kTanh, 1e-30f, 1e-30f},  {Unary::kSigmoid, 0.0f, 0.5f},      {Unary::kSigmoid, 100.0f, 1.0f},
      {Unary::kSigmoid, kInf, 1.0f},   {Unary::kSigmoid, -kInf, 0.0f},     {Unary::kSigmoid, kNaN, kNaN},
      {Unary::kSigmoid, -100.0f, static_cast<float>(std::exp(-100.0)), 1e-6},
      {Unary::kSoftplus, kInf, kInf},  {Unary::kSoftplus, -kInf, 0.0f},    {Unary::kSoftplus, 100.0f, 100.0f},
      {Unary::kSoftplus, kNaN, kNaN},  {Unary::kSoftplus, -100.0f, static_cast<float>(std::exp(-100.0)), 1e-6},
      {Unary::kGelu, 0.0f, 0.0f},      {Unary::kGelu, kInf, kInf},         {Unary::kGelu, -kInf, -0.0f},
      {Unary::kGelu, kNaN, kNaN},      {Unary::kGelu, 100.0f, 100.0f},     {Unary::kGelu, -100.0f, -0.0f},
      {Unary::kGeluTanh, kInf, kInf},  {Unary::kGeluTanh, -kInf, -0.0f},   {Unary::kGeluTanh, kNaN, kNaN},
      {Unary::kGeluTanh, 100.0f, 100.0f},
      {Unary::kFloor, -0.0f, -0.0f},   {Unary::kFloor, -0.5f, -1.0f},      {Unary::kFloor, 2.5f, 2.0f},
      {Unary::kFloor, -3e9f, -3e9f},   {Unary::kFloor, 8388607.5f, 8388607.0f}, {Unary::kFloor, kInf, kInf},
      {Unary::kFloor, kNaN, kNaN},     {Unary::kCeil, -0.5f, -0.0f},       {Unary::kCeil, 2.5f, 3.0f},
      {Unary::kCeil, -2.5f, -2.0f},    {Unary::kCeil, -kInf, -kInf},       {Unary::kCeil, 3e9f, 3e9f},
      {Unary::kSqrt, 4.0f, 2.0f},      {Unary::kSqrt, -1.0f, kNaN},        {Unary::kAbs, -0.0f, 0.0f},
      {Unary::kRelu, -0.5f, 0.0f},     {Unary::kRelu, kNaN, kNaN},
  };
  for (const VectorKernels* table : runnableTables()) {
    for (const Expect& c : cases) {
      float y = 12345.0f;
      table->unaryFn(c.op)(&c.x, &y, 1, 1.0f, 0.0f);
      const std::string what = std::string(isaName(table->isa)) + " op " +
                               std::to_string(static_cast<int>(c.op)) + " at " + std::to_string(c.x);
      if (std::isnan(c.want)) {
        EXPECT_TRUE(std::isnan(y)) << what << ": got " << y;
      } else if (c.tolerance != 0) {
        EXPECT_NEAR(y, c.want, c.tolerance * std::abs(c.want)) << what;
      } else {
        EXPECT_EQ(y, c.want) << what;
        EXPECT_EQ(std::signbit(y), std::signbit(c.want)) << what << ": the sign of zero";
      }
    }
  }
}

// Each lane computes the same whatever its neighbours hold, so a value comes
// out the same at any position, in a full vector or in the tail, in place or
// not.
TEST(VectorMath, TailsAndInPlaceGiveTheSameValues) {
  const std::vector<float> x = randomValues<float>(67, 3, -8, 8);
  for (const VectorKernels* table : runnableTables()) {
    for (size_t op = 0; op < static_cast<size_t>(Unary::kCount); ++op) {
      const UnaryFn f = table->unary[op];
      std::vector<float> whole(x.size());
      f(x.data(), whole.data(), static_cast<int64_t>(x.size()), 0.3f, 0.6f);
      for (size_t start : {0, 1, 5, 17, 60}) {
        for (size_t n = 0; start + n <= x.size() && n < 40; ++n) {
          std::vector<float> part(x.begin() + static_cast<std::ptrdiff_t>(start),
                                  x.begin() + static_cast<std::ptrdiff_t>(start + n));
          f(part.data(), part.data(), static_cast<int64_t>(n), 0.3f, 0.6f);  // in place
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(std::memcmp(&part[i], &whole[start + i], sizeof(float)), 0)
                << isaName(table->isa) << " op " << op << " element " << start + i << " of a run of " << n;
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------- binary rows

float binaryReference(Binary op, float a, float b) {
  switch (op) {
    case Binary::kAdd:
      return a + b;
    case Binary::kSub:
      return a - b;
    case Binary::kMul:
      return a * b;
    case Binary::kDiv:
      return a / b;
    case Binary::kMax:
      return (a > b || a != a) ? a : b;
    case Binary::kMin:
      return (a < b || a != a) ? a : b;
    case Binary::kSquare:
      return a * a;
    case Binary::kSqrt:
      return std::pow(a, 0.5f);
    case Binary::kCount:
      break;
  }
  return kNaN;
}

TEST(VectorKernels, BinaryRowsMatchPlainLoopsAtEveryLength) {
  std::vector<float> a = randomValues<float>(70, 1, -4, 4);
  std::vector<float> b = randomValues<float>(70, 2, -4, 4);
  a[3] = kNaN;  // NaN on either side of Max and Min
  b[9] = kNaN;
  a[20] = -0.0f;  // pow(-0, 0.5) = +0
  a[21] = -kInf;  // pow(-inf, 0.5) = +inf
  for (const VectorKernels* table : runnableTables()) {
    for (size_t op = 0; op < static_cast<size_t>(Binary::kCount); ++op) {
      for (size_t operands = 0; operands < static_cast<size_t>(Operands::kCount); ++operands) {
        const BinaryFn f = table->binary[op][operands];
        for (int64_t n = 0; n <= 70; ++n) {
          std::vector<float> y(static_cast<size_t>(n) + 1, 777.0f);
          f(a.data(), b.data(), y.data(), n);
          for (int64_t i = 0; i < n; ++i) {
            const size_t ia = operands == static_cast<size_t>(Operands::kScalarA) ? 0 : static_cast<size_t>(i);
            const size_t ib = operands == static_cast<size_t>(Operands::kScalarB) ? 0 : static_cast<size_t>(i);
            const float want = binaryReference(static_cast<Binary>(op), a[ia], b[ib]);
            const float got = y[static_cast<size_t>(i)];
            const bool same = std::isnan(want) ? std::isnan(got) : std::memcmp(&got, &want, sizeof got) == 0;
            ASSERT_TRUE(same) << isaName(table->isa) << " op " << op << " operands " << operands << " n " << n
                              << " element " << i << ": got " << got << ", want " << want;
          }
          ASSERT_EQ(y[static_cast<size_t>(n)], 777.0f) << "wrote past the end";
        }
      }
    }
  }
}

// ----------------------------------------------------------- row helpers

TEST(VectorKernels, RowHelpersMatchDoubleReferences) {
  const std::vector<float> x = randomValues<float>(300, 5, -3, 3);
  const std::vector<float> scale = randomValues<float>(300, 6, -2, 2);
  const std::vector<float> bias = randomValues<float>(300, 7, -1, 1);
  for (const VectorKernels* table : runnableTables()) {
    for (int64_t n : {0, 1, 3, 15, 16, 17, 63, 64, 65, 300}) {
      SCOPED_TRACE(std::string(isaName(table->isa)) + " n " + std::to_string(n));
      double sum = 0, squares = 0, exps = 0;
      float mx = -kInf, mn = kInf;
      for (int64_t i = 0; i < n; ++i) {
        sum += x[static_cast<size_t>(i)];
        squares += (x[static_cast<size_t>(i)] - 0.25) * (x[static_cast<size_t>(i)] - 0.25);
        exps += std::exp(x[static_cast<size_t>(i)] - 3.0);
        mx = std::max(mx, x[static_cast<size_t>(i)]);
        mn = std::min(mn, x[static_cast<size_t>(i)]);
      }
      EXPECT_NEAR(table->sum(x.data(), n), sum, 1e-5);
      EXPECT_NEAR(table->sumSquares(x.data(), n, 0.25f), squares, 1e-6 * (1 + squares));
      EXPECT_EQ(table->max(x.data(), n), mx);
      EXPECT_EQ(table->min(x.data(), n), mn);
      EXPECT_NEAR(table->expSum(x.data(), nullptr, n, 3.0f), exps, 1e-6 * (1 + exps));
      std::vector<float> y(static_cast<size_t>(n) + 1, 777.0f);
      EXPECT_NEAR(table->expSum(x.data(), y.data(), n, 3.0f), exps, 1e-6 * (1 + exps));
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_NEAR(y[static_cast<size_t>(i)], std::exp(x[static_cast<size_t>(i)] - 3.0), 1e-6) << i;
      }
      EXPECT_EQ(y[static_cast<size_t>(n)], 777.0f);
      table->affine(x.data(), y.data(), n, 1.5f, -0.5f);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[static_cast<size_t>(i)], 1.5 * x[static_cast<size_t>(i)] - 0.5, 1e-6);
      for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
        table->normalize(x.data(), scale.data(), b, y.data(), n, 0.1f, 2.0f);
        for (int64_t i = 0; i < n; ++i) {
          const size_t k = static_cast<size_t>(i);
          EXPECT_NEAR(y[k], (x[k] - 0.1) * 2.0 * scale[k] + (b == nullptr ? 0.0 : bias[k]), 1e-5);
        }
      }
      EXPECT_EQ(y[static_cast<size_t>(n)], 777.0f);
    }
    // NaN anywhere makes max and min NaN.
    std::vector<float> with_nan = x;
    with_nan[40] = kNaN;
    EXPECT_TRUE(std::isnan(table->max(with_nan.data(), 100)));
    EXPECT_TRUE(std::isnan(table->min(with_nan.data(), 100)));
  }
}

// matmulAccumulate against a double-precision product, over row counts that
// take each row tile (4, 2, 1) and column counts that take wide tiles, pairs
// of vectors, single vectors and a partial vector, with strides wider than
// the rows; the padding beyond each row of c must stay untouched.
TEST(VectorKernels, MatmulAccumulateAddsTheProduct) {
  for (const VectorKernels* table : runnableTables()) {
    SCOPED_TRACE(std::string(isaName(table->isa)));
    for (int64_t m : {1, 2, 3, 7}) {
      for (int64_t n : {1, 5, 16, 37, 130, 512}) {
        const int64_t k = 29, lda = k + 3, ldb = n + 5, ldc = n + 2;
        std::vector<float> a(static_cast<size_t>(m * lda)), b(static_cast<size_t>(k * ldb));
        std::vector<float> c(static_cast<size_t>(m * ldc));
        for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * static_cast<float>(i));
        for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11f * static_cast<float>(i));
        for (size_t i = 0; i < c.size(); ++i) c[i] = 0.5f * static_cast<float>(i % 7);
        const std::vector<float> before = c;
        table->matmulAccumulate(a.data(), lda, b.data(), ldb, c.data(), ldc, m, n, k);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < ldc; ++j) {
            const size_t at = static_cast<size_t>(i * ldc + j);
            if (j >= n) {
              EXPECT_EQ(c[at], before[at]) << "padding " << i << "," << j;
              continue;
            }
            double want = before[at];
            for (int64_t p = 0; p < k; ++p) {
              want += static_cast<double>(a[static_cast<size_t>(i * lda + p)]) * b[static_cast<size_t>(p * ldb + j)];
            }
            EXPECT_NEAR(c[at], want, 1e-4) << m << "x" << n << " at " << i << "," << j;
          }
        }
      }
    }
  }
}

TEST(VectorKernels, Quantize8RoundsHalfToEvenAsNearbyint) {
  // Values whose quotients land on exact halves (ties go to even), beyond
  // both ends of the range (saturated), NaN (the lowest value), at every
  // tail length, u8 and i8.
  const float scale = 0.5f;
  std::vector<float> x;
  for (int i = -300; i <= 300; ++i) x.push_back(0.25f * static_cast<float>(i));
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  x.push_back(1e6f);
  x.push_back(-1e6f);
  for (const VectorKernels* table : runnableTables()) {
    SCOPED_TRACE(std::string(isaName(table->isa)));
    for (const bool is_signed : {false, true}) {
      const float zero = is_signed ? -28.0f : 100.0f;
      const float low = is_signed ? -128.0f : 0.0f, high = is_signed ? 127.0f : 255.0f;
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{17}, static_cast<int64_t>(x.size())}) {
        std::vector<uint8_t> y(static_cast<size_t>(n) + 1, 7);
        table->quantize8(x.data(), y.data(), n, scale, zero, is_signed);
        for (int64_t i = 0; i < n; ++i) {
          const float v = x[static_cast<size_t>(i)];
          const float want = std::isnan(v) ? low : std::clamp(std::nearbyint(v / scale) + zero, low, high);
          const int got = is_signed ? static_cast<int8_t>(y[static_cast<size_t>(i)]) : y[static_cast<size_t>(i)];
          EXPECT_EQ(got, static_cast<int>(want)) << "x = " << v << (is_signed ? " (i8)" : " (u8)");
        }
        EXPECT_EQ(y[static_cast<size_t>(n)], 7) << "wrote past n";
      }
    }
  }
}

// quantize8 divides through the reciprocal (vector_math.h's
// divideByReciprocal) on the FMA builds: the quotient must still round as the
// division's, at the values where that matters: halfway between integers
// (x = (k + 0.5) * scale, rounded, and its float neighbours), for scales of
// every binade's mantissas, negative ones included.
TEST(VectorKernels, Quantize8RoundsAsTheDivision) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-20, 6);
  for (const VectorKernels* table : runnableTables()) {
    SCOPED_TRACE(std::string(isaName(table->isa)));
    for (int trial = 0; trial < 300; ++trial) {
      const float scale = std::ldexp(mantissa(rng), exponent(rng)) * (trial % 7 == 0 ? -1.0f : 1.0f);
      std::vector<float> x;
      for (int k = -300; k <= 300; ++k) {
        const float half = (static_cast<float>(k) + 0.5f) * scale;
        x.push_back(half);
        x.push_back(std::nextafter(half, 0.0f));
        x.push_back(std::nextafter(half, 2.0f * half));
        x.push_back(static_cast<float>(k) * scale);
      }
      std::vector<uint8_t> y(x.size());
      table->quantize8(x.data(), y.data(), static_cast<int64_t>(x.size()), scale, 3.0f, false);
      for (size_t i = 0; i < x.size(); ++i) {
        const float want = std::clamp(std::nearbyint(x[i] / scale) + 3.0f, 0.0f, 255.0f);
        ASSERT_EQ(y[i], static_cast<uint8_t>(want)) << "x = " << x[i] << ", scale = " << scale;
      }
    }
  }
}

// lookup8: every byte value, every tail length (the VBMI path's masked tail)
// and lengths of several 64-byte steps, one row and strided rows, in every
// runnable table.
TEST(VectorKernels, Lookup8IsTheTable) {
  std::array<uint8_t, 256> table{};
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<uint8_t>((i * 151 + 7) % 256);
  std::vector<uint8_t> x(2100);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>((i * 13 + 200) % 256);
  for (const VectorKernels* table_set : runnableTables()) {
    SCOPED_TRACE(std::string(isaName(table_set->isa)));
    for (int64_t n = 0; n <= 700; n += (n < 130 ? 1 : 97)) {
      std::vector<uint8_t> y(static_cast<size_t>(n) + 1, 3);
      table_set->lookup8(x.data(), 0, y.data(), 0, 1, n, table.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[static_cast<size_t>(i)], table[x[static_cast<size_t>(i)]]) << i << " of " << n;
      EXPECT_EQ(y[static_cast<size_t>(n)], 3) << "wrote past n = " << n;
    }
    // Three rows of 70 bytes, read 100 apart and written 90 apart: the bytes
    // between rows stay.
    std::vector<uint8_t> y(300, 3);
    table_set->lookup8(x.data(), 100, y.data(), 90, 3, 70, table.data());
    for (size_t i = 0; i < y.size(); ++i) {
      const size_t row = i / 90, column = i % 90;
      const uint8_t want = row < 3 && column < 70 ? table[x[row * 100 + column]] : 3;
      ASSERT_EQ(y[i], want) << "at " << i;
    }
  }
}

// binaryQuantized against the scalar formulas, sum and product, u8 and i8:
// every pair of a sweep of byte values, ratios that send results past both
// ends (saturation), ties (ratios of 0.5 land on halves), at every tail
// length.
TEST(VectorKernels, BinaryQuantizedIsTheRoundedSaturatedSumOrProduct) {
  for (const bool multiply : {false, true}) {
    for (const bool is_signed : {false, true}) {
      const QuantizedBinaryParams p{.multiply = multiply, .a_ratio = multiply ? 0.0125f : 0.5f,
                                    .a_zero = is_signed ? -3.0f : 125.0f, .b_ratio = 1.5f,
                                    .b_zero = is_signed ? 10.0f : 138.0f, .y_zero = is_signed ? -20.0f : 108.0f,
                                    .signed_bytes = is_signed};
      std::vector<uint8_t> a, b;
      for (int i = 0; i < 256; ++i) {
        for (int j = 0; j < 256; j += 5) {
          a.push_back(static_cast<uint8_t>(i));
          b.push_back(static_cast<uint8_t>(j));
        }
      }
      auto value = [&](uint8_t byte) {
        return is_signed ? static_cast<float>(static_cast<int8_t>(byte)) : static_cast<float>(byte);
      };
      for (const VectorKernels* table : runnableTables()) {
        SCOPED_TRACE(std::string(isaName(table->isa)) + (is_signed ? " i8" : " u8") + (multiply ? " product" : " sum"));
        for (int64_t n : {int64_t{0}, int64_t{3}, int64_t{17}, static_cast<int64_t>(a.size())}) {
          std::vector<uint8_t> y(static_cast<size_t>(n) + 1, 7);
          table->binaryQuantized(a.data(), b.data(), y.data(), n, p);
          bool saw_low = false, saw_high = false;
          for (int64_t i = 0; i < n; ++i) {
            const auto k = static_cast<size_t>(i);
            const float da = value(a[k]) - p.a_zero, db = value(b[k]) - p.b_zero;
            const float v = multiply ? std::nearbyint(p.a_ratio * (da * db))
                                     : std::nearbyint(p.a_ratio * da + p.b_ratio * db);
            const float low = is_signed ? -128.0f : 0.0f;
            const float want = std::clamp(v + p.y_zero, low, low + 255.0f);
            saw_low = saw_low || want == low;
            saw_high = saw_high || want == low + 255.0f;
            ASSERT_EQ(value(y[k]), want) << "a = " << value(a[k]) << ", b = " << value(b[k]);
          }
          if (n == static_cast<int64_t>(a.size())) {
            EXPECT_TRUE(saw_low && saw_high) << "the sweep saturates at both ends";
          }
          EXPECT_EQ(y[static_cast<size_t>(n)], 7) << "wrote past n";
        }
      }
    }
  }
}

// dequantize8 against (x - zero) * scale for every byte value, u8 and i8, at
// every tail length.
TEST(VectorKernels, Dequantize8IsTheScaledDifference) {
  std::vector<uint8_t> x(256);
  for (int i = 0; i < 256; ++i) x[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
  for (const bool is_signed : {false, true}) {
    const float scale = 0.037f, zero = is_signed ? -5.0f : 131.0f;
    for (const VectorKernels* table : runnableTables()) {
      SCOPED_TRACE(std::string(isaName(table->isa)) + (is_signed ? " i8" : " u8"));
      for (int64_t n : {int64_t{0}, int64_t{5}, int64_t{19}, int64_t{256}}) {
        std::vector<float> y(static_cast<size_t>(n) + 1, 7.0f);
        table->dequantize8(x.data(), y.data(), n, scale, zero, is_signed);
        for (int64_t i = 0; i < n; ++i) {
          const uint8_t byte = x[static_cast<size_t>(i)];
          const float value = is_signed ? static_cast<float>(static_cast<int8_t>(byte)) : static_cast<float>(byte);
          ASSERT_EQ(y[static_cast<size_t>(i)], (value - zero) * scale) << "byte " << int{byte};
        }
        EXPECT_EQ(y[static_cast<size_t>(n)], 7.0f) << "wrote past n";
      }
    }
  }
}

}  // namespace
// scaleSums in place and into another array, with one scale or one per
// element, with and without an addend, over lengths with partial vectors: the
// exact f32 arithmetic of f32(sum) * scale + add.
TEST(VectorKernels, ScaleSumsIsTheCastThenTheScale) {
  for (const VectorKernels* table : runnableTables()) {
    SCOPED_TRACE(std::string(isaName(table->isa)));
    for (int64_t n : {0, 3, 16, 37}) {
      std::vector<int32_t> sums(static_cast<size_t>(n));
      std::vector<float> scales(static_cast<size_t>(n)), add(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        sums[static_cast<size_t>(i)] = static_cast<int32_t>((i * 2654435761u) % 2000003) - 1000001;
        scales[static_cast<size_t>(i)] = 0.001f * static_cast<float>(i + 1);
        add[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i % 5);
      }
      for (bool per_element : {false, true}) {
        for (bool with_add : {false, true}) {
          std::vector<float> out(static_cast<size_t>(n));
          table->scaleSums(sums.data(), out.data(), n, scales.data(), per_element, with_add ? add.data() : nullptr);
          std::vector<int32_t> in_place = sums;
          table->scaleSums(in_place.data(), in_place.data(), n, scales.data(), per_element,
                           with_add ? add.data() : nullptr);
          for (int64_t i = 0; i < n; ++i) {
            const auto at = static_cast<size_t>(i);
            float want = static_cast<float>(sums[at]) * scales[per_element ? at : 0];
            if (with_add) want += add[at];
            EXPECT_EQ(out[at], want) << n << " " << i;
            float got;
            std::memcpy(&got, &in_place[at], sizeof got);
            EXPECT_EQ(got, want) << "in place " << n << " " << i;
          }
        }
      }
    }
  }
}

// Every f16 bit pattern to f32 and back, and f32 patterns across the whole
// range (a stride through the 2^32 bit patterns, plus the edges of f16's
// range, ties and NaNs), against core/float_formats.h bit for bit, at a
// length with a partial vector at the end.
TEST(VectorKernels, HalfConversionsMatchTheScalarOnesBitForBit) {
  std::vector<uint16_t> halves(65536 + 5);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<uint32_t> patterns;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 65521) patterns.push_back(static_cast<uint32_t>(bits));
  for (uint32_t edge : {0x477FEFFFu, 0x477FF000u, 0x477FE000u, 0x38800000u, 0x387FFFFFu, 0x33000000u, 0x33000001u,
                        0x32FFFFFFu, 0x7F800000u, 0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu, 0x3F801000u, 0x3F803000u}) {
    patterns.push_back(edge);
    patterns.push_back(edge | 0x80000000u);
  }
  std::vector<float> floats(patterns.size());
  std::memcpy(floats.data(), patterns.data(), patterns.size() * sizeof(float));
  for (const VectorKernels* table : runnableTables()) {
    SCOPED_TRACE(std::string(isaName(table->isa)));
    std::vector<float> widened(halves.size(), -1.0f);
    table->halvesToFloats(halves.data(), widened.data(), static_cast<int64_t>(halves.size()));
    for (size_t i = 0; i < halves.size(); ++i) {
      ASSERT_EQ(floatToBits(widened[i]), floatToBits(halfToFloat(halves[i]))) << "half 0x" << std::hex << halves[i];
    }
    std::vector<uint16_t> narrowed(floats.size() + 1, 0xABCD);
    table->floatsToHalves(floats.data(), narrowed.data(), static_cast<int64_t>(floats.size()));
    for (size_t i = 0; i < floats.size(); ++i) {
      ASSERT_EQ(narrowed[i], floatToHalf(floats[i])) << "float bits 0x" << std::hex << patterns[i];
    }
    EXPECT_EQ(narrowed.back(), 0xABCD) << "wrote past n";
  }
}

// foldColumns at every width up to past four vectors of the widest
// instruction set (whole vectors, partial ones, blocks of fewer columns than
// their vectors), strided rows, sums against a double reference and maxima
// exactly, NaN propagating through the maximum; nothing written past n.
TEST(VectorKernels, FoldColumnsSumsAndMaximaAtEveryWidth) {
  constexpr int64_t kRows = 37, kStride = 80;
  std::vector<float> x(static_cast<size_t>(kRows * kStride));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000) / 250.0f - 2.0f;
  x[5 * kStride + 3] = std::numeric_limits<float>::quiet_NaN();
  for (const VectorKernels* table : runnableTables()) {
    SCOPED_TRACE(std::string(isaName(table->isa)));
    for (int64_t n = 0; n <= 70; ++n) {
      for (bool max : {false, true}) {
        std::vector<float> y(static_cast<size_t>(n) + 1, 123.0f);
        table->foldColumns(x.data(), kRows, kStride, n, y.data(), max);
        for (int64_t j = 0; j < n; ++j) {
          double sum = 0, most = -std::numeric_limits<double>::infinity();
          bool nan = false;
          for (int64_t i = 0; i < kRows; ++i) {
            const float v = x[static_cast<size_t>(i * kStride + j)];
            nan = nan || std::isnan(v);
            sum += v;
            most = std::max(most, static_cast<double>(v));
          }
          const float got = y[static_cast<size_t>(j)];
          if (nan) {
            EXPECT_TRUE(std::isnan(got)) << "n " << n << " column " << j << (max ? " max" : " sum");
          } else if (max) {
            EXPECT_EQ(got, static_cast<float>(most)) << "n " << n << " column " << j;
          } else {
            EXPECT_NEAR(got, sum, 1e-4 * (1 + std::abs(sum))) << "n " << n << " column " << j;
          }
        }
        EXPECT_EQ(y[static_cast<size_t>(n)], 123.0f) << "wrote past n = " << n;
      }
    }
  }
}

}  // namespace kiln::vec

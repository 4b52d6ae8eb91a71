// Reduction kernels against double-precision references written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/kernel.h"
#include "kiln/error.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/support/allocation_counter.h"

namespace kiln {
namespace {

using ::kiln::testing::elementCount;
using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::params;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::kiln::testing::randomValues;
using Shape = std::vector<int64_t>;

struct ReduceOp {
  std::string name;
  double identity;
  std::function<double(double)> map;
  std::function<double(double, double)> combine;
  std::function<double(double, int64_t)> finish;
};

std::vector<ReduceOp> reduceOps() {
  const auto add = [](double a, double b) { return a + b; };
  const auto same = [](double x) { return x; };
  const auto keep = [](double a, int64_t) { return a; };
  const double inf = std::numeric_limits<double>::infinity();
  return {
      {"ReduceSum", 0, same, add, keep},
      {"ReduceMean", 0, same, add, [](double a, int64_t n) { return a / static_cast<double>(n); }},
      {"ReduceMax", -inf, same, [](double a, double b) { return std::max(a, b); }, keep},
      {"ReduceMin", inf, same, [](double a, double b) { return std::min(a, b); }, keep},
      {"ReduceProd", 1, same, [](double a, double b) { return a * b; }, keep},
      {"ReduceSumSquare", 0, [](double x) { return x * x; }, add, keep},
      {"ReduceL2", 0, [](double x) { return x * x; }, add, [](double a, int64_t) { return std::sqrt(a); }},
      {"ReduceL1", 0, [](double x) { return std::abs(x); }, add, keep},
      {"ReduceLogSum", 0, same, add, [](double a, int64_t) { return std::log(a); }},
  };
}

// The reference: every input element folded into its output element.
std::vector<double> reduceReference(const ReduceOp& op, const std::vector<double>& x, const Shape& shape,
                                    const std::vector<bool>& reduced, uint64_t out_count) {
  std::vector<double> acc(out_count, op.identity);
  int64_t count = 1;
  for (size_t d = 0; d < shape.size(); ++d) count *= reduced[d] ? shape[d] : 1;
  for (uint64_t i = 0; i < x.size(); ++i) {
    uint64_t flat = i;
    uint64_t out = 0;
    uint64_t scale = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      const uint64_t coord = flat % static_cast<uint64_t>(shape[d]);
      flat /= static_cast<uint64_t>(shape[d]);
      if (!reduced[d]) {
        out += coord * scale;
        scale *= static_cast<uint64_t>(shape[d]);
      }
    }
    acc[out] = op.combine(acc[out], op.map(x[i]));
  }
  for (double& v : acc) v = op.finish(v, count);
  return acc;
}

struct AxesCase {
  Shape shape;
  std::vector<int64_t> axes;  // empty: all
};

const std::vector<AxesCase> kAxesCases = {
    {{7}, {0}},           {{3, 40}, {1}},         {{40, 3}, {0}},        {{2, 3, 4}, {1}},
    {{2, 3, 4}, {0, 2}},  {{2, 3, 4}, {}},        {{4, 1, 5, 6}, {-1, 1}}, {{2, 3, 4, 5}, {0, 1, 3}},
    {{3, 5, 37}, {2}},    {{5, 1}, {1}},          {{2, 0, 3}, {1}},      {{2, 3, 33}, {0, 2}},
};

template <typename T>
void checkReduce(const ReduceOp& op, bool from_input, bool keepdims, double rtol) {
  uint32_t seed = 1;
  for (const AxesCase& c : kAxesCases) {
    const size_t rank = c.shape.size();
    std::vector<bool> reduced(rank, c.axes.empty());
    for (int64_t a : c.axes) reduced[static_cast<size_t>(a < 0 ? a + static_cast<int64_t>(rank) : a)] = true;
    Shape out;
    for (size_t d = 0; d < rank; ++d) {
      if (!reduced[d]) out.push_back(c.shape[d]);
      else if (keepdims) out.push_back(1);
    }
    const bool prod = op.name == "ReduceProd";
    const bool positive = op.name == "ReduceLogSum";
    std::vector<T> x = randomValues<T>(elementCount(c.shape), seed++, positive ? 0.1 : (prod ? 0.5 : -2),
                                       positive ? 2 : (prod ? 1.5 : 2));
    std::vector<double> xd(x.begin(), x.end());
    std::vector<double> want = reduceReference(op, xd, c.shape, reduced, elementCount(out));
    if constexpr (std::is_integral_v<T>) {
      // An empty Max / Min: the type's lowest / highest value where it has no infinity (ONNX).
      for (double& v : want) {
        if (std::isinf(v)) v = static_cast<double>(v < 0 ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max());
      }
    }
    std::vector<Operand> inputs = {operand(c.shape, x)};
    ParamMap p = params({{"keepdims", int64_t{keepdims}}});
    if (from_input) {
      inputs.push_back(operand<int64_t>({static_cast<int64_t>(c.axes.size())}, c.axes, true));
    } else if (!c.axes.empty()) {
      p.set("axes", c.axes);
    }
    std::vector<Operand> outputs = {output(dtypeOf<T>(), out)};
    PreparedKernel(op.name, inputs, outputs, p).run(inputs, outputs);
    const std::vector<T> got = outputs[0].values<T>();
    ASSERT_EQ(got.size(), want.size());
    size_t bad = 0;
    std::string first;
    for (size_t i = 0; i < got.size(); ++i) {
      const double g = static_cast<double>(got[i]);
      // Sums of mixed signs: the error scales with the sum of magnitudes, not the result.
      double scale = std::abs(want[i]);
      if (op.name == "ReduceSum" || op.name == "ReduceMean") scale = std::max(scale, 1.0);
      const bool ok = std::isnan(want[i]) ? std::isnan(g) : (g == want[i] || std::abs(g - want[i]) <= rtol * scale);
      if (!ok && bad++ == 0) first = "element " + std::to_string(i) + " got " + std::to_string(g) + " want " + std::to_string(want[i]);
    }
    EXPECT_EQ(bad, 0u) << op.name << " " << dtypeName(dtypeOf<T>()) << " shape " << ::testing::PrintToString(c.shape)
                       << " axes " << ::testing::PrintToString(c.axes) << " keepdims " << keepdims
                       << (from_input ? " (input)" : " (attribute)") << ": " << first;
  }
}

TEST(ReduceKernels, F32MatchesReference) {
  for (const ReduceOp& op : reduceOps()) {
    for (bool from_input : {false, true}) {
      for (bool keepdims : {true, false}) checkReduce<float>(op, from_input, keepdims, 2e-5);
    }
  }
}

TEST(ReduceKernels, F64MatchesReference) {
  for (const ReduceOp& op : reduceOps()) checkReduce<double>(op, true, true, 1e-12);
}

TEST(ReduceKernels, IntegersAreExact) {
  for (const ReduceOp& op : reduceOps()) {
    if (op.name != "ReduceSum" && op.name != "ReduceMax" && op.name != "ReduceMin") continue;
    for (bool keepdims : {true, false}) {
      checkReduce<int64_t>(op, true, keepdims, 0);
      checkReduce<int32_t>(op, false, keepdims, 0);
    }
  }
}

TEST(ReduceKernels, NoopWithEmptyAxesCopies) {
  const std::vector<float> x = randomValues<float>(6, 3, -1, 1);
  std::vector<Operand> inputs = {operand<float>({2, 3}, x), operand<int64_t>({0}, {}, true)};
  std::vector<Operand> outputs = {output(DType::kF32, {2, 3})};
  PreparedKernel("ReduceSum", inputs, outputs, params({{"noop_with_empty_axes", int64_t{1}}})).run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<float>(), x);
}

TEST(ReduceKernels, MaxAndMinPropagateNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const char* op : {"ReduceMax", "ReduceMin"}) {
    std::vector<Operand> inputs = {operand<float>({2, 20}, std::vector<float>(40, 1.0f))};
    inputs[0].data<float>()[5] = nan;
    inputs[0].data<float>()[33] = nan;
    for (int64_t axis : {0, 1}) {
      std::vector<Operand> outputs = {output(DType::kF32, axis == 0 ? Shape{20} : Shape{2})};
      PreparedKernel(op, inputs, outputs, params({{"axes", std::vector<int64_t>{axis}}, {"keepdims", int64_t{0}}}))
          .run(inputs, outputs);
      const std::vector<float> y = outputs[0].values<float>();
      if (axis == 1) {
        EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1])) << op;
      } else {
        EXPECT_TRUE(std::isnan(y[5]) && std::isnan(y[13]) && y[0] == 1.0f) << op;
      }
    }
  }
}

TEST(ReduceKernels, PrepareErrors) {
  Operand x = operand<float>({2, 3}, std::vector<float>(6, 1.0f));
  EXPECT_EQ(prepareError("ReduceSum", {x}, {output(DType::kF32, {2})}, params({{"axes", std::vector<int64_t>{2}}})),
            "ReduceSum: axis 2 is out of range for rank 2");
  EXPECT_EQ(prepareError("ReduceSum", {x}, {output(DType::kF32, {2})}, params({{"axes", std::vector<int64_t>{1, -1}}})),
            "ReduceSum: axes [1, 1] repeat an axis");
  EXPECT_EQ(prepareError("ReduceMean", {x}, {output(DType::kF32, {2})}, params({{"axes", std::vector<int64_t>{1}}})),
            "ReduceMean: output is f32[2] but the inputs give f32[2, 1]");
  EXPECT_EQ(prepareError("ReduceSum", {x, operand<int64_t>({1}, {1})}, {output(DType::kF32, {2, 1})}),
            "ReduceSum: axes must be a constant");
  EXPECT_EQ(prepareError("ReduceMean", {operand<int64_t>({2}, {1, 2})}, {output(DType::kI64, {1})}),
            "ReduceMean: no kernel for i64 inputs (supports f32, f64)");
  EXPECT_EQ(prepareError("ReduceSum", {operand<uint8_t>({2}, {1, 2})}, {output(DType::kU8, {1})}),
            "ReduceSum: no kernel for u8 inputs (supports f32, f64, i32, i64)");
}

// ----------------------------------------------------------- ArgMax, ArgMin

template <typename T>
void checkArg(bool is_max, const Shape& shape, int64_t axis, bool keepdims, bool last, uint32_t seed) {
  const size_t rank = shape.size();
  const size_t ax = static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(rank) : axis);
  // Few distinct values, so that ties are common.
  const std::vector<T> x = randomValues<T>(elementCount(shape), seed, -3, 3);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < ax; ++d) outer *= shape[d];
  for (size_t d = ax + 1; d < rank; ++d) inner *= shape[d];
  const int64_t dim = shape[ax];
  std::vector<int64_t> want;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t k = 0; k < inner; ++k) {
      int64_t best = 0;
      for (int64_t r = 1; r < dim; ++r) {
        const T v = x[static_cast<size_t>((o * dim + r) * inner + k)];
        const T b = x[static_cast<size_t>((o * dim + best) * inner + k)];
        const bool better = is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b);
        if (better) best = r;
      }
      want.push_back(best);
    }
  }
  Shape out;
  for (size_t d = 0; d < rank; ++d) {
    if (d != ax) out.push_back(shape[d]);
    else if (keepdims) out.push_back(1);
  }
  std::vector<Operand> inputs = {operand(shape, x)};
  std::vector<Operand> outputs = {output(DType::kI64, out)};
  PreparedKernel(is_max ? "ArgMax" : "ArgMin", inputs, outputs,
                 params({{"axis", axis}, {"keepdims", int64_t{keepdims}}, {"select_last_index", int64_t{last}}}))
      .run(inputs, outputs);
  EXPECT_EQ(outputs[0].values<int64_t>(), want)
      << (is_max ? "ArgMax" : "ArgMin") << " shape " << ::testing::PrintToString(shape) << " axis " << axis
      << " keepdims " << keepdims << " last " << last;
}

TEST(ArgKernels, MatchReference) {
  const std::vector<std::pair<Shape, int64_t>> cases = {{{9}, 0},       {{3, 7}, 1},      {{3, 7}, 0},
                                                        {{2, 5, 4}, 1}, {{2, 5, 4}, -1},  {{4, 1, 3}, 1},
                                                        {{2, 3, 4, 5}, 2}};
  uint32_t seed = 100;
  for (bool is_max : {true, false}) {
    for (const auto& [shape, axis] : cases) {
      for (bool keepdims : {true, false}) {
        for (bool last : {false, true}) {
          checkArg<float>(is_max, shape, axis, keepdims, last, seed++);
          checkArg<int64_t>(is_max, shape, axis, keepdims, last, seed++);
          checkArg<int32_t>(is_max, shape, axis, keepdims, last, seed++);
        }
      }
    }
  }
}

// An empty tensor whose other dimensions are vast: nothing to write, at once
// (the loop once walked the 2^40 outer rows of an empty inner dimension;
// found by graph_run_fuzz).
TEST(ArgKernels, EmptyTensorWithVastDimensionsReturnsAtOnce) {
  const int64_t vast = int64_t{1} << 40;
  for (const bool is_max : {true, false}) {
    std::vector<Operand> inputs = {operand<float>({vast, 3, 0}, {})};
    std::vector<Operand> outputs = {output(DType::kI64, {vast, 0})};
    PreparedKernel(is_max ? "ArgMax" : "ArgMin", inputs, outputs, params({{"axis", int64_t{1}}, {"keepdims", int64_t{0}}}))
        .run(inputs, outputs);
    EXPECT_TRUE(outputs[0].values<int64_t>().empty());
  }
}

TEST(ArgKernels, PrepareErrors) {
  Operand x = operand<float>({2, 3}, std::vector<float>(6, 1.0f));
  EXPECT_EQ(prepareError("ArgMax", {x}, {output(DType::kI64, {1, 3})}, params({{"axis", int64_t{2}}})),
            "ArgMax: axis 2 is out of range for rank 2");
  EXPECT_EQ(prepareError("ArgMin", {x}, {output(DType::kF32, {1, 3})}),
            "ArgMin: output is f32[1, 3] but the inputs give i64[1, 3]");
  EXPECT_EQ(prepareError("ArgMax", {operand<uint8_t>({2}, {1, 2})}, {output(DType::kI64, {1})}),
            "ArgMax: no kernel for u8 inputs (supports f32, f64, i32, i64)");
}

// -------------------------------------------------------------- allocations

TEST(ReductionAllocations, RunsDoNotAllocate) {
  struct Case {
    std::string op;
    Shape shape;
    std::vector<int64_t> axes;
    Shape out;
  };
  const std::vector<Case> cases = {{"ReduceMean", {8, 16, 37}, {2}, {8, 16, 1}},
                                   {"ReduceMean", {8, 16, 37}, {0, 2}, {1, 16, 1}},
                                   {"ReduceMax", {8, 16, 37}, {1}, {8, 1, 37}}};
  for (const Case& c : cases) {
    std::vector<Operand> inputs = {operand(c.shape, randomValues<float>(elementCount(c.shape), 1, -1, 1))};
    std::vector<Operand> outputs = {output(DType::kF32, c.out)};
    const PreparedKernel kernel(c.op, inputs, outputs, params({{"axes", c.axes}}));
    const auto bound = kernel.bind(inputs, outputs);
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

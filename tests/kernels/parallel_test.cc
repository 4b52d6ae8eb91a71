// Kernels split large calls across OpenMP's threads (src/kernels/cpu/
// parallel.h). Split or not, every output element is computed the same way,
// so a call on three threads must give exactly the bytes of the same call on
// one; and once the pool has warmed up, a split call must not allocate.
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kernels/kernel.h"
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
using ::kiln::testing::randomValues;
using Ints = std::vector<int64_t>;

// Three threads split ranges at thirds, which fall inside rows.
constexpr int kThreads = 3;

// Runs with `threads` OpenMP threads for the scope.
class ScopedThreads {
 public:
  explicit ScopedThreads([[maybe_unused]] int threads) {
#if defined(_OPENMP)
    saved_ = omp_get_max_threads();
    omp_set_num_threads(threads);
#endif
  }
  ~ScopedThreads() {
#if defined(_OPENMP)
    omp_set_num_threads(saved_);
#endif
  }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_ = 1;
};

struct Case {
  std::string name;
  std::string op;
  std::vector<Operand> inputs;
  std::vector<Operand> outputs;
  ParamMap params;
};

Operand floats(const Ints& shape, uint32_t seed, double lo = -3, double hi = 3) {
  return operand(shape, randomValues<float>(elementCount(shape), seed, lo, hi));
}

// kiln.FusedElementwise's parameters (core/elementwise_program.h).
ParamMap fusedProgram(const std::string& ops, const Ints& operands, const std::vector<double>& immediates = {}) {
  const size_t count = operands.size() / 2;
  ParamMap map = params({{"ops", ops}, {"operands", operands}, {"alpha", std::vector<double>(count, 0.0)},
                         {"beta", std::vector<double>(count, 0.0)}});
  if (!immediates.empty()) map.set("immediates", immediates);
  return map;
}

// A fused chain of `links` (Tanh, Mul by input 1) pairs over input 0.
ParamMap fusedChain(int links) {
  std::string ops;
  Ints operands;
  int64_t h = 0;
  for (int i = 0; i < links; ++i) {
    ops += i == 0 ? "Tanh,Mul" : ",Tanh,Mul";
    const int64_t tanh = 2 + 2 * i;
    operands.insert(operands.end(), {h, -1, tanh, 1});
    h = tanh + 1;
  }
  return fusedProgram(ops, operands);
}

// Calls of 64K elements or more (above the 32K bound of parallel.h) of every
// kernel that splits its work (for a fused program, elements times
// instructions).
std::vector<Case> largeCases() {
  std::vector<Case> cases;
  cases.push_back({"Add, a row broadcast", "Add", {floats({300, 517}, 1), floats({517}, 2)},
                   {output(DType::kF32, {300, 517})}, {}});
  cases.push_back({"Mul, per channel", "Mul", {floats({2, 64, 33, 37}, 3), floats({64, 1, 1}, 4)},
                   {output(DType::kF32, {2, 64, 33, 37})}, {}});
  cases.push_back({"Max of three", "Max", {floats({200, 400}, 5), floats({400}, 6), floats({200, 1}, 7)},
                   {output(DType::kF32, {200, 400})}, {}});
  cases.push_back({"Less, to bool", "Less", {floats({300, 517}, 8), floats({}, 9)},
                   {output(DType::kBool, {300, 517})}, {}});
  cases.push_back({"Div, f64", "Div",
                   {operand<double>({70001}, randomValues<double>(70001, 10, -3, 3)),
                    operand<double>({70001}, randomValues<double>(70001, 11, 1, 3))},
                   {output(DType::kF64, {70001})}, {}});
  cases.push_back({"Erf", "Erf", {floats({100003}, 12)}, {output(DType::kF32, {100003})}, {}});
  cases.push_back({"Gelu", "Gelu", {floats({70001}, 13)}, {output(DType::kF32, {70001})}, {}});
  cases.push_back({"Relu, f64", "Relu", {operand<double>({80001}, randomValues<double>(80001, 14, -3, 3))},
                   {output(DType::kF64, {80001})}, {}});
  cases.push_back({"Abs, i32", "Abs", {operand<int32_t>({80001}, randomValues<int32_t>(80001, 15, -99, 99))},
                   {output(DType::kI32, {80001})}, {}});
  cases.push_back({"Clip", "Clip", {floats({100001}, 16), operand<float>({}, {-1.0f}), operand<float>({}, {1.5f})},
                   {output(DType::kF32, {100001})}, {}});
  cases.push_back({"Softmax, rows", "Softmax", {floats({512, 200}, 17)}, {output(DType::kF32, {512, 200})}, {}});
  cases.push_back({"LogSoftmax, columns", "LogSoftmax", {floats({3, 50, 700}, 18)},
                   {output(DType::kF32, {3, 50, 700})}, params({{"axis", int64_t{1}}})});
  cases.push_back({"LayerNormalization", "LayerNormalization", {floats({256, 384}, 19), floats({384}, 20),
                                                                floats({384}, 21)},
                   {output(DType::kF32, {256, 384}), output(DType::kF32, {256, 1}), output(DType::kF32, {256, 1})},
                   {}});
  cases.push_back({"BatchNormalization", "BatchNormalization",
                   {floats({2, 32, 40, 40}, 22), floats({32}, 23), floats({32}, 24), floats({32}, 25),
                    floats({32}, 26, 0.5, 2)},
                   {output(DType::kF32, {2, 32, 40, 40})}, {}});
  cases.push_back({"ReduceMean, last axis", "ReduceMean", {floats({512, 256}, 27)}, {output(DType::kF32, {512, 1})},
                   params({{"axes", Ints{1}}})});
  cases.push_back({"ReduceMax, first axis", "ReduceMax", {floats({512, 256}, 28)}, {output(DType::kF32, {1, 256})},
                   params({{"axes", Ints{0}}})});
  // (x + b) * sigmoid(x + b); then (x - mean) * 0.5 per channel; then 20
  // ops on 4,480 elements.
  cases.push_back({"FusedElementwise, a row broadcast", "kiln.FusedElementwise", {floats({300, 517}, 29),
                                                                                   floats({517}, 30)},
                   {output(DType::kF32, {300, 517})}, fusedProgram("Add,Sigmoid,Mul", {0, 1, 2, -1, 2, 3})});
  cases.push_back({"FusedElementwise, per channel", "kiln.FusedElementwise",
                   {floats({2, 64, 33, 37}, 31), floats({64, 1, 1}, 32)}, {output(DType::kF32, {2, 64, 33, 37})},
                   fusedProgram("Sub,Mul", {0, 1, 3, 2}, {0.5})});
  cases.push_back({"FusedElementwise, a long chain", "kiln.FusedElementwise", {floats({64, 70}, 33), floats({70}, 34)},
                   {output(DType::kF32, {64, 70})}, fusedChain(10)});
  return cases;
}

std::vector<std::byte> runOn(int threads, Case c) {
  const ScopedThreads scoped(threads);
  const PreparedKernel kernel(c.op, c.inputs, c.outputs, c.params);
  kernel.run(c.inputs, c.outputs);
  std::vector<std::byte> bytes;
  for (const Operand& out : c.outputs) bytes.insert(bytes.end(), out.bytes.begin(), out.bytes.end());
  return bytes;
}

TEST(ParallelKernels, SplitCallsGiveTheBytesOfOneThread) {
#if !defined(_OPENMP)
  GTEST_SKIP() << "built without OpenMP: kernels run on the calling thread";
#endif
  for (const Case& c : largeCases()) EXPECT_TRUE(runOn(1, c) == runOn(kThreads, c)) << c.name;
}

TEST(ParallelKernels, SplitCallsDoNotAllocateAfterWarmUp) {
#if !defined(_OPENMP)
  GTEST_SKIP() << "built without OpenMP: kernels run on the calling thread";
#endif
  const ScopedThreads scoped(kThreads);
  std::vector<Case> cases = largeCases();
  std::vector<std::unique_ptr<PreparedKernel>> kernels;
  std::vector<std::unique_ptr<PreparedKernel::Call>> calls;
  for (Case& c : cases) {
    kernels.push_back(std::make_unique<PreparedKernel>(c.op, c.inputs, c.outputs, c.params));
    calls.push_back(kernels.back()->bind(c.inputs, c.outputs));
    kernels.back()->run(calls.back()->call);  // warm-up: the pool starts its threads
  }
  // Each kernel on its own, then all of them in turn (teams reused across
  // kernels as well).
  for (size_t k = 0; k < cases.size(); ++k) {
    ::kiln::testing::startCountingAllocations();
    for (int i = 0; i < 20; ++i) kernels[k]->run(calls[k]->call);
    const ::kiln::testing::AllocationCount count = ::kiln::testing::stopCountingAllocations();
    EXPECT_EQ(count.news, 0u) << cases[k].name;
    EXPECT_EQ(count.mallocs, 0u) << cases[k].name;
  }
  ::kiln::testing::startCountingAllocations();
  for (int i = 0; i < 5; ++i) {
    for (size_t k = 0; k < cases.size(); ++k) kernels[k]->run(calls[k]->call);
  }
  const ::kiln::testing::AllocationCount count = ::kiln::testing::stopCountingAllocations();
  EXPECT_EQ(count.news, 0u) << "all kernels in turn";
  EXPECT_EQ(count.mallocs, 0u) << "all kernels in turn";
  if (!::kiln::testing::countsMallocs()) std::cout << "[ note     ] malloc not counted in this build\n";
}

}  // namespace
}  // namespace kiln

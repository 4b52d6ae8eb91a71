// Control flow end to end: a Loop of 10,000 iterations runs in the arena
// planned at compile time, with no heap allocation per iteration (or per
// call), and gives the value a plain C++ loop computes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "kiln/compiler.h"
#include "kiln/executor.h"
#include "tests/support/allocation_counter.h"

namespace kiln {
namespace {

template <typename T>
ConstantPtr scalarConstant(T value, DType dtype) {
  std::vector<std::byte> bytes(sizeof(T));
  std::memcpy(bytes.data(), &value, sizeof(T));
  return makeConstant(TensorInfo{dtype, {}}, std::move(bytes));
}

// Loop(M, "", v0) with body: v_out = v_in * 0.5 + x (x captured).
std::filesystem::path compileLoop(int64_t iterations) {
  auto body = std::make_shared<Graph>("body");
  body->addInput("i", ValueType::tensor(DType::kI64, {}));
  const ValueId cond_in = body->addInput("cond_in", ValueType::tensor(DType::kBool, {}));
  const ValueId v_in = body->addInput("v_in", ValueType::tensor(DType::kF32, {4}));
  const ValueId x = body->addOuterScopeValue("x");
  const ValueId half = body->addInitializer("half", scalarConstant(0.5f, DType::kF32));
  const ValueId scaled = body->node(body->addNode("Mul", {v_in, half}, {"scaled"})).outputs[0];
  const ValueId v_out = body->node(body->addNode("Add", {scaled, x}, {"v_out"})).outputs[0];
  const ValueId cond_out = body->node(body->addNode("Identity", {cond_in}, {"cond_out"})).outputs[0];
  body->addOutput(cond_out);
  body->addOutput(v_out);

  Graph graph;
  const ValueId x_input = graph.addInput("x", ValueType::tensor(DType::kF32, {4}));
  const ValueId v0 = graph.addInput("v0", ValueType::tensor(DType::kF32, {4}));
  const ValueId m = graph.addInitializer("M", scalarConstant(iterations, DType::kI64));
  (void)x_input;
  const NodeId loop = graph.addNode("Loop", {m, kNoValue, v0}, {"v"}, {{"body", GraphPtr(body)}});
  graph.addOutput(graph.node(loop).outputs[0]);
  const auto path = std::filesystem::temp_directory_path() / ("kiln_loop_" + std::to_string(::getpid()) + ".kiln");
  compile(graph, {{"", 17}}, path);
  return path;
}

TEST(ControlFlow, TenThousandIterationsWithoutAllocating) {
  constexpr int64_t kIterations = 10000;
  const auto path = compileLoop(kIterations);
  Executor executor(path);
  std::filesystem::remove(path);  // mapped: the executor keeps what it needs
  const std::vector<float> x{1, -2, 0.5f, 4};
  const std::vector<float> v0{8, 8, -8, 0};
  std::vector<float> v(4);
  const std::byte* in[] = {reinterpret_cast<const std::byte*>(x.data()), reinterpret_cast<const std::byte*>(v0.data())};
  std::byte* out[] = {reinterpret_cast<std::byte*>(v.data())};
  executor.run(in, out);  // warm-up
  const uint64_t steps_before = executor.stepsRun();
  testing::startCountingAllocations();
  executor.run(in, out);
  const testing::AllocationCount count = testing::stopCountingAllocations();
  EXPECT_EQ(count.news, 0u);
  EXPECT_EQ(count.mallocs, 0u);
  // The body's steps ran once per iteration.
  EXPECT_GE(executor.stepsRun() - steps_before, static_cast<uint64_t>(kIterations));
  for (size_t k = 0; k < 4; ++k) {
    float expected = v0[k];
    for (int64_t i = 0; i < kIterations; ++i) expected = expected * 0.5f + x[k];
    EXPECT_FLOAT_EQ(v[k], expected) << k;
  }
}

TEST(ControlFlow, ZeroIterationsGiveTheInitialValues) {
  const auto path = compileLoop(0);
  Executor executor(path);
  std::filesystem::remove(path);
  const std::vector<float> x{1, 2, 3, 4};
  const std::vector<float> v0{5, 6, 7, 8};
  std::vector<float> v(4);
  const std::byte* in[] = {reinterpret_cast<const std::byte*>(x.data()), reinterpret_cast<const std::byte*>(v0.data())};
  std::byte* out[] = {reinterpret_cast<std::byte*>(v.data())};
  executor.run(in, out);
  EXPECT_EQ(v, v0);
}

}  // namespace
}  // namespace kiln

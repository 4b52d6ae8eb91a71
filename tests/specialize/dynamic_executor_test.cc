// DynamicExecutor: graph packages compiled per input signature, the plan
// cache, the shared arena, shape inputs, and no allocation on a cache hit.
#include "kiln/dynamic_executor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "kiln/compiler.h"
#include "kiln/error.h"
#include "kiln/executor.h"
#include "tests/support/allocation_counter.h"

namespace kiln {
namespace {

ValueType f32(std::vector<Dim> dims) { return ValueType{DType::kF32, std::move(dims)}; }

class DynamicExecutorTest : public ::testing::Test {
 protected:
  std::filesystem::path path(const std::string& name) {
    return std::filesystem::temp_directory_path() /
           ("kiln_dynamic_" + std::to_string(::getpid()) + "_" + name + ".kiln");
  }
  void TearDown() override {
    for (const auto& p : written_) std::filesystem::remove(p);
  }
  std::filesystem::path compileGraph(Graph& graph, const std::string& name) {
    const auto p = path(name);
    written_.push_back(p);
    const CompileReport report = compile(graph, {{"", 17}}, p);
    EXPECT_TRUE(report.runtime_shapes);
    return p;
  }
  std::vector<std::filesystem::path> written_;
};

// y = Relu(x + x) * 0.5 over x[batch, seq]: kiln's own kernels only.
void buildElementwiseModel(Graph& graph) {
  const ValueId x = graph.addInput("x", f32({Dim::symbolic("batch"), Dim::symbolic("seq")}));
  const ValueId sum = graph.node(graph.addNode("Add", {x, x}, {"sum"})).outputs[0];
  const ValueId relu = graph.node(graph.addNode("Relu", {sum}, {"relu"})).outputs[0];
  std::vector<std::byte> half(4);
  const float h = 0.5f;
  std::memcpy(half.data(), &h, 4);
  const ValueId c = graph.addInitializer("half", makeConstant(TensorInfo{DType::kF32, {}}, half));
  graph.addOutput(graph.node(graph.addNode("Mul", {relu, c}, {"y"})).outputs[0]);
}

TEST_F(DynamicExecutorTest, RunsEverySignatureAndCachesPlans) {
  Graph graph;
  buildElementwiseModel(graph);
  const auto package = compileGraph(graph, "elementwise");
  EXPECT_THROW(Executor{package}, UsageError);  // static executor: clear error
  DynamicExecutor executor(package, "", DynamicExecutorOptions{.plan_cache_capacity = 2});
  ASSERT_EQ(executor.inputs().size(), 1u);
  EXPECT_EQ(executor.inputs()[0].info.shape, (std::vector<int64_t>{kDynamicDim, kDynamicDim}));
  uint64_t largest_arena = 0;
  for (const auto& [batch, seq] : std::vector<std::pair<int64_t, int64_t>>{{1, 16}, {7, 128}, {32, 384}, {1, 16}}) {
    const TensorInfo info{DType::kF32, {batch, seq}};
    std::vector<float> x(static_cast<size_t>(batch * seq)), y(x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
    const std::byte* in[] = {reinterpret_cast<const std::byte*>(x.data())};
    std::byte* out[] = {reinterpret_cast<std::byte*>(y.data())};
    const auto& outputs = executor.outputsFor({&info, 1}, in);
    ASSERT_EQ(outputs[0].info.shape, info.shape);
    executor.run({&info, 1}, in, out);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], std::max(0.0f, x[i])) << i;
    largest_arena = std::max(largest_arena, executor.memoryStats().arena_bytes);
    EXPECT_GE(executor.memoryStats().arena_bytes, largest_arena);  // never shrinks by itself
  }
  const DynamicMemoryStats stats = executor.memoryStats();
  // Each new signature compiles once (outputsFor and run share the plan);
  // {1, 16} was evicted by the capacity of 2 and compiled again.
  EXPECT_EQ(stats.plan_cache_misses, 4u);
  EXPECT_EQ(stats.plan_cache_evictions, 2u);
  EXPECT_EQ(stats.cached_plans, 2u);
  EXPECT_EQ(stats.plan_cache_hits, 0u);  // every run compiled its plan
  const TensorInfo again{DType::kF32, {1, 16}};
  std::vector<float> x(16, 2.0f), y(16);
  const std::byte* in[] = {reinterpret_cast<const std::byte*>(x.data())};
  std::byte* out[] = {reinterpret_cast<std::byte*>(y.data())};
  executor.run({&again, 1}, in, out);
  EXPECT_EQ(executor.memoryStats().plan_cache_hits, 1u);
  EXPECT_EQ(executor.memoryStats().plan_cache_misses, 4u);
  EXPECT_EQ(y[0], 2.0f);
  executor.shrink();
  EXPECT_EQ(executor.memoryStats().arena_bytes, 0u);
  EXPECT_EQ(executor.memoryStats().cached_plans, 0u);
}

TEST_F(DynamicExecutorTest, NoAllocationOnACacheHit) {
  Graph graph;
  buildElementwiseModel(graph);
  DynamicExecutor executor(compileGraph(graph, "hit"));
  const TensorInfo info{DType::kF32, {3, 50}};
  std::vector<float> x(150, 1.0f), y(150);
  const std::byte* in[] = {reinterpret_cast<const std::byte*>(x.data())};
  std::byte* out[] = {reinterpret_cast<std::byte*>(y.data())};
  executor.run({&info, 1}, in, out);  // compiles
  testing::startCountingAllocations();
  executor.run({&info, 1}, in, out);
  const testing::AllocationCount count = testing::stopCountingAllocations();
  EXPECT_EQ(count.news, 0u);
  EXPECT_EQ(count.mallocs, 0u);
  EXPECT_EQ(y[0], 1.0f);
}

TEST_F(DynamicExecutorTest, ShapeInputValuesArePartOfTheSignature) {
  // y = Reshape(x[6], shape) with `shape` a model input.
  Graph graph;
  const ValueId x = graph.addInput("x", ValueType::tensor(DType::kF32, {6}));
  const ValueId shape = graph.addInput("shape", ValueType::tensor(DType::kI64, {2}));
  const ValueId reshaped = graph.node(graph.addNode("Reshape", {x, shape}, {"r"})).outputs[0];
  graph.addOutput(graph.node(graph.addNode("Relu", {reshaped}, {"y"})).outputs[0]);
  DynamicExecutor executor(compileGraph(graph, "reshape"));
  EXPECT_EQ(executor.shapeInputs(), std::vector<std::string>{"shape"});
  const TensorInfo infos[] = {{DType::kF32, {6}}, {DType::kI64, {2}}};
  std::vector<float> data{-1, 2, -3, 4, -5, 6};
  for (const auto& target : std::vector<std::vector<int64_t>>{{2, 3}, {3, 2}, {-1, 1}}) {
    const std::byte* in[] = {reinterpret_cast<const std::byte*>(data.data()),
                             reinterpret_cast<const std::byte*>(target.data())};
    const auto& outputs = executor.outputsFor(infos, in);
    const std::vector<int64_t> expected = target[0] == -1 ? std::vector<int64_t>{6, 1} : target;
    EXPECT_EQ(outputs[0].info.shape, expected);
    std::vector<float> y(6);
    std::byte* out[] = {reinterpret_cast<std::byte*>(y.data())};
    executor.run(infos, in, out);
    EXPECT_EQ(y, (std::vector<float>{0, 2, 0, 4, 0, 6}));
  }
  EXPECT_EQ(executor.memoryStats().plan_cache_misses, 3u);
  // A target that does not fit is a clear error naming the signature.
  const std::vector<int64_t> bad{4, 4};
  const std::byte* in[] = {reinterpret_cast<const std::byte*>(data.data()), reinterpret_cast<const std::byte*>(bad.data())};
  try {
    executor.outputsFor(infos, in);
    FAIL() << "expected an error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot run model"), std::string::npos) << e.what();
  }
}

TEST_F(DynamicExecutorTest, WrongInputsAreClearErrors) {
  Graph graph;
  buildElementwiseModel(graph);
  DynamicExecutor executor(compileGraph(graph, "errors"));
  std::vector<float> x(8);
  const std::byte* in[] = {reinterpret_cast<const std::byte*>(x.data())};
  const TensorInfo wrong_rank{DType::kF32, {8}};
  EXPECT_THROW(executor.outputsFor({&wrong_rank, 1}, in), UsageError);
  const TensorInfo wrong_dtype{DType::kI32, {2, 4}};
  EXPECT_THROW(executor.outputsFor({&wrong_dtype, 1}, in), UsageError);
  EXPECT_THROW(executor.outputsFor({}, {}), UsageError);
  EXPECT_EQ(executor.memoryStats().plan_cache_misses, 0u);  // nothing compiled
}

TEST_F(DynamicExecutorTest, StaticPackagesAreRefused) {
  Graph graph;
  const ValueId x = graph.addInput("x", ValueType::tensor(DType::kF32, {2}));
  graph.addOutput(graph.node(graph.addNode("Relu", {x}, {"y"})).outputs[0]);
  const auto p = path("static");
  written_.push_back(p);
  EXPECT_FALSE(compile(graph, {{"", 17}}, p).runtime_shapes);
  EXPECT_THROW(DynamicExecutor{p}, UsageError);
}

// y = x[:count] + x[:count], count = the number of positive elements of x
// [100]: a shape that depends on a value the model computes. It runs in two
// stages; outputsFor cannot answer before running; a repeated call (same
// count) allocates nothing.
TEST_F(DynamicExecutorTest, ShapesComputedFromValuesRunInStages) {
  Graph graph;
  const ValueId x = graph.addInput("x", ValueType::tensor(DType::kF32, {100}));
  auto constant = [&](const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data, size_t bytes) {
    std::vector<std::byte> copy(bytes);
    std::memcpy(copy.data(), data, bytes);
    return graph.addInitializer(name, makeConstant(TensorInfo{dtype, std::move(shape)}, std::move(copy)));
  };
  const float zero_value = 0;
  const int64_t axis_value = 0;
  const ValueId zero = constant("zero", DType::kF32, {}, &zero_value, 4);
  const ValueId axes = constant("axes", DType::kI64, {1}, &axis_value, 8);
  const ValueId start = constant("start", DType::kI64, {1}, &axis_value, 8);
  const ValueId positive = graph.node(graph.addNode("Greater", {x, zero}, {"positive"})).outputs[0];
  const ValueId ones = graph.node(graph.addNode("Cast", {positive}, {"ones"}, Attributes{{"to", int64_t{7}}})).outputs[0];
  const ValueId count = graph.node(graph.addNode("ReduceSum", {ones, axes}, {"count"})).outputs[0];
  const ValueId head = graph.node(graph.addNode("Slice", {x, start, count}, {"head"})).outputs[0];
  graph.addOutput(graph.node(graph.addNode("Add", {head, head}, {"y"})).outputs[0]);
  const auto package = compileGraph(graph, "staged");
  DynamicExecutor executor(package);

  std::vector<float> values(100);
  for (size_t i = 0; i < values.size(); ++i) values[i] = i % 3 == 0 ? 1.0f + static_cast<float>(i) : -1.0f;
  const TensorInfo info{DType::kF32, {100}};
  const std::byte* in[] = {reinterpret_cast<const std::byte*>(values.data())};
  try {
    executor.outputsFor({&info, 1}, in);
    ADD_FAILURE() << "outputsFor answered for a staged model";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("depend on values it computes"), std::string::npos) << e.what();
  }
  std::vector<float> y(100, -7.0f);
  TensorInfo given;
  const OutputAllocator allocate = [&](size_t index, const TensorInfo& shape) {
    EXPECT_EQ(index, 0u);
    given = shape;
    return reinterpret_cast<std::byte*>(y.data());
  };
  executor.run({&info, 1}, in, allocate);
  EXPECT_EQ(given, (TensorInfo{DType::kF32, {34}}));  // i = 0, 3, ..., 99
  for (size_t i = 0; i < 34; ++i) EXPECT_EQ(y[i], 2 * values[i]) << i;
  testing::startCountingAllocations();
  executor.run({&info, 1}, in, allocate);
  const testing::AllocationCount allocations = testing::stopCountingAllocations();
  EXPECT_EQ(allocations.news, 0u);
  EXPECT_EQ(allocations.mallocs, 0u);
}

}  // namespace
}  // namespace kiln

// Plugin ops end to end: the example library's ops (examples/plugins)
// compiled into packages and run by the Executor, the ModelRunner on cpu and
// sim, and the DynamicExecutor, against plain C++ references; and what the
// ops' metadata changes in the compiler (in-place aliasing, merging and
// folding only when stateless, elementwise slices across threads).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <dlfcn.h>
#include <random>

#include "format/executable_spec.h"
#include "kernels/evaluate_once.h"
#include "kiln/compiler.h"
#include "kiln/dynamic_executor.h"
#include "kiln/executor.h"
#include "kiln/model_runner.h"
#include "kiln/package_reader.h"
#include "kiln/plugins.h"
#include "tests/runtime/runtime_test_models.h"
#include "tests/support/allocation_counter.h"

namespace kiln {
namespace {

using testing::TempPackage;

const std::string kTestPlugin = std::string(KILN_TEST_PLUGIN_DIR) + "/libkiln_test_plugin.so";

std::vector<float> randomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void expectNear(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5f * std::max(1.0f, std::abs(want[i]))) << "element " << i;
  }
}

CompileOptions withFolding() {
  CompileOptions options;
  options.evaluate_kernel = &evaluateOnce;
  return options;
}

const std::map<std::string, int64_t> kOpsets = {{"", 17}, {"com.example", 1}, {"com.test", 1}};

ExecutableSpec specOf(const std::filesystem::path& package) {
  const PackageReader reader(package);
  return decodeExecutable(reader.findExecutable(reader.metadata().front()->metadata().executable)->read(), "test");
}

class PluginTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    loadPlugin(KILN_EXAMPLE_PLUGIN);
    loadPlugin(kTestPlugin);
  }
};

// The example model: (relu(x') + y') @ w, with (x', y') = Rotate(x, y, a),
// the sum in place over relu(x'), and the product serialized in 4 slices.
constexpr int64_t kRows = 4, kCols = 8, kOut = 6;

void writeExampleModel(const std::filesystem::path& path, int64_t rows = kRows) {
  Graph g;
  const auto f32 = [&](std::vector<int64_t> dims) { return ValueType::tensor(DType::kF32, dims); };
  const ValueId x = g.addInput("x", f32({rows, kCols}));
  const ValueId y = g.addInput("y", f32({rows, kCols}));
  const ValueId a = g.addInput("a", f32({rows, kCols}));
  const ValueId w = g.addInput("w", f32({kCols, kOut}));
  const Node& rotate = g.node(g.addNode("Rotate", {x, y, a}, {"xr", "yr"}, {}, "com.example"));
  const ValueId xr = rotate.outputs[0], yr = rotate.outputs[1];
  const ValueId relu = g.node(g.addNode("Relu", {xr}, {"relu"})).outputs[0];
  const ValueId sum = g.node(g.addNode("AddInPlace", {relu, yr}, {"sum"}, {}, "com.example")).outputs[0];
  const ValueId out = g.node(g.addNode("SerializedMatMul", {sum, w}, {"out"},
                                       {{"serialization_factor", int64_t{4}}}, "com.example"))
                          .outputs[0];
  g.addOutput(out);
  g.addOutput(yr);
  compile(g, kOpsets, path, withFolding());
}

struct ExampleData {
  std::vector<float> x, y, a, w, out, yr;
};

ExampleData exampleData(int64_t rows, uint32_t seed) {
  ExampleData d{randomFloats(rows * kCols, seed), randomFloats(rows * kCols, seed + 1),
                randomFloats(rows * kCols, seed + 2), randomFloats(kCols * kOut, seed + 3), {}, {}};
  std::vector<float> sum(d.x.size());
  d.yr.resize(d.x.size());
  for (size_t i = 0; i < d.x.size(); ++i) {
    const float c = std::cos(d.a[i]), s = std::sin(d.a[i]);
    const float xr = d.x[i] * c - d.y[i] * s;
    d.yr[i] = d.x[i] * s + d.y[i] * c;
    sum[i] = std::max(xr, 0.0f) + d.yr[i];
  }
  d.out.assign(static_cast<size_t>(rows * kOut), 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t k = 0; k < kCols; ++k) {
      for (int64_t j = 0; j < kOut; ++j) d.out[i * kOut + j] += sum[i * kCols + k] * d.w[k * kOut + j];
    }
  }
  return d;
}

// The example model's operands for `d`: output memory and the pointer
// arrays Executor::run takes.
struct ExampleCall {
  explicit ExampleCall(const ExampleData& d)
      : out(d.out.size()),
        yr(d.yr.size()),
        inputs{reinterpret_cast<const std::byte*>(d.x.data()), reinterpret_cast<const std::byte*>(d.y.data()),
               reinterpret_cast<const std::byte*>(d.a.data()), reinterpret_cast<const std::byte*>(d.w.data())},
        outputs{reinterpret_cast<std::byte*>(out.data()), reinterpret_cast<std::byte*>(yr.data())} {}
  void run(Executor& executor) { executor.run(inputs, outputs); }

  std::vector<float> out, yr;
  const std::byte* inputs[4];
  std::byte* outputs[2];
};

TEST_F(PluginTest, LoadingListsTheOpsAndIsIdempotent) {
  const LoadedPlugin plugin = loadPlugin(KILN_EXAMPLE_PLUGIN);
  EXPECT_EQ(plugin.name, "libkiln_example_ops.so");
  EXPECT_EQ(plugin.api_level, 1u);
  EXPECT_EQ(plugin.hash.size(), 16u);
  EXPECT_EQ(plugin.ops, (std::vector<std::string>{"com.example.Rotate", "com.example.AddInPlace",
                                                  "com.example.SerializedMatMul", "com.example.Swish"}));
  EXPECT_EQ(loadPlugin(KILN_EXAMPLE_PLUGIN).hash, plugin.hash);
}

TEST_F(PluginTest, ExampleOpsRunOnTheExecutorAndThePackageRecordsTheLibrary) {
  TempPackage package("plugins");
  writeExampleModel(package.path());
  const PackageReader reader(package.path());
  const auto& options = reader.metadata().front()->metadata().options;
  ASSERT_TRUE(options.contains("plugin.libkiln_example_ops.so"));
  EXPECT_EQ(options.at("plugin.libkiln_example_ops.so"), "level=1;hash=" + loadPlugin(KILN_EXAMPLE_PLUGIN).hash);
  EXPECT_FALSE(options.contains("plugin.libkiln_test_plugin.so"));  // loaded, but the model does not use it

  const ExampleData d = exampleData(kRows, 1);
  Executor executor(package.path());
  ExampleCall call(d);
  for (int i = 0; i < 3; ++i) {
    call.run(executor);
    expectNear(call.out, d.out);
    expectNear(call.yr, d.yr);
  }
}

TEST_F(PluginTest, ExampleOpsRunThroughTheModelRunnerOnCpuAndSim) {
  TempPackage package("plugins_runner");
  writeExampleModel(package.path());
  DeviceManager manager(testing::simOptions(1));
  for (const DeviceKind kind : {DeviceKind::kCpu, DeviceKind::kSim}) {
    ModelRunnerConfig config;
    config.device_kind = kind;
    config.device_manager = &manager;
    ModelRunner runner(package.path(), config);
    for (uint32_t seed = 10; seed < 14; ++seed) {
      const ExampleData d = exampleData(kRows, seed);
      const auto view = [](const std::vector<float>& v) {
        return ConstTensorMemoryView{v.data(), v.size() * sizeof(float), DType::kF32};
      };
      const OutputTensors result =
          runner.execute({{"x", view(d.x)}, {"y", view(d.y)}, {"a", view(d.a)}, {"w", view(d.w)}});
      std::vector<float> out(d.out.size()), yr(d.yr.size());
      std::memcpy(out.data(), result.at("out").bytes.data(), out.size() * sizeof(float));
      std::memcpy(yr.data(), result.at("yr").bytes.data(), yr.size() * sizeof(float));
      expectNear(out, d.out);
      expectNear(yr, d.yr);
    }
  }
}

TEST_F(PluginTest, ExampleOpsRunWithRunTimeShapes) {
  TempPackage package("plugins_dynamic");
  writeExampleModel(package.path(), kDynamicDim);
  const PackageReader reader(package.path());
  EXPECT_TRUE(reader.metadata().front()->metadata().options.contains("plugin.libkiln_example_ops.so"));
  DynamicExecutor executor(package.path());
  for (const int64_t rows : {1, 3, 7}) {
    const ExampleData d = exampleData(rows, static_cast<uint32_t>(rows));
    const std::vector<TensorInfo> infos = {{DType::kF32, {rows, kCols}}, {DType::kF32, {rows, kCols}},
                                           {DType::kF32, {rows, kCols}}, {DType::kF32, {kCols, kOut}}};
    ExampleCall call(d);
    executor.run(infos, call.inputs, call.outputs);
    expectNear(call.out, d.out);
    expectNear(call.yr, d.yr);
  }
}

// A host function registered by the application in C++: its op_data is
// the state compute sees; the package records it as the host's.
struct HostScale {
  float factor;
};
int hostScaleInfer(const void*, const KilnTensorType* inputs, int32_t, KilnTensorType* outputs, int32_t, char*, size_t) {
  outputs[0] = inputs[0];
  return 0;
}
int hostScaleCompute(const void* state, const KilnTensor* inputs, int32_t, KilnTensor* outputs, int32_t, void*, uint64_t,
                     char*, size_t) {
  const float factor = static_cast<const HostScale*>(state)->factor;
  const auto* x = static_cast<const float*>(inputs[0].data);
  auto* y = static_cast<float*>(outputs[0].data);
  for (int64_t i = 0; i < inputs[0].dims[0]; ++i) y[i] = x[i] * factor;
  return 0;
}

TEST_F(PluginTest, HostFunctionsRegisteredInCppRunWithTheirOpData) {
  static HostScale three{3.0f};
  KilnOp op{};
  op.struct_size = sizeof op;
  op.domain = "com.host";
  op.name = "Scale";
  op.since_version = 1;
  op.min_inputs = op.max_inputs = op.min_outputs = op.max_outputs = 1;
  op.infer = &hostScaleInfer;
  op.compute = &hostScaleCompute;
  op.op_data = &three;
  registerHostOp(op);
  EXPECT_THROW(registerHostOp(op), UsageError);  // the name is taken

  Graph g;
  const ValueId x = g.addInput("x", ValueType::tensor(DType::kF32, {4}));
  g.addOutput(g.node(g.addNode("Scale", {x}, {"y"}, {}, "com.host")).outputs[0]);
  TempPackage package("host_op");
  compile(g, {{"", 17}, {"com.host", 1}}, package.path());
  EXPECT_TRUE(PackageReader(package.path()).metadata().front()->metadata().options.contains("plugin.<host>"));
  Executor executor(package.path());
  const std::vector<float> in = {1, 2, -3, 0.5f};
  std::vector<float> y(4);
  const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(in.data())};
  std::byte* outputs[] = {reinterpret_cast<std::byte*>(y.data())};
  executor.run(inputs, outputs);
  EXPECT_EQ(y, (std::vector<float>{3, 6, -9, 1.5f}));
}

// A composite op becomes the body it builds: Swish (Mul, Sigmoid, Mul) and
// the Add after it are one fused elementwise step, and the package needs no
// plugin library (it records none).
TEST_F(PluginTest, CompositeOpsBecomeTheirBodyAndFuseWithTheirNeighbours) {
  Graph g;
  const ValueId x = g.addInput("x", ValueType::tensor(DType::kF32, {5}));
  const ValueId s = g.node(g.addNode("Swish", {x}, {"s"}, {{"beta", 1.5f}}, "com.example")).outputs[0];
  g.addOutput(g.node(g.addNode("Add", {s, x}, {"y"})).outputs[0]);
  TempPackage package("composite");
  const CompileReport report = compile(g, kOpsets, package.path());
  EXPECT_EQ(report.step_kernels, (std::map<std::string, size_t>{{"kiln.FusedElementwise", 1}}));
  const PackageReader reader(package.path());
  for (const auto& [key, value] : reader.metadata().front()->metadata().options) {
    EXPECT_FALSE(key.starts_with("plugin.")) << key;
  }
  Executor executor(package.path());
  const std::vector<float> in = {-2, -0.5f, 0, 1, 3};
  std::vector<float> y(5);
  const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(in.data())};
  std::byte* outputs[] = {reinterpret_cast<std::byte*>(y.data())};
  executor.run(inputs, outputs);
  for (size_t i = 0; i < 5; ++i) {
    const float want = in[i] / (1 + std::exp(-1.5f * in[i])) + in[i];
    EXPECT_NEAR(y[i], want, 1e-6f * std::max(1.0f, std::abs(want)));
  }
}

// Running plugin steps allocates nothing: the operands are built on the
// stack and the workspace is planned with the model's memory.
TEST_F(PluginTest, RunningPluginStepsDoesNotAllocate) {
  TempPackage package("plugins_alloc");
  writeExampleModel(package.path());
  const ExampleData d = exampleData(kRows, 5);
  Executor executor(package.path());
  ExampleCall call(d);
  call.run(executor);
  testing::startCountingAllocations();
  for (int i = 0; i < 100; ++i) call.run(executor);
  const testing::AllocationCount count = testing::stopCountingAllocations();
  EXPECT_EQ(count.news, 0u);
  if (testing::countsMallocs()) {
    EXPECT_EQ(count.mallocs, 0u);
  }
  expectNear(call.out, d.out);
}

// In place: the sum is written over relu(x) when nothing else reads it
// (its value is an alias of relu(x) in the plan: no memory of its own); when
// another step reads relu(x) too, the sum gets memory of its own, the kernel
// copies relu(x) into it first, and relu(x) stays intact.
TEST_F(PluginTest, InPlaceOutputsAliasTheirInputOnlyWhenNothingElseReadsIt) {
  const auto build = [](bool shared, const std::filesystem::path& path) {
    Graph g;
    const ValueId x = g.addInput("x", ValueType::tensor(DType::kF32, {2, 3}));
    const ValueId b = g.addInput("b", ValueType::tensor(DType::kF32, {2, 3}));
    const ValueId relu = g.node(g.addNode("Relu", {x}, {"relu"})).outputs[0];
    const ValueId sum = g.node(g.addNode("AddInPlace", {relu, b}, {"sum"}, {}, "com.example")).outputs[0];
    g.addOutput(g.node(g.addNode("Neg", {sum}, {"neg"})).outputs[0]);
    if (shared) g.addOutput(g.node(g.addNode("Abs", {relu}, {"abs"})).outputs[0]);
    compile(g, kOpsets, path);
  };
  const std::vector<float> x = {-1, 2, -3, 4, -5, 6}, b = {10, 20, 30, 40, 50, 60};
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "relu(x) read twice" : "relu(x) read once");
    TempPackage package("inplace");
    build(shared, package.path());
    const ExecutableSpec spec = specOf(package.path());
    const auto sum = std::find_if(spec.values.begin(), spec.values.end(), [](const ValueSpec& v) { return v.name == "sum"; });
    ASSERT_NE(sum, spec.values.end());
    EXPECT_EQ(sum->storage, shared ? ValueStorage::kArena : ValueStorage::kAlias);
    if (!shared) {
      EXPECT_EQ(spec.values[sum->index].name, "relu");
    }
    Executor executor(package.path());
    std::vector<float> neg(6), abs(6);
    const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(x.data()), reinterpret_cast<const std::byte*>(b.data())};
    std::vector<std::byte*> outputs = {reinterpret_cast<std::byte*>(neg.data())};
    if (shared) outputs.push_back(reinterpret_cast<std::byte*>(abs.data()));
    executor.run(inputs, outputs);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(neg[i], -(std::max(x[i], 0.0f) + b[i]));
      if (shared) {
        EXPECT_EQ(abs[i], std::max(x[i], 0.0f));  // relu(x) was not overwritten
      }
    }
  }
}

// Two equal nodes of a stateless op become one step, and one over constants
// is folded away at compile time; a stateful op's nodes are all kept.
TEST_F(PluginTest, OnlyStatelessOpsAreMergedAndFolded) {
  for (const std::string op : {"Double", "DoubleStateful"}) {
    SCOPED_TRACE(op);
    Graph g;
    const ValueId x = g.addInput("x", ValueType::tensor(DType::kF32, {4}));
    const ValueId c = g.addInitializer("c", testing::floatConstant({4}, {1, 2, 3, 4}));
    const ValueId d1 = g.node(g.addNode(op, {x}, {"d1"}, {}, "com.test")).outputs[0];
    const ValueId d2 = g.node(g.addNode(op, {x}, {"d2"}, {}, "com.test")).outputs[0];
    const ValueId dc = g.node(g.addNode(op, {c}, {"dc"}, {}, "com.test")).outputs[0];
    const ValueId s = g.node(g.addNode("Add", {d1, d2}, {"s"})).outputs[0];
    g.addOutput(g.node(g.addNode("Add", {s, dc}, {"y"})).outputs[0]);
    TempPackage package("stateless");
    const CompileReport report = compile(g, kOpsets, package.path(), withFolding());
    const size_t plugin_steps = report.step_kernels.contains("kiln.Plugin") ? report.step_kernels.at("kiln.Plugin") : 0;
    EXPECT_EQ(plugin_steps, op == "Double" ? 1u : 3u);
    Executor executor(package.path());
    const std::vector<float> in = {0.5f, -1, 2, 8};
    std::vector<float> y(4);
    const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(in.data())};
    std::byte* outputs[] = {reinterpret_cast<std::byte*>(y.data())};
    executor.run(inputs, outputs);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(y[i], 4 * in[i] + 2 * static_cast<float>(i + 1));
  }
}

// An elementwise op is called on slices of the tensor, one per thread; the
// same op without the flag once per run.
TEST_F(PluginTest, ElementwiseOpsRunInSlicesAcrossThreads) {
  void* library = dlopen(kTestPlugin.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(library, nullptr);
  const auto calls = reinterpret_cast<int (*)(int)>(dlsym(library, "kiln_test_calls"));
  ASSERT_NE(calls, nullptr);
  constexpr int64_t kElements = 1 << 20;  // far above the threading bound
  for (const std::string op : {"CountCalls", "CountCallsWhole"}) {
    SCOPED_TRACE(op);
    Graph g;
    const ValueId x = g.addInput("x", ValueType::tensor(DType::kF32, {kElements}));
    g.addOutput(g.node(g.addNode(op, {x}, {"y"}, {}, "com.test")).outputs[0]);
    TempPackage package("elementwise");
    compile(g, kOpsets, package.path());
    ExecutorOptions options;
    options.threads = 2;
    Executor executor(package.path(), "", options);
    std::vector<float> in = randomFloats(kElements, 3), y(kElements);
    const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(in.data())};
    std::byte* outputs[] = {reinterpret_cast<std::byte*>(y.data())};
    calls(1);
    executor.run(inputs, outputs);
    EXPECT_EQ(calls(1), op == "CountCalls" ? 2 : 1);
    for (size_t i = 0; i < y.size(); i += 4099) ASSERT_EQ(y[i], in[i] + 1);
    EXPECT_EQ(y.back(), in.back() + 1);
  }
  dlclose(library);
}

}  // namespace
}  // namespace kiln

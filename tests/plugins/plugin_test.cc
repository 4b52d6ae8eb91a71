// Plugin ops end to end: the example library's ops (examples/plugins)
// compiled into packages and run by the Executor, the ModelRunner on cpu and
// sim, and the DynamicExecutor, against plain C++ references; and what the
// ops' metadata changes in the compiler (in-place aliasing, merging and
// folding only when stateless, elementwise slices across threads).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <dlfcn.h>
#include <functional>
#include <random>

#include "format/executable_spec.h"
#include "kernels/evaluate_once.h"
#include "kiln/compiler.h"
#include "kiln/dynamic_executor.h"
#include "kiln/executor.h"
#include "kiln/model_runner.h"
#include "kiln/package_reader.h"
#include "kiln/plugins.h"
#include "tests/format/package_edit.h"
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
  EXPECT_EQ(plugin.api_level, 2u);
  EXPECT_EQ(plugin.hash.size(), 16u);
  EXPECT_EQ(plugin.ops, (std::vector<std::string>{"com.example.Rotate", "com.example.RotateGrad",
                                                  "com.example.AddInPlace", "com.example.SerializedMatMul",
                                                  "com.example.SerializedMatMulGrad", "com.example.BlockScale",
                                                  "com.example.BlockScaleInPlace", "com.example.Swish"}));
  EXPECT_EQ(loadPlugin(KILN_EXAMPLE_PLUGIN).hash, plugin.hash);
}

TEST_F(PluginTest, ExampleOpsRunOnTheExecutorAndThePackageRecordsTheLibrary) {
  TempPackage package("plugins");
  writeExampleModel(package.path());
  const PackageReader reader(package.path());
  const auto& options = reader.metadata().front()->metadata().options;
  ASSERT_TRUE(options.contains("plugin.libkiln_example_ops.so"));
  EXPECT_EQ(options.at("plugin.libkiln_example_ops.so"), "level=2;hash=" + loadPlugin(KILN_EXAMPLE_PLUGIN).hash);
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
// The allocator hook: BlockScale asks for its input 256-byte aligned and
// padded to whole blocks of 16 floats (x has 5 * 7 = 35: 13 floats, 52
// bytes, of padding), and its compute refuses an unaligned input and reads
// the padding (AddressSanitizer builds catch a read past the arena). An
// arena value is planned that way where it is; a model input or a constant
// is copied into one that is; an in-place output over an input that another
// step reads gets the layout too (the kernel hands it to the op as the
// input).
TEST_F(PluginTest, TheAllocatorHookLaysInputsOutAlignedAndPadded) {
  constexpr uint64_t kAlign = 256, kBytes = 35 * sizeof(float), kPadding = 13 * sizeof(float);
  const Attributes attributes = {{"alignment", int64_t{kAlign}}, {"factor", 3.0f}};
  const std::vector<float> x = randomFloats(35, 21);
  std::vector<float> constant(35);
  for (size_t i = 0; i < constant.size(); ++i) constant[i] = static_cast<float>(i);
  struct Case {
    const char* name;
    std::string laid_out;  // the value the op reads: planned aligned, with room for the padding
    bool copied;           // a kiln.Copy step made it
  };
  for (const Case& c : {Case{"relu", "relu", false}, Case{"model input", "x:laid_out", true},
                        Case{"constant", "c:laid_out", true}, Case{"in place, relu read twice", "scaled", false},
                        Case{"in place, relu read once", "relu", false}}) {
    SCOPED_TRACE(c.name);
    const std::string name = c.name;
    const bool in_place = name.starts_with("in place");
    Graph g;
    const ValueId in = g.addInput("x", ValueType::tensor(DType::kF32, {5, 7}));
    ValueId operand = in;
    if (name == "constant") {
      operand = g.addInitializer("c", testing::floatConstant({5, 7}, constant));
    } else if (name != "model input") {
      operand = g.node(g.addNode("Relu", {in}, {"relu"})).outputs[0];
    }
    const ValueId scaled = g.node(g.addNode(in_place ? "BlockScaleInPlace" : "BlockScale", {operand}, {"scaled"},
                                            attributes, "com.example"))
                               .outputs[0];
    const ValueId sum = g.node(g.addNode("Add", {scaled, in}, {"sum"})).outputs[0];
    g.addOutput(sum);
    if (name == "in place, relu read twice") g.addOutput(g.node(g.addNode("Abs", {operand}, {"abs"})).outputs[0]);
    TempPackage package("layout");
    compile(g, kOpsets, package.path());

    const ExecutableSpec spec = specOf(package.path());
    const auto value = std::find_if(spec.values.begin(), spec.values.end(),
                                    [&](const ValueSpec& v) { return v.name == c.laid_out; });
    ASSERT_NE(value, spec.values.end());
    EXPECT_EQ(value->storage, ValueStorage::kArena);
    EXPECT_EQ(value->offset % kAlign, 0u) << value->offset;
    EXPECT_LE(value->offset + kBytes + kPadding, spec.arena_bytes);
    const bool has_copy = std::any_of(spec.steps.begin(), spec.steps.end(), [](const StepSpec& step) {
      return step.kernel == "kiln.Copy";
    });
    EXPECT_EQ(has_copy, c.copied);
    const auto step = std::find_if(spec.steps.begin(), spec.steps.end(),
                                   [](const StepSpec& s) { return s.kernel == "kiln.Plugin"; });
    ASSERT_NE(step, spec.steps.end());
    EXPECT_EQ(step->params.getInts("plugin_input_alignments", {}), (std::vector<int64_t>{int64_t{kAlign}}));
    EXPECT_EQ(step->params.getInts("plugin_input_paddings", {}), (std::vector<int64_t>{int64_t{kPadding}}));

    Executor executor(package.path());
    std::vector<float> out(35), abs(35);
    const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(x.data())};
    std::vector<std::byte*> outputs = {reinterpret_cast<std::byte*>(out.data())};
    if (g.outputs().size() == 2) outputs.push_back(reinterpret_cast<std::byte*>(abs.data()));
    for (int run = 0; run < 2; ++run) {
      executor.run(inputs, outputs);
      for (size_t i = 0; i < 35; ++i) {
        const float operand_value = name == "constant" ? constant[i] : name == "model input" ? x[i] : std::max(x[i], 0.0f);
        ASSERT_FLOAT_EQ(out[i], 3 * operand_value + x[i]) << "element " << i;
        if (outputs.size() == 2) {
          ASSERT_EQ(abs[i], std::max(x[i], 0.0f));  // relu was not scaled in place
        }
      }
    }
  }
}

// A package whose plugin step reads an input that does not lie as the op
// asks (the compiler's copy skipped, the padding past the arena, the
// recorded layout unlike the loaded library's) is refused at load, before
// the op could read past its input.
TEST_F(PluginTest, APackageBreakingTheAllocatorHooksLayoutIsRefused) {
  Graph g;
  const ValueId x = g.addInput("x", ValueType::tensor(DType::kF32, {5, 7}));
  g.addOutput(g.node(g.addNode("BlockScale", {x}, {"y"}, {{"alignment", int64_t{128}}}, "com.example")).outputs[0]);
  TempPackage source("layout_source");
  compile(g, kOpsets, source.path());
  const auto plugin_step = [](ExecutableSpec& spec) -> StepSpec& {
    return *std::find_if(spec.steps.begin(), spec.steps.end(), [](const StepSpec& s) { return s.kernel == "kiln.Plugin"; });
  };
  struct Case {
    const char* what;
    std::function<void(ExecutableSpec&)> edit;
    const char* expected;
  };
  const Case cases[] = {
      {"copy skipped: the op reads the caller's buffer",
       [&](ExecutableSpec& spec) { plugin_step(spec).inputs[0] = spec.inputs[0]; },
       "plugin step input 'x' does not lie as its op asks (128-byte aligned, 52 bytes of padding)"},
      {"padding past the arena",
       [&](ExecutableSpec& spec) {
         plugin_step(spec).params.set("plugin_input_paddings", std::vector<int64_t>{int64_t{1} << 20});
       },
       "does not lie as its op asks (128-byte aligned, 1048576 bytes of padding)"},
      {"a layout the library does not ask for",
       [&](ExecutableSpec& spec) { plugin_step(spec).params.set("plugin_input_paddings", std::vector<int64_t>{0}); },
       "input 0 is planned 128-byte aligned with 0 bytes of padding but the loaded plugin asks for 128 and 52"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TempPackage package("layout_hostile");
    testing::rewritePackage(PackageReader(source.path()), package.path(), c.edit);
    std::string error = "(loaded)";
    try {
      Executor executor(package.path());
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find(c.expected), std::string::npos) << error;
  }
}

// The same op runs through the ModelRunner on sim, whose arena the sim
// device allocates.
TEST_F(PluginTest, TheAllocatorHookHoldsOnSim) {
  Graph g;
  const ValueId x = g.addInput("x", ValueType::tensor(DType::kF32, {3, 11}));
  const ValueId relu = g.node(g.addNode("Relu", {x}, {"relu"})).outputs[0];
  g.addOutput(g.node(g.addNode("BlockScale", {relu}, {"y"}, {{"alignment", int64_t{1024}}, {"block", int64_t{8}}},
                               "com.example"))
                  .outputs[0]);
  TempPackage package("layout_sim");
  compile(g, kOpsets, package.path());
  DeviceManager manager(testing::simOptions(1));
  ModelRunnerConfig config;
  config.device_kind = DeviceKind::kSim;
  config.device_manager = &manager;
  ModelRunner runner(package.path(), config);
  const std::vector<float> in = randomFloats(33, 4);
  const OutputTensors result = runner.execute({{"x", ConstTensorMemoryView{in.data(), in.size() * 4, DType::kF32}}});
  std::vector<float> y(33);
  std::memcpy(y.data(), result.at("y").bytes.data(), y.size() * sizeof(float));
  for (size_t i = 0; i < y.size(); ++i) ASSERT_FLOAT_EQ(y[i], 2 * std::max(in[i], 0.0f));
}

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

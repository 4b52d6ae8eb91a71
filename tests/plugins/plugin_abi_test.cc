// The plugin ABI's versioning and error paths: which libraries load, which
// are refused and with what message; a misbehaving op's failures as
// kiln::Errors naming the plugin and the op, at compile time and at run time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kiln/compiler.h"
#include "kiln/error.h"
#include "kiln/executor.h"
#include "kiln/plugin.hpp"
#include "kiln/plugins.h"
#include "plugins/plugin_registry.h"
#include "tests/runtime/runtime_test_models.h"

namespace kiln {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TempPackage;

std::string library(const std::string& variant) {
  return std::string(KILN_TEST_PLUGIN_DIR) + "/libkiln_test_plugin" + (variant.empty() ? "" : "_" + variant) + ".so";
}

// The message of the UsageError `body` throws ("" when it throws none).
template <typename Body>
std::string errorOf(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// One node of `op` (domain `domain`) over f32[3], compiled and run once.
std::vector<float> runOne(const std::string& domain, const std::string& op, Attributes attributes = {}) {
  Graph g;
  const ValueId x = g.addInput("x", ValueType::tensor(DType::kF32, {3}));
  g.addOutput(g.node(g.addNode(op, {x}, {"y"}, std::move(attributes), domain)).outputs[0]);
  TempPackage package("abi");
  compile(g, {{"", 17}, {domain, 1}}, package.path());
  Executor executor(package.path());
  const std::vector<float> in = {1, -2, 3};
  std::vector<float> y(3);
  const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(in.data())};
  std::byte* outputs[] = {reinterpret_cast<std::byte*>(y.data())};
  executor.run(inputs, outputs);
  return y;
}

TEST(PluginAbiTest, APluginNeedingANewerLevelIsRefusedWithBothLevels) {
  EXPECT_THAT(errorOf([] { loadPlugin(library("future")); }),
              AllOf(HasSubstr("libkiln_test_plugin_future.so"), HasSubstr("needs plugin API level 3"),
                    HasSubstr("this kiln has level 2")));
}

TEST(PluginAbiTest, ALibraryWithoutTheEntryPointIsNotAPlugin) {
  EXPECT_THAT(errorOf([] { loadPlugin(library("no_register")); }),
              AllOf(HasSubstr("not a kiln plugin"), HasSubstr("kiln_plugin_register")));
}

TEST(PluginAbiTest, AMissingLibraryIsNamed) {
  EXPECT_THAT(errorOf([] { loadPlugin("/nonexistent/libnothing.so"); }),
              AllOf(HasSubstr("/nonexistent/libnothing.so"), HasSubstr("not found")));
}

TEST(PluginAbiTest, ASharedLibraryThatIsNoPluginIsRefused) {
  // Any shared library without the symbols: the C library itself.
  EXPECT_THAT(errorOf([] { loadPlugin(KILN_EXAMPLE_PLUGIN "/../../nothing"); }), HasSubstr("not found"));
}

// An op struct from an older header (the required fields only) loads: kiln
// reads no field past its struct_size (the test library puts junk there).
TEST(PluginAbiTest, AnOlderShorterOpStructLoadsWithDefaults) {
  const LoadedPlugin plugin = loadPlugin(library("short"));
  EXPECT_EQ(plugin.ops, (std::vector<std::string>{"com.short.Double"}));
  EXPECT_EQ(runOne("com.short", "Double"), (std::vector<float>{2, -4, 6}));
}

// A level-1 library (its KilnOp ends before the allocator hook) loads in
// this level-2 kiln, which never reads the hook's place.
TEST(PluginAbiTest, ALevelOnePluginLoadsWithoutAnAllocatorHook) {
  const LoadedPlugin plugin = loadPlugin(library("level1"));
  EXPECT_EQ(plugin.api_level, 1u);
  EXPECT_EQ(runOne("com.level1", "Double"), (std::vector<float>{2, -4, 6}));
}

// A struct_size that ends inside a field is no header's: refused, rather
// than half of the allocator hook's pointer copied.
TEST(PluginAbiTest, AStructSizeEndingInsideAFieldIsRefused) {
  const auto infer = [](const void*, const KilnTensorType*, int32_t, KilnTensorType*, int32_t, char*, size_t) { return 0; };
  const auto compute = [](const void*, const KilnTensor*, int32_t, KilnTensor*, int32_t, void*, uint64_t, char*,
                          size_t) { return 0; };
  KilnOp op{};
  op.domain = "com.x";
  op.name = "Op";
  op.since_version = 1;
  op.min_inputs = op.max_inputs = op.min_outputs = op.max_outputs = 1;
  op.infer = infer;
  op.compute = compute;
  for (const size_t size : {offsetof(KilnOp, input_layout), sizeof(KilnOp), sizeof(KilnOp) + 8}) {
    op.struct_size = static_cast<uint32_t>(size);
    EXPECT_EQ(refusalOf(&op), "") << size;
  }
  op.struct_size = static_cast<uint32_t>(offsetof(KilnOp, input_layout) + 4);
  EXPECT_THAT(refusalOf(&op), HasSubstr("which is no header's size (a multiple of 8)"));
}

// The C++ wrapper refuses to register an op with an allocator hook in a
// kiln older than level 2, which would ignore the hook (and the op would
// read padding that is not there).
TEST(PluginAbiTest, TheWrapperRefusesAnAllocatorHookBelowLevelTwo) {
  struct Op {
    explicit Op(const plugin::Attributes&) {}
    void infer(std::span<const KilnTensorType>, std::span<KilnTensorType>) const {}
    void compute(std::span<const KilnTensor>, std::span<KilnTensor>, std::span<std::byte>) const {}
    KilnInputLayout inputLayout(int32_t, std::span<const KilnTensorType>) const { return {}; }
  };
  int registered = 0;
  KilnPluginHost host{};
  host.struct_size = sizeof host;
  host.context = &registered;
  host.register_op = [](void* context, const KilnOp*, char*, size_t) { return ++*static_cast<int*>(context), 0; };
  for (const uint32_t level : {1u, 2u}) {
    host.api_level = level;
    std::string error;
    try {
      plugin::addOp<Op>(&host, {.domain = "com.x", .name = "Laid"});
    } catch (const plugin::Error& e) {
      error = e.what();
    }
    if (level == 1) {
      EXPECT_THAT(error, AllOf(HasSubstr("Laid has an allocator hook"), HasSubstr("needs kiln's plugin API level 2")));
    } else {
      EXPECT_EQ(error, "");
    }
  }
  EXPECT_EQ(registered, 1);
}

// An op struct from a newer header (a field kiln does not know at its end)
// loads: kiln reads what it knows.
TEST(PluginAbiTest, ANewerLongerOpStructLoads) {
  const LoadedPlugin plugin = loadPlugin(library("long"));
  EXPECT_EQ(plugin.ops, (std::vector<std::string>{"com.long.Double"}));
  EXPECT_EQ(runOne("com.long", "Double"), (std::vector<float>{2, -4, 6}));
}

TEST(PluginAbiTest, OpsInOnnxsOwnDomainAreRefusedAndNothingOfTheLibraryStays) {
  EXPECT_THAT(errorOf([] { loadPlugin(library("reserved")); }),
              AllOf(HasSubstr("registration failed"), HasSubstr("ONNX's or kiln's own")));
  // Refused as a whole: loading it again fails again (nothing was kept).
  EXPECT_THAT(errorOf([] { loadPlugin(library("reserved")); }), HasSubstr("registration failed"));
}

class MisbehavingPluginTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { loadPlugin(library("")); }
};

TEST_F(MisbehavingPluginTest, ANegativeDimensionIsRefusedAtCompileTime) {
  EXPECT_THAT(errorOf([] { runOne("com.test", "NegativeDim"); }),
              AllOf(HasSubstr("com.test.NegativeDim (plugin libkiln_test_plugin.so)"), HasSubstr("dimension -5")));
}

TEST_F(MisbehavingPluginTest, AnUnknownDTypeIsRefusedAtCompileTime) {
  EXPECT_THAT(errorOf([] { runOne("com.test", "BadDType"); }),
              AllOf(HasSubstr("com.test.BadDType"), HasSubstr("unknown dtype 1234")));
}

TEST_F(MisbehavingPluginTest, AComputeErrorBecomesAnErrorNamingThePluginAndOp) {
  EXPECT_THAT(errorOf([] { runOne("com.test", "Fails"); }),
              AllOf(HasSubstr("com.test.Fails (plugin libkiln_test_plugin.so)"), HasSubstr("the device is on fire")));
}

TEST_F(MisbehavingPluginTest, AnExceptionInComputeIsCaughtByTheWrapper) {
  EXPECT_THAT(errorOf([] { runOne("com.test", "Throws"); }),
              AllOf(HasSubstr("com.test.Throws"), HasSubstr("index 12 past the end")));
}

TEST_F(MisbehavingPluginTest, AttributesReachTheOpAsJsonAndRefusedOnesFailTheCompile) {
  EXPECT_EQ(runOne("com.test", "NeedsPositiveScale", {{"scale", 0.5f}}), (std::vector<float>{0.5f, -1, 1.5f}));
  EXPECT_THAT(errorOf([] { runOne("com.test", "NeedsPositiveScale", {{"scale", -1.0f}}); }),
              AllOf(HasSubstr("com.test.NeedsPositiveScale"), HasSubstr("scale must be positive")));
  // A tensor attribute has no JSON form.
  EXPECT_THAT(errorOf([] {
                runOne("com.test", "NeedsPositiveScale", {{"scale", testing::floatConstant({1}, {2.0f})}});
              }),
              HasSubstr("attribute 'scale' is a tensor or a graph"));
}

TEST_F(MisbehavingPluginTest, ACompositeNamingAMissingValueFailsTheCompile) {
  EXPECT_THAT(errorOf([] { runOne("com.test", "BadComposite"); }),
              AllOf(HasSubstr("com.test.BadComposite (plugin libkiln_test_plugin.so): build failed"),
                    HasSubstr("value 41, which does not exist")));
}

TEST_F(MisbehavingPluginTest, ACompositeThatBuildsItselfStops) {
  EXPECT_THAT(errorOf([] { runOne("com.test", "Recursive"); }), HasSubstr("still expand after 16 rounds"));
}

TEST_F(MisbehavingPluginTest, ABadAllocatorHookIsRefusedAtCompileTime) {
  EXPECT_THAT(errorOf([] { runOne("com.test", "BadAlignment"); }),
              AllOf(HasSubstr("com.test.BadAlignment (plugin libkiln_test_plugin.so)"),
                    HasSubstr("alignment of 48 bytes (a power of two up to 4096)")));
  EXPECT_THAT(errorOf([] { runOne("com.test", "HugePadding"); }),
              AllOf(HasSubstr("com.test.HugePadding"), HasSubstr("4194304 bytes of padding (at most 1048576)")));
  EXPECT_THAT(errorOf([] { runOne("com.test", "LayoutFails"); }),
              AllOf(HasSubstr("com.test.LayoutFails"), HasSubstr("allocator hook failed for input 0: no layout for you")));
}

TEST_F(MisbehavingPluginTest, AWrongNumberOfInputsIsRefusedAtCompileTime) {
  Graph g;
  const ValueId x = g.addInput("x", ValueType::tensor(DType::kF32, {3}));
  g.addOutput(g.node(g.addNode("Double", {x, x}, {"y"}, {}, "com.test")).outputs[0]);
  TempPackage package("abi_count");
  EXPECT_THAT(errorOf([&] { compile(g, {{"", 17}, {"com.test", 1}}, package.path()); }),
              AllOf(HasSubstr("com.test.Double"), HasSubstr("takes 1 to 1 inputs")));
}

#if defined(__SANITIZE_ADDRESS__)
// kiln cannot stop native code from writing where it should not; what it
// promises is that its sanitizer builds catch it (docs/plugins.md).
TEST_F(MisbehavingPluginTest, WritingPastAnOutputIsCaughtUnderAddressSanitizer) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(runOne("com.test", "WritesPastEnd"), "heap-buffer-overflow");
}
#endif

}  // namespace
}  // namespace kiln

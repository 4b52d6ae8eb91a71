// The plugin ABI's versioning and error paths: which libraries load, which
// are refused and with what message; a misbehaving op's failures as
// kiln::Errors naming the plugin and the op, at compile time and at run time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kiln/compiler.h"
#include "kiln/error.h"
#include "kiln/executor.h"
#include "kiln/plugins.h"
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
              AllOf(HasSubstr("libkiln_test_plugin_future.so"), HasSubstr("needs plugin API level 2"),
                    HasSubstr("this kiln has level 1")));
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

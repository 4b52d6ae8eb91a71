// HostSession: variables with the reference's lazy host/device transfers
// (shared/reference/session.txt, its example line by line), host transfers
// and replicas, on cpu and sim, against plain C++ references.
#include "kiln/host_session.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "kiln/compiler.h"
#include "kiln/training.h"
#include "kiln/error.h"
#include "kiln/package_reader.h"
#include "tests/runtime/runtime_test_models.h"
#include "tests/support/allocation_counter.h"

namespace kiln {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TempPackage;

constexpr int64_t kRows = 2, kIn = 4, kOut = 3;

// y[2, 3] = x[2, 4] @ transpose(w[3, 4]) + b[3]: w a variable, b a
// constant. Without --variables the compiler would fold transpose(w) into
// a constant of its own, and writing w would change nothing.
void writeModel(const std::filesystem::path& path) {
  Graph graph;
  const ValueId x = graph.addInput("x", ValueType::tensor(DType::kF32, {kRows, kIn}));
  std::vector<float> w(kOut * kIn), b(kOut);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * static_cast<float>(i);
  for (size_t j = 0; j < b.size(); ++j) b[j] = static_cast<float>(j);
  const ValueId wv = graph.addInitializer("w", testing::floatConstant({kOut, kIn}, w));
  const ValueId bv = graph.addInitializer("b", testing::floatConstant({kOut}, b));
  const ValueId wt = graph.node(graph.addNode("Transpose", {wv}, {"wt"}, {{"perm", std::vector<int64_t>{1, 0}}})).outputs[0];
  const ValueId xw = graph.node(graph.addNode("MatMul", {x, wt}, {"xw"})).outputs[0];
  graph.addOutput(graph.node(graph.addNode("Add", {xw, bv}, {"y"})).outputs[0]);
  CompileOptions options;
  options.variables = {"w"};
  compile(graph, {{"", 17}}, path, options);
}

std::vector<float> reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b) {
  std::vector<float> y(x.size() / kIn * kOut);
  for (size_t r = 0; r < x.size() / kIn; ++r) {
    for (int64_t j = 0; j < kOut; ++j) {
      float sum = b[j];
      for (int64_t i = 0; i < kIn; ++i) sum += x[r * kIn + i] * w[j * kIn + i];
      y[r * kOut + j] = sum;
    }
  }
  return y;
}

std::vector<float> floats(std::span<const std::byte> bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}
std::span<const std::byte> bytesOf(const std::vector<float>& v) { return std::as_bytes(std::span(v)); }

class HostSessionTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { writeModel(package_.path()); }
  HostSessionOptions options(uint32_t replicas = 1, uint32_t transfers = 1) {
    HostSessionOptions o;
    o.device = GetParam();
    o.replication_factor = replicas;
    o.num_host_transfers = transfers;
    o.device_manager = &manager_;
    return o;
  }
  std::shared_ptr<const PackageReader> package() const { return std::make_shared<PackageReader>(package_.path()); }

  TempPackage package_{"host_session"};
  DeviceManager manager_{testing::simOptions(2)};
};

// The reference's example (session.txt, "When transfers will occur"),
// line by line, with a (there) = w and b = b; each comment is the
// reference's.
TEST_P(HostSessionTest, TheReferencesLazyTransferExampleLineByLine) {
  HostSession session(package(), options());
  EXPECT_EQ(session.variables().size(), 1u);
  EXPECT_EQ(session.constants().size(), 1u);
  const auto counts = [&] { return std::pair{session.weightsToHostCount(), session.weightsFromHostCount()}; };
  const std::vector<float> x = {1, 2, 3, 4, -1, 0, 1, 2};
  const std::vector<float> b = {0, 1, 2};
  std::vector<float> w1(kOut * kIn, 0.5f), w2(kOut * kIn);
  for (size_t i = 0; i < w2.size(); ++i) w2[i] = static_cast<float>(i % 5) - 2;
  std::vector<float> y(kRows * kOut);
  const auto run = [&] {
    session.run({{"x", ConstTensorMemoryView{x.data(), x.size() * 4, DType::kF32}}},
                {{"y", TensorMemoryView{y.data(), y.size() * 4, DType::kF32}}});
  };

  // Allowed when detached, device weights will be updated on next context enter
  session.writeVariable("w", bytesOf(w1));
  EXPECT_EQ(counts(), (std::pair<uint64_t, uint64_t>{0, 0}));
  ASSERT_TRUE(session.attach());  // with session: (weights_from_host)
  EXPECT_EQ(counts(), (std::pair<uint64_t, uint64_t>{0, 1}));
  // No weights_to_host as no `run` has invalidated the host weights yet
  EXPECT_EQ(floats(session.readTensor("w")), w1);
  EXPECT_EQ(counts(), (std::pair<uint64_t, uint64_t>{0, 1}));
  run();
  EXPECT_EQ(y, reference(x, w1, b));
  // No weights_to_host, is constant
  EXPECT_EQ(floats(session.readTensor("b")), b);
  EXPECT_EQ(counts(), (std::pair<uint64_t, uint64_t>{0, 1}));
  // Causes weights_to_host as host weights currently out-of-sync
  const auto both = session.readTensors({"w", "b"});
  EXPECT_EQ(floats(both[0]), w1);
  EXPECT_EQ(floats(both[1]), b);
  EXPECT_EQ(counts(), (std::pair<uint64_t, uint64_t>{1, 1}));
  // Performs weights_from_host
  session.writeVariable("w", bytesOf(w2));
  EXPECT_EQ(counts(), (std::pair<uint64_t, uint64_t>{1, 2}));
  // No weights_to_host, write_variable_data did not invalidate
  EXPECT_EQ(floats(session.readTensor("w")), w2);
  EXPECT_EQ(counts(), (std::pair<uint64_t, uint64_t>{1, 2}));
  run();
  EXPECT_EQ(y, reference(x, w2, b));  // the new w reached the device (it was not folded away)
  // Leave context, causes detach and weights_to_host
  ASSERT_TRUE(session.detach());
  EXPECT_EQ(counts(), (std::pair<uint64_t, uint64_t>{2, 2}));
  EXPECT_FALSE(session.isAttached());
  // No weights_to_host as detached. Latest weights were already fetched due to leaving context
  const auto datas = session.readTensors({"w", "b"});
  EXPECT_EQ(floats(datas[0]), w2);
  EXPECT_EQ(counts(), (std::pair<uint64_t, uint64_t>{2, 2}));
  EXPECT_FALSE(session.detach());
}

// run() with num_host_transfers = 3 and 2 replicas: every operand holds
// 3 x 2 slices, slice (n, r) for replica r in round n.
TEST_P(HostSessionTest, RunsEveryHostTransferOnEveryReplica) {
  HostSession session(package(), options(/*replicas=*/2, /*transfers=*/3));
  session.attach();
  std::vector<float> x(3 * 2 * kRows * kIn), y(3 * 2 * kRows * kOut, -1);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3;
  session.run({{"x", ConstTensorMemoryView{x.data(), x.size() * 4, DType::kF32}}},
              {{"y", TensorMemoryView{y.data(), y.size() * 4}}});
  std::vector<float> w(kOut * kIn);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * static_cast<float>(i);
  const std::vector<float> want = reference(x, w, {0, 1, 2});
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i], 1e-5f) << "element " << i;
  EXPECT_EQ(session.mainRuns(), 6u);
}

TEST_P(HostSessionTest, BadOperandsAndNamesAreRefusedAndChangeNothing) {
  HostSession session(package(), options(/*replicas=*/1, /*transfers=*/2));
  std::vector<float> x(2 * kRows * kIn), y(2 * kRows * kOut);
  const InputMemoryView inputs = {{"x", ConstTensorMemoryView{x.data(), x.size() * 4}}};
  const OutputMemoryView outputs = {{"y", TensorMemoryView{y.data(), y.size() * 4}}};
  const auto error = [](auto&& body) {
    try {
      body();
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_THAT(error([&] { session.run(inputs, outputs); }), HasSubstr("not attached"));
  session.attach();
  const InputMemoryView short_input = {{"x", ConstTensorMemoryView{x.data(), 32}}};
  EXPECT_THAT(error([&] { session.run(short_input, outputs); }),
              AllOf(HasSubstr("input 'x' needs 64 bytes (2 x 1 of f32 [2, 4]"), HasSubstr("got 32")));
  const InputMemoryView wrong_type = {{"x", ConstTensorMemoryView{x.data(), x.size() * 4, DType::kI32}}};
  EXPECT_THAT(error([&] { session.run(wrong_type, outputs); }), HasSubstr("input 'x' is f32, got i32"));
  EXPECT_THAT(error([&] { session.run({}, outputs); }), HasSubstr("input 'x' (f32 [2, 4]) is missing"));
  InputMemoryView extra = inputs;
  extra["z"] = ConstTensorMemoryView{x.data(), 4};
  EXPECT_THAT(error([&] { session.run(extra, outputs); }), HasSubstr("no input or output named z"));
  const std::vector<float> before = floats(session.readTensor("w"));
  EXPECT_THAT(error([&] { session.writeVariable("b", bytesOf(before)); }),
              AllOf(HasSubstr("no variable named 'b'"), HasSubstr("variables: w")));
  EXPECT_THAT(error([&] { session.writeVariable("w", std::as_bytes(std::span(before).first(3))); }),
              HasSubstr("variable 'w' is f32 [3, 4] (48 bytes), got 12 bytes"));
  EXPECT_THAT(error([&] { session.readTensor("xw"); }), HasSubstr("no variable or constant named 'xw'"));
  EXPECT_EQ(floats(session.readTensor("w")), before);
  EXPECT_EQ(session.weightsFromHostCount(), 1u);  // only the attach's
}

// A run allocates nothing once attached: the operands' views are the
// caller's, the job lists and pointer arrays are reused. (An elementwise
// model: oneDNN 2.6's MatMul allocates inside every execution, the known
// exception.)
TEST_P(HostSessionTest, RunningAllocatesNothing) {
  Graph graph;
  const ValueId in = graph.addInput("x", ValueType::tensor(DType::kF32, {kRows, kIn}));
  const ValueId scale = graph.addInitializer("s", testing::floatConstant({kIn}, {1, 2, 3, 4}));
  graph.addOutput(graph.node(graph.addNode("Mul", {in, scale}, {"y"})).outputs[0]);
  TempPackage scaled("host_session_alloc");
  CompileOptions compile_options;
  compile_options.variables = {"s"};
  compile(graph, {{"", 17}}, scaled.path(), compile_options);
  HostSession session(std::make_shared<PackageReader>(scaled.path()), options(/*replicas=*/2, /*transfers=*/2));
  session.attach();
  std::vector<float> x(2 * 2 * kRows * kIn, 1.0f), y(2 * 2 * kRows * kIn);
  const InputMemoryView inputs = {{"x", ConstTensorMemoryView{x.data(), x.size() * 4, DType::kF32}}};
  const OutputMemoryView outputs = {{"y", TensorMemoryView{y.data(), y.size() * 4, DType::kF32}}};
  session.run(inputs, outputs);
  testing::startCountingAllocations();
  for (int i = 0; i < 20; ++i) session.run(inputs, outputs);
  const testing::AllocationCount count = testing::stopCountingAllocations();
  EXPECT_EQ(count.news, 0u);
  if (testing::countsMallocs()) {
    EXPECT_EQ(count.mallocs, 0u);
  }
  EXPECT_EQ(y[5], 2.0f);  // x * s[1]
}

// A training step allocates nothing either (an elementwise model: a
// weight per feature, a mean squared error, SGD with momentum): the
// updates are written over the variables in place.
// A training step (w * x - t)^2 with SGD momentum, on one replica and on
// two kept in step by the replicas' all-reduce (their threads started at
// attach): no heap allocation per run, and w learns 0.5.
TEST_P(HostSessionTest, TrainingStepsAllocateNothing) {
  for (const uint32_t replicas : {1u, 2u}) {
    SCOPED_TRACE(replicas);
    Graph graph;
    const ValueId in = graph.addInput("x", ValueType::tensor(DType::kF32, {kRows, kIn}));
    const ValueId target = graph.addInput("t", ValueType::tensor(DType::kF32, {kRows, kIn}));
    const ValueId w = graph.addInitializer("w", testing::floatConstant({kIn}, {1, 2, 3, 4}));
    const ValueId y = graph.node(graph.addNode("Mul", {in, w}, {"y"})).outputs[0];
    const ValueId d = graph.node(graph.addNode("Sub", {y, target}, {"d"})).outputs[0];
    const ValueId sq = graph.node(graph.addNode("Mul", {d, d}, {"sq"})).outputs[0];
    graph.addOutput(graph.node(graph.addNode("ReduceMean", {sq}, {"loss"}, {{"keepdims", int64_t{0}}})).outputs[0]);
    TempPackage trained("host_session_training");
    CompileOptions compile_options;
    compile_options.training = TrainingOptions{.loss = "loss", .trainable = {},
                                               .optimizer = {.learning_rate = 1.0f, .momentum = 0.1f}};
    if (replicas > 1) compile_options.training->gradient_all_reduce = kReplicaAllReduce;
    compile(graph, {{"", 17}}, trained.path(), compile_options);
    HostSession session(std::make_shared<PackageReader>(trained.path()), options(replicas, /*transfers=*/4));
    ASSERT_EQ(session.variables().size(), 2u);  // w and its momentum
    session.attach();
    const size_t slices = 4 * replicas;
    std::vector<float> x(slices * kRows * kIn, 1.0f), t(slices * kRows * kIn, 0.5f), loss(slices);
    const InputMemoryView inputs = {{"x", ConstTensorMemoryView{x.data(), x.size() * 4}},
                                    {"t", ConstTensorMemoryView{t.data(), t.size() * 4}}};
    const OutputMemoryView outputs = {{"loss", TensorMemoryView{loss.data(), loss.size() * 4}}};
    session.run(inputs, outputs);
    const float first = loss[0];
    testing::startCountingAllocations();
    for (int i = 0; i < 10; ++i) session.run(inputs, outputs);
    const testing::AllocationCount count = testing::stopCountingAllocations();
    EXPECT_EQ(count.news, 0u);
    if (testing::countsMallocs()) {
      EXPECT_EQ(count.mallocs, 0u);
    }
    EXPECT_LT(loss[slices - 1], 1e-4f * first);  // w went to 0.5: the loss fell
    if (replicas > 1) {
      EXPECT_EQ(loss[slices - 1], loss[slices - 2]);  // in step: same data, same weights, same loss
    }
    const std::vector<float> learned = floats(session.readTensor("w"));
    for (float value : learned) EXPECT_NEAR(value, 0.5f, 1e-3f);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, HostSessionTest, ::testing::Values("cpu", "sim"),
                         [](const auto& param_info) { return std::string(param_info.param); });

// Detaching gives the device back: while attached to sim:0 another
// DeviceManager (another process, in production) finds it busy; after
// detach() it attaches.
TEST(HostSessionDevices, DetachGivesTheDeviceBack) {
  TempPackage package("host_session_device");
  writeModel(package.path());
  DeviceManager mine(testing::simOptions(1)), theirs(testing::simOptions(1));
  HostSessionOptions options;
  options.device = "sim:0";
  options.device_manager = &mine;
  HostSession session(std::make_shared<PackageReader>(package.path()), options);
  session.attach();
  EXPECT_THROW(theirs.getSpecificDevice("sim:0"), DeviceBusyError);
  session.detach();
  EXPECT_NE(theirs.getSpecificDevice("sim:0"), nullptr);
}

TEST(HostSessionCompile, AVariableMustBeAWeightOfTheModel) {
  Graph graph;
  const ValueId x = graph.addInput("x", ValueType::tensor(DType::kF32, {2}));
  const ValueId w = graph.addInitializer("w", testing::floatConstant({2}, {1, 2}));
  graph.addOutput(graph.node(graph.addNode("Mul", {x, w}, {"y"})).outputs[0]);
  TempPackage package("host_session_bad");
  CompileOptions options;
  options.variables = {"x"};
  try {
    compile(graph, {{"", 17}}, package.path(), options);
    FAIL() << "compiled";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("variable 'x' is not a weight"), HasSubstr("its weights include: w")));
  }
}

// A package with variables lists a save program whose anchors the plain
// Executor and the model's outputs leave out.
TEST(HostSessionCompile, VariablesBecomeSaveAnchors) {
  TempPackage package("host_session_anchors");
  writeModel(package.path());
  const PackageReader reader(package.path());
  const Metadata& metadata = reader.metadata().front()->metadata();
  ASSERT_EQ(metadata.saveAnchors().size(), 1u);
  EXPECT_EQ(metadata.saveAnchors().front()->name, "w");
  EXPECT_EQ(metadata.program_flow.save, (std::vector<uint32_t>{2}));
  ASSERT_EQ(metadata.outputs().size(), 1u);
  EXPECT_EQ(metadata.outputs().front()->name, "y");
}

}  // namespace
}  // namespace kiln

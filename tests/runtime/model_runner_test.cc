// ModelRunner on real devices: sync and async requests, runner- and
// caller-allocated outputs, I/O validation, conditional execution, dynamic
// batch sizing, flush on timeout, replicas, device waiting.
#include "kiln/model_runner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>

#include "kiln/error.h"
#include "kiln/package_reader.h"
#include "kiln/package_writer.h"
#include "tests/format/package_edit.h"
#include "tests/runtime/runtime_test_models.h"

namespace kiln {
namespace {

using testing::affineReference;
using testing::kBatch;
using testing::kFeatures;
using testing::near;
using testing::rows;
using testing::simOptions;
using testing::TempPackage;

std::vector<float> floats(const HostTensor& tensor) {
  std::vector<float> values(tensor.bytes.size() / 4);
  std::memcpy(values.data(), tensor.bytes.data(), tensor.bytes.size());
  return values;
}

void expectNear(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(near(got[i], want[i])) << "element " << i << ": " << got[i] << " vs " << want[i];
}

// Writes a copy of the package at `source` to `target` with `edit` applied
// to its metadata and to each user anchor (the ones the package does not
// provide): packages the compiler does not write but the format allows.
template <typename Edit>
void withAnchors(const std::filesystem::path& source, const std::filesystem::path& target, Edit edit) {
  PackageReader reader(source);
  testing::rewritePackage(
      reader, target, [](ExecutableSpec&) {},
      [&](Metadata& metadata) {
        for (Anchor& anchor : metadata.anchors) {
          if (!reader.isPackageProvided(anchor)) edit(metadata, anchor);
        }
      });
}

InputMemoryView inputOf(const std::vector<float>& x) {
  return {{"x", ConstTensorMemoryView{x.data(), x.size() * 4, DType::kF32}}};
}

class ModelRunnerTest : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    testing::writeAffineModel(package_.path(), kBatch, kFeatures);
    manager_ = std::make_unique<DeviceManager>(simOptions(2));
  }
  ModelRunnerConfig config() {
    ModelRunnerConfig config;
    config.device_kind = GetParam();
    config.device_manager = manager_.get();
    return config;
  }
  TempPackage package_{"affine"};
  std::unique_ptr<DeviceManager> manager_;
};

TEST_P(ModelRunnerTest, DescribesItsAnchors) {
  ModelRunner runner(package_.path(), config());
  const auto inputs = runner.getExecuteInputs();
  ASSERT_EQ(inputs.size(), 1u);
  EXPECT_EQ(inputs[0].name, "x");
  EXPECT_EQ(inputs[0].shape, (std::vector<int64_t>{kBatch, kFeatures}));
  EXPECT_EQ(inputs[0].dtype, DType::kF32);
  EXPECT_EQ(inputs[0].size_in_bytes, static_cast<uint64_t>(kBatch * kFeatures * 4));
  const auto outputs = runner.getExecuteOutputs();
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].name, "y");
}

TEST_P(ModelRunnerTest, SyncAndAsyncWithBothKindsOfOutputs) {
  ModelRunner runner(package_.path(), config());
  const std::vector<float> x = rows(kBatch, 1.0f);
  const std::vector<float> want = affineReference(x, kFeatures);
  // Runner-allocated, sync.
  OutputTensors result = runner.execute(inputOf(x));
  EXPECT_EQ(result.at("y").info.shape, (std::vector<int64_t>{kBatch, kFeatures}));
  expectNear(floats(result.at("y")), want);
  // Caller-allocated, sync.
  std::vector<float> y(x.size());
  runner.execute(inputOf(x), {{"y", TensorMemoryView{y.data(), y.size() * 4, DType::kF32}}});
  expectNear(y, want);
  // Many async requests in flight, both kinds.
  std::vector<std::vector<float>> xs, ys;
  for (int i = 0; i < 40; ++i) {
    xs.push_back(rows(kBatch * (1 + i % 3), static_cast<float>(i)));
    ys.emplace_back(xs.back().size());
  }
  std::vector<Future<void>> written;
  std::vector<Future<OutputTensors>> allocated;
  for (size_t i = 0; i < xs.size(); ++i) {
    written.push_back(runner.executeAsync(inputOf(xs[i]), {{"y", TensorMemoryView{ys[i].data(), ys[i].size() * 4}}}));
    allocated.push_back(runner.executeAsync(inputOf(xs[i])));
  }
  for (size_t i = 0; i < xs.size(); ++i) {
    written[i].get();
    expectNear(ys[i], affineReference(xs[i], kFeatures));
    expectNear(floats(allocated[i].get().at("y")), affineReference(xs[i], kFeatures));
  }
}

TEST_P(ModelRunnerTest, ValidationRejectsBadRequestsAndRunsNothing) {
  ModelRunner runner(package_.path(), config());
  const std::vector<float> x = rows(kBatch, 0.0f);
  std::vector<float> y(x.size());
  auto expectError = [&](const InputMemoryView& in, const OutputMemoryView& out, const std::string& fragment) {
    try {
      runner.execute(in, out);
      ADD_FAILURE() << "expected an error mentioning " << fragment;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  const OutputMemoryView out{{"y", TensorMemoryView{y.data(), y.size() * 4}}};
  expectError({}, out, "missing [x]");
  InputMemoryView extra = inputOf(x);
  extra["bogus"] = ConstTensorMemoryView{x.data(), 4};
  expectError(extra, out, "unknown [bogus]");
  expectError({{"x", ConstTensorMemoryView{x.data(), 12}}}, out, "whole number of compiled tensors");
  expectError({{"x", ConstTensorMemoryView{x.data(), x.size() * 4, DType::kI32}}}, out, "is f32");
  expectError(inputOf(x), {}, "missing [y]");
  expectError(inputOf(x), {{"y", TensorMemoryView{y.data(), 8}}}, "output 'y'");
  EXPECT_EQ(runner.batchesRun(), 0u);
  runner.execute(inputOf(x), out);
  EXPECT_EQ(runner.batchesRun(), 1u);
}

// Without batching_dim: whole multiples of the compiled batch only.
TEST_P(ModelRunnerTest, BatchesMustBeMultiplesWithoutBatchingDim) {
  ModelRunner runner(package_.path(), config());
  for (size_t count : {4, 8, 12}) {
    const std::vector<float> x = rows(count, 2.0f);
    expectNear(floats(runner.execute(inputOf(x)).at("y")), affineReference(x, kFeatures));
  }
  const std::vector<float> six = rows(6, 0.0f);
  EXPECT_THROW(runner.execute(inputOf(six)), UsageError);
}

// With batching_dim: every batch size from 1 to 3x the compiled one, split
// and padded into device batches of 4 and reassembled.
TEST_P(ModelRunnerTest, DynamicBatchSizing) {
  ModelRunnerConfig c = config();
  c.batching_dim = 0;
  c.timeout_ns = std::chrono::microseconds(200);
  ModelRunner runner(package_.path(), c);
  for (size_t count = 1; count <= 3 * kBatch; ++count) {
    const std::vector<float> x = rows(count, static_cast<float>(count));
    OutputTensors result = runner.execute(inputOf(x));
    EXPECT_EQ(result.at("y").info.shape, (std::vector<int64_t>{static_cast<int64_t>(count), kFeatures}));
    expectNear(floats(result.at("y")), affineReference(x, kFeatures));
  }
  EXPECT_GT(runner.batchesFlushed(), 0u);  // the sizes that were not multiples of 4
  const std::vector<float> x = rows(1, 0.0f);
  EXPECT_THROW(runner.execute({{"x", ConstTensorMemoryView{x.data(), 7}}}), UsageError);
}

// Concurrent small requests share device batches.
TEST_P(ModelRunnerTest, ConcurrentRequestsFillBatchesTogether) {
  ModelRunnerConfig c = config();
  c.batching_dim = 0;
  c.timeout_ns = std::chrono::milliseconds(50);
  ModelRunner runner(package_.path(), c);
  std::vector<std::vector<float>> xs;
  for (int i = 0; i < 8; ++i) xs.push_back(rows(1, static_cast<float>(i)));
  std::vector<Future<OutputTensors>> results;
  for (const auto& x : xs) results.push_back(runner.executeAsync(inputOf(x)));
  for (size_t i = 0; i < xs.size(); ++i) expectNear(floats(results[i].get().at("y")), affineReference(xs[i], kFeatures));
  EXPECT_EQ(runner.batchesRun(), 2u);  // eight one-row requests, two batches of four
}

TEST_P(ModelRunnerTest, FlushCallbackRunsOnceAndCanSupplyTheMissingRows) {
  ModelRunnerConfig c = config();
  c.batching_dim = 0;
  c.timeout_ns = std::chrono::milliseconds(1);
  std::atomic<int> calls{0};
  std::string waited_for;
  const std::vector<float> filler = rows(kBatch - 1, 7.0f);
  std::vector<float> filler_out(filler.size());
  const InputMemoryView filler_inputs{{"x", ConstTensorMemoryView{filler.data(), filler.size() * 4}}};
  const OutputMemoryView filler_outputs{{"y", TensorMemoryView{filler_out.data(), filler_out.size() * 4}}};
  c.flush_callback = [&](const std::string& tensor_id, const InputMemoryView*& inputs, const OutputMemoryView*& outputs) {
    ++calls;
    waited_for = tensor_id;
    inputs = &filler_inputs;
    outputs = &filler_outputs;
  };
  ModelRunner runner(package_.path(), c);
  const std::vector<float> x = rows(1, 3.0f);
  expectNear(floats(runner.execute(inputOf(x)).at("y")), affineReference(x, kFeatures));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(waited_for, "x");
  EXPECT_EQ(runner.batchesFlushed(), 1u);
  // The padding rows ran on the callback's inputs, into its outputs.
  expectNear(filler_out, affineReference(filler, kFeatures));
}

// A flush_callback is the caller's code: when it throws, or gives views of
// the wrong size, the requests of that batch get a UsageError naming it,
// and the runner goes on serving (it is not the device failing). Before,
// a throw left the batch's requests unanswered for ever, and a wrong size
// stopped the runner as failed.
TEST_P(ModelRunnerTest, AFlushCallbackThatThrowsOrMissizesFailsItsBatchOnly) {
  for (const bool throws : {true, false}) {
    ModelRunnerConfig c = config();
    c.batching_dim = 0;
    c.timeout_ns = std::chrono::milliseconds(1);
    const std::vector<float> wrong = rows(1, 0.0f);  // kBatch - 1 rows are missing
    const InputMemoryView wrong_inputs{{"x", ConstTensorMemoryView{wrong.data(), wrong.size() * 4}}};
    std::atomic<bool> misbehave{true};
    c.flush_callback = [&](const std::string&, const InputMemoryView*& inputs, const OutputMemoryView*&) {
      if (!misbehave) return;
      if (throws) throw std::runtime_error("the callback's own bug");
      inputs = &wrong_inputs;
    };
    ModelRunner runner(package_.path(), c);
    const std::vector<float> x = rows(1, 3.0f);
    auto pending = runner.executeAsync(inputOf(x));
    ASSERT_TRUE(pending.waitFor(std::chrono::seconds(10))) << "a request never answered";
    try {
      pending.get();
      ADD_FAILURE() << "expected UsageError";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(throws ? "the callback's own bug" : "flush_callback gave"));
    }
    // The runner still serves: full batches, and flushed ones once the callback behaves.
    const std::vector<float> full = rows(kBatch, 1.0f);
    expectNear(floats(runner.execute(inputOf(full)).at("y")), affineReference(full, kFeatures));
    misbehave = false;
    expectNear(floats(runner.execute(inputOf(x)).at("y")), affineReference(x, kFeatures));
  }
}

TEST_P(ModelRunnerTest, FlushWithoutCallbackAnswersOnlyRealRequests) {
  ModelRunnerConfig c = config();
  c.batching_dim = 0;
  c.timeout_ns = std::chrono::milliseconds(1);
  ModelRunner runner(package_.path(), c);
  const std::vector<float> x = rows(3, -1.0f);
  OutputTensors result = runner.execute(inputOf(x));
  EXPECT_EQ(result.at("y").info.shape, (std::vector<int64_t>{3, kFeatures}));
  expectNear(floats(result.at("y")), affineReference(x, kFeatures));
  EXPECT_EQ(runner.batchesFlushed(), 1u);
}

TEST_P(ModelRunnerTest, Replicas) {
  ModelRunnerConfig c = config();
  c.replication_factor = 2;
  ModelRunner runner(package_.path(), c);
  const auto ids = runner.deviceIds();
  ASSERT_EQ(ids.size(), 2u);
  if (GetParam() == DeviceKind::kSim) {
    EXPECT_NE(ids[0], ids[1]);
  }
  std::vector<std::vector<float>> xs;
  std::vector<Future<OutputTensors>> results;
  uint64_t batches = 0;
  for (int i = 0; i < 20; ++i) {
    xs.push_back(rows(kBatch * (1 + i % 3), static_cast<float>(i)));
    batches += 1 + i % 3;
  }
  for (const auto& x : xs) results.push_back(runner.executeAsync(inputOf(x)));
  for (size_t i = 0; i < xs.size(); ++i) expectNear(floats(results[i].get().at("y")), affineReference(xs[i], kFeatures));
  EXPECT_EQ(runner.batchesRun(), batches);
}

INSTANTIATE_TEST_SUITE_P(Devices, ModelRunnerTest, ::testing::Values(DeviceKind::kCpu, DeviceKind::kSim),
                         [](const auto& param_info) { return std::string(deviceKindName(param_info.param)); });

// A package compiled for 2 replicas whose user anchors are per-replica
// (written here by copying a compiled package with that metadata): a
// request carries a leading replica dimension and each replica runs its
// slice, on its own sim device.
TEST(ModelRunnerReplicas, PerReplicaAnchorsGainALeadingDimension) {
  TempPackage compiled("per_replica_src");
  testing::writeAffineModel(compiled.path(), kBatch, kFeatures);
  TempPackage package("per_replica");
  withAnchors(compiled.path(), package.path(), [](Metadata& metadata, Anchor& anchor) {
    metadata.replication_factor = 2;
    anchor.is_per_replica = true;
  });
  DeviceManager manager(simOptions(2));
  ModelRunnerConfig config;
  config.device_kind = DeviceKind::kSim;
  config.device_manager = &manager;
  config.replication_factor = 1;
  EXPECT_THROW(ModelRunner(package.path(), config), UsageError);  // compiled for 2
  config.replication_factor = 2;
  ModelRunner runner(package.path(), config);
  const auto inputs = runner.getExecuteInputs();
  EXPECT_EQ(inputs[0].shape, (std::vector<int64_t>{2, kBatch, kFeatures}));
  EXPECT_EQ(runner.getExecuteOutputs()[0].shape, (std::vector<int64_t>{2, kBatch, kFeatures}));
  const std::vector<float> x = rows(2 * kBatch, 1.5f);  // replica 0's batch, then replica 1's
  OutputTensors result = runner.execute(inputOf(x));
  EXPECT_EQ(result.at("y").info.shape, (std::vector<int64_t>{2, kBatch, kFeatures}));
  expectNear(floats(result.at("y")), affineReference(x, kFeatures));
  EXPECT_EQ(runner.batchesRun(), 2u);  // one per replica
  // Half of the replica dimension is not a request.
  EXPECT_THROW(runner.execute({{"x", ConstTensorMemoryView{x.data(), x.size() * 2}}}), UsageError);
}

// Batching on a middle dimension: x[3, batch, 5], compiled batch 2.
TEST(ModelRunnerBatching, MiddleDimension) {
  TempPackage package("middle");
  testing::writeMiddleBatchModel(package.path(), 3, 2, 5);
  DeviceManager manager(simOptions(1));
  for (DeviceKind kind : {DeviceKind::kCpu, DeviceKind::kSim}) {
    ModelRunnerConfig config;
    config.device_kind = kind;
    config.device_manager = &manager;
    config.batching_dim = 1;
    config.timeout_ns = std::chrono::microseconds(100);
    ModelRunner runner(package.path(), config);
    for (int64_t batch = 1; batch <= 6; ++batch) {
      std::vector<float> x(static_cast<size_t>(3 * batch * 5));
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
      OutputTensors result = runner.execute({{"x", ConstTensorMemoryView{x.data(), x.size() * 4}}});
      EXPECT_EQ(result.at("y").info.shape, (std::vector<int64_t>{3, batch, 5}));
      const std::vector<float> y = floats(result.at("y"));
      for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], x[i] * 3 - 1) << deviceKindName(kind) << " batch " << batch;
    }
  }
}

// tryExecuteAsync never waits: on a slow device whose queues fill, it
// says no (nothing enqueued) instead of blocking; what it accepted runs
// and is right; once the queues drain it accepts again. With two replicas,
// one slow, requests go to whichever has room, all answered right.
TEST(ModelRunnerAdmission, TryExecuteAsyncSaysNoInsteadOfWaiting) {
  TempPackage package("try_execute");
  testing::writeAffineModel(package.path(), kBatch, kFeatures);
  DeviceManagerOptions options = simOptions(2);
  options.sim_each.resize(2);
  options.sim_each[0].transfer_latency_ns = 20'000'000;  // 20 ms per copy
  DeviceManager manager(options);
  ModelRunnerConfig config;
  config.device_kind = DeviceKind::kSim;
  config.device_manager = &manager;
  config.ring_buffer_size_multiplier = 1;
  const std::vector<float> x = rows(kBatch, 4.0f);
  {
    ModelRunner runner(package.path(), config);  // sim:0, the slow one
    std::vector<Future<OutputTensors>> accepted;
    bool refused = false;
    for (int i = 0; i < 100 && !refused; ++i) {
      std::optional<Future<OutputTensors>> future = runner.tryExecuteAsync(inputOf(x));
      if (future) {
        accepted.push_back(std::move(*future));
      } else {
        refused = true;
      }
    }
    EXPECT_TRUE(refused) << "a slow device's queues never filled";
    EXPECT_GE(accepted.size(), 1u);
    for (auto& future : accepted) expectNear(floats(future.get().at("y")), affineReference(x, kFeatures));
    EXPECT_EQ(runner.batchesRun(), accepted.size());  // the refused ones never ran
    std::optional<Future<OutputTensors>> again = runner.tryExecuteAsync(inputOf(x));
    ASSERT_TRUE(again.has_value()) << "empty queues must accept";
    expectNear(floats(again->get().at("y")), affineReference(x, kFeatures));
  }
  config.replication_factor = 2;
  ModelRunner runner(package.path(), config);  // sim:0 slow, sim:1 fast
  std::vector<Future<OutputTensors>> futures;
  for (int i = 0; i < 40; ++i) futures.push_back(runner.executeAsync(inputOf(x)));
  for (auto& future : futures) expectNear(floats(future.get().at("y")), affineReference(x, kFeatures));
}

// pipeline_depth outside 1..64 is refused up front (a depth beyond the
// device's job queues deadlocked the sim device's threads).
TEST(ModelRunnerValidation, PipelineDepthOutOfRangeIsAClearError) {
  TempPackage package("pipeline_depth");
  testing::writeAffineModel(package.path(), kBatch, kFeatures);
  DeviceManager manager(simOptions(1));
  for (const uint32_t depth : {0u, 65u, 1000u}) {
    ModelRunnerConfig config;
    config.device_kind = DeviceKind::kSim;
    config.device_manager = &manager;
    config.pipeline_depth = depth;
    try {
      ModelRunner runner(package.path(), config);
      ADD_FAILURE() << "depth " << depth << " accepted";
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("pipeline_depth is " + std::to_string(depth)));
    }
  }
  ModelRunnerConfig config;
  config.device_kind = DeviceKind::kSim;
  config.device_manager = &manager;
  config.pipeline_depth = 64;
  ModelRunner runner(package.path(), config);
  const std::vector<float> x = rows(kBatch, 1.0f);
  expectNear(floats(runner.execute(inputOf(x)).at("y")), affineReference(x, kFeatures));
}

// Without batching_dim a request is whole tensors (N of them), whatever
// batch dimension the package's anchors name: the runner and the session's
// queues must agree on that. (They did not: the session batched the queues
// on the anchors' batch_dim, so requests were consumed as rows, wrong
// results were reported as success, and with batch_dim 1 the loop read and
// wrote past the caller's buffers.)
TEST(ModelRunnerBatching, AnchorsWithABatchDimStillTakeWholeTensorsWithoutBatchingDim) {
  TempPackage middle_source("anchor_batch_dim_src");
  testing::writeMiddleBatchModel(middle_source.path(), 3, 2, 5);
  TempPackage middle("anchor_batch_dim_1");
  withAnchors(middle_source.path(), middle.path(), [](Metadata&, Anchor& anchor) { anchor.batch_dim = 1; });
  TempPackage affine_source("anchor_batch_dim0_src");
  testing::writeAffineModel(affine_source.path(), kBatch, kFeatures);
  TempPackage affine("anchor_batch_dim_0");
  withAnchors(affine_source.path(), affine.path(), [](Metadata&, Anchor& anchor) { anchor.batch_dim = 0; });
  DeviceManager manager(simOptions(1));
  for (DeviceKind kind : {DeviceKind::kCpu, DeviceKind::kSim}) {
    ModelRunnerConfig config;
    config.device_kind = kind;
    config.device_manager = &manager;
    {
      ModelRunner runner(middle.path(), config);
      for (int64_t whole = 1; whole <= 3; ++whole) {
        std::vector<float> x(static_cast<size_t>(whole * 3 * 2 * 5));
        for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
        const std::vector<float> y = floats(runner.execute({{"x", ConstTensorMemoryView{x.data(), x.size() * 4}}}).at("y"));
        ASSERT_EQ(y.size(), x.size());
        for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], x[i] * 3 - 1) << deviceKindName(kind) << " element " << i;
      }
    }
    {
      ModelRunner runner(affine.path(), config);
      const std::vector<float> x = rows(2 * kBatch, 5.0f);
      expectNear(floats(runner.execute(inputOf(x)).at("y")), affineReference(x, kFeatures));
    }
  }
}

// An anchor of 0 bytes (an empty tensor, f32[0, 4]) beside ordinary ones:
// it does not size the request, takes 0 bytes, and a request giving it data
// gets a clear error. (Its size divided the request's: SIGFPE, issue 12.)
TEST(ModelRunnerValidation, EmptyAnchorsTakeNoBytesAndDoNotSizeTheRequest) {
  TempPackage package("empty_anchor");
  {
    Graph graph;
    const ValueId x = graph.addInput("x", ValueType::tensor(DType::kF32, {2, 3}));
    const ValueId e = graph.addInput("e", ValueType::tensor(DType::kF32, {0, 4}));
    const ValueId three = graph.addInitializer("three", testing::floatConstant({}, {3.0f}));
    graph.addOutput(graph.node(graph.addNode("Mul", {x, three}, {"y"})).outputs[0]);
    graph.addOutput(graph.node(graph.addNode("Mul", {e, three}, {"ey"})).outputs[0]);
    compile(graph, {{"", 17}}, package.path());
  }
  DeviceManager manager(simOptions(1));
  for (DeviceKind kind : {DeviceKind::kCpu, DeviceKind::kSim}) {
    ModelRunnerConfig config;
    config.device_kind = kind;
    config.device_manager = &manager;
    ModelRunner runner(package.path(), config);
    const std::vector<float> x = {1, 2, 3, 4, 5, 6};
    float empty[1] = {0};
    OutputTensors result = runner.execute(
        {{"x", ConstTensorMemoryView{x.data(), x.size() * 4}}, {"e", ConstTensorMemoryView{empty, 0}}});
    const std::vector<float> y = floats(result.at("y"));
    ASSERT_EQ(y.size(), 6u) << deviceKindName(kind);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], x[i] * 3) << deviceKindName(kind);
    EXPECT_EQ(result.at("ey").info.shape, (std::vector<int64_t>{0, 4}));
    EXPECT_EQ(result.at("ey").info.sizeInBytes(), 0u);
    try {
      runner.execute({{"x", ConstTensorMemoryView{x.data(), x.size() * 4}}, {"e", ConstTensorMemoryView{empty, 4}}});
      ADD_FAILURE() << "a request giving bytes to an empty anchor ran";
    } catch (const UsageError& error) {
      EXPECT_NE(std::string(error.what()).find("holds no data, but the request gives 4 bytes"),
                std::string::npos)
          << error.what();
    }
  }
}

// Two sub-models behind an If: with validate_io_params off a request gives
// only the anchors of the one it selects.
TEST(ModelRunnerConditional, RequestsGiveOnlyTheSelectedSubModelsAnchors) {
  TempPackage package("conditional");
  testing::writeConditionalModel(package.path());
  DeviceManager manager(simOptions(1));
  for (DeviceKind kind : {DeviceKind::kCpu, DeviceKind::kSim}) {
    ModelRunnerConfig config;
    config.device_kind = kind;
    config.device_manager = &manager;
    config.validate_io_params = false;
    auto runner = std::make_unique<ModelRunner>(package.path(), config);
    const bool yes = true, no = false;
    const std::vector<float> a{1, 2, 3, 4}, b{5, 6, 7, 8};
    std::vector<float> y(4);
    const OutputMemoryView out{{"y", TensorMemoryView{y.data(), 16}}};
    runner->execute({{"select", ConstTensorMemoryView{&yes, 1}}, {"a", ConstTensorMemoryView{a.data(), 16}}}, out);
    EXPECT_EQ(y, (std::vector<float>{2, 4, 6, 8}));
    runner->execute({{"select", ConstTensorMemoryView{&no, 1}}, {"b", ConstTensorMemoryView{b.data(), 16}}}, out);
    EXPECT_EQ(y, (std::vector<float>{15, 16, 17, 18}));
    // Sizes are still checked.
    EXPECT_THROW(runner->execute({{"select", ConstTensorMemoryView{&no, 1}}, {"b", ConstTensorMemoryView{b.data(), 8}}}, out),
                 UsageError);
    runner.reset();  // lets go of the device

    config.validate_io_params = true;
    ModelRunner strict(package.path(), config);
    EXPECT_THROW(
        strict.execute({{"select", ConstTensorMemoryView{&yes, 1}}, {"a", ConstTensorMemoryView{a.data(), 16}}}, out),
        UsageError);
  }
}

TEST(ModelRunnerDevices, BusyDeviceFailsOrWaitsAsConfigured) {
  TempPackage package("busy");
  testing::writeAffineModel(package.path(), kBatch, kFeatures);
  DeviceManager manager(simOptions(1));
  ModelRunnerConfig config;
  config.device_kind = DeviceKind::kSim;
  config.device_manager = &manager;
  auto first = std::make_unique<ModelRunner>(package.path(), config);
  EXPECT_THROW(ModelRunner(package.path(), config), DeviceBusyError);
  config.device_wait_config = DeviceWaitConfig{WaitStrategy::kWaitWithTimeout, std::chrono::seconds(10),
                                               std::chrono::milliseconds(5)};
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    first.reset();
  });
  ModelRunner second(package.path(), config);  // gets sim:0 once the first lets go
  release.join();
  const std::vector<float> x = rows(kBatch, 0.0f);
  expectNear(floats(second.execute(inputOf(x)).at("y")), affineReference(x, kFeatures));
}

// thread_safe = false: a call that overlaps another is refused. The first
// caller is held inside executeAsync by back-pressure (queues of two
// entries in front of a device with 50-ms transfers).
TEST(ModelRunnerThreads, OverlappingCallsAreRefusedWithoutThreadSafety) {
  TempPackage package("not_thread_safe");
  testing::writeAffineModel(package.path(), kBatch, kFeatures);
  SimDeviceConfig sim;
  sim.transfer_latency_ns = 50'000'000;
  DeviceManager manager(simOptions(1, sim));
  ModelRunnerConfig config;
  config.device_kind = DeviceKind::kSim;
  config.device_manager = &manager;
  config.thread_safe = false;
  config.ring_buffer_size_multiplier = 1;
  config.pipeline_depth = 1;
  ModelRunner runner(package.path(), config);
  const std::vector<float> x = rows(kBatch, 0.0f);
  std::atomic<bool> started{false};
  std::vector<Future<OutputTensors>> results;
  std::thread first([&] {
    started = true;
    for (int i = 0; i < 6; ++i) results.push_back(runner.executeAsync(inputOf(x)));
  });
  while (!started) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(40));  // the first caller is waiting for room by now
  try {
    runner.executeAsync(inputOf(x));
    ADD_FAILURE() << "an overlapping call must be refused";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("thread_safe"), std::string::npos) << e.what();
  }
  first.join();
  for (auto& result : results) expectNear(floats(result.get().at("y")), affineReference(x, kFeatures));
}

TEST(ModelRunnerThreads, ManyThreadsCallAtOnce) {
  TempPackage package("threads");
  testing::writeAffineModel(package.path(), kBatch, kFeatures);
  DeviceManager manager(simOptions(1));
  for (DeviceKind kind : {DeviceKind::kCpu, DeviceKind::kSim}) {
    ModelRunnerConfig config;
    config.device_kind = kind;
    config.device_manager = &manager;
    config.batching_dim = 0;
    config.timeout_ns = std::chrono::microseconds(500);
    ModelRunner runner(package.path(), config);
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 50; ++i) {
          const std::vector<float> x = rows(1 + (t + i) % 5, static_cast<float>(t * 100 + i));
          const std::vector<float> y = floats(runner.execute(inputOf(x)).at("y"));
          const std::vector<float> want = affineReference(x, kFeatures);
          for (size_t k = 0; k < y.size(); ++k) {
            if (!near(y[k], want[k])) {
              ++wrong;
              break;
            }
          }
        }
      });
    }
    for (auto& thread : threads) thread.join();
    EXPECT_EQ(wrong.load(), 0) << deviceKindName(kind);
  }
}

// The GPU libraries load on first use (kernels/cuda/lazy_libraries.cc):
// listing devices and running a cpu package must not map cuBLAS, cuBLASLt
// or NVRTC, which cost ~180 MiB of resident memory when linked.
TEST(ModelRunnerCpu, LeavesTheGpuLibrariesUnloaded) {
  const auto mapped = [] {
    std::ifstream maps("/proc/self/maps");
    std::string line, found;
    while (std::getline(maps, line)) {
      for (const char* name : {"libcublas", "libnvrtc"}) {
        if (line.find(name) != std::string::npos) found = line;
      }
    }
    return found;
  };
  DeviceManager manager;
  bool gpu = false;
  for (const DeviceInfo& info : manager.devices()) gpu |= info.kind == DeviceKind::kCuda;
  // On a GPU machine, an earlier test of this process (run as one binary)
  // may have used the cuda device; without one, nothing may have loaded them.
  if (gpu && !mapped().empty()) GTEST_SKIP() << "a cuda test of this process loaded them: " << mapped();
  EXPECT_EQ(mapped(), "");
  TempPackage package("cpu_only");
  testing::writeAffineModel(package.path(), kBatch, kFeatures);
  ModelRunner runner(package.path());
  const std::vector<float> x = rows(kBatch, 1.0f);
  expectNear(floats(runner.execute(inputOf(x)).at("y")), affineReference(x, kFeatures));
  EXPECT_EQ(mapped(), "");
}

}  // namespace
}  // namespace kiln

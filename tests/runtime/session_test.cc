// Executable and Session on real devices (cpu, sim): loading, automatic
// binding with exclusion predicates, the main loop over queues (wrap-around,
// back-pressure, row gathering), device memory limits and resets.
#include "kiln/session.h"

#include <gtest/gtest.h>

#include <thread>

#include "kiln/error.h"
#include "kiln/package_reader.h"
#include "kiln/package_writer.h"
#include "tests/format/package_edit.h"
#include "tests/runtime/runtime_test_models.h"
#include "tests/support/allocation_counter.h"

namespace kiln {
namespace {

using testing::affineReference;
using testing::kBatch;
using testing::kFeatures;
using testing::near;
using testing::simOptions;
using testing::TempPackage;

std::vector<float> rampRows(size_t count, float start) { return testing::rows(count, start); }

void expectNear(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(near(got[i], want[i])) << "element " << i << ": " << got[i] << " vs " << want[i];
}

struct Counter {
  std::atomic<uint64_t> rows{0};
  std::atomic<uint64_t> errors{0};
  static void done(void* context, uint64_t rows, const std::exception_ptr& error) {
    auto* counter = static_cast<Counter*>(context);
    if (error) counter->errors.fetch_add(1);
    counter->rows.fetch_add(rows);
  }
};

class SessionTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    testing::writeAffineModel(package_.path(), kBatch, kFeatures);
    reader_ = std::make_shared<const PackageReader>(package_.path());
    manager_ = std::make_unique<DeviceManager>(simOptions(1));
  }
  std::shared_ptr<Device> device() { return manager_->getSpecificDevice(GetParam()); }

  TempPackage package_{"affine"};
  std::shared_ptr<const PackageReader> reader_;
  std::unique_ptr<DeviceManager> manager_;
};

// Entries of 1..7 rows through queues of capacity 2: the main loop gathers
// rows into device batches of 4, splitting entries across batches, and the
// producer waits for room (back-pressure) while the ring wraps many times.
TEST_P(SessionTest, GathersRowsFromQueuesIntoBatches) {
  Session session(reader_, device());
  session.runLoadPrograms();
  QueueManager& queues = session.createQueueManager(2, 0);
  TensorQueue& x = queues.inputQueue("x");
  TensorQueue& y = queues.outputQueue("y");
  EXPECT_EQ(x.capacity(), 2u);
  EXPECT_EQ(x.layout().batch_rows, 4u);
  std::thread loop([&] { session.runMainPrograms(); });

  std::vector<std::vector<float>> inputs, outputs;
  size_t total_rows = 0;
  for (size_t i = 0; i < 60; ++i) {
    const size_t rows = 1 + i % 7;
    total_rows += rows;
    inputs.push_back(rampRows(rows, static_cast<float>(i)));
    outputs.emplace_back(rows * kFeatures, -1.0f);
  }
  // Pad to whole batches so that no flush is needed.
  const size_t pad = (kBatch - total_rows % kBatch) % kBatch;
  if (pad > 0) {
    inputs.push_back(rampRows(pad, 99.0f));
    outputs.emplace_back(pad * kFeatures, -1.0f);
    total_rows += pad;
  }
  Counter counter;
  for (size_t i = 0; i < inputs.size(); ++i) {
    x.enqueue(reinterpret_cast<std::byte*>(inputs[i].data()), inputs[i].size() * 4, &Counter::done, &counter);
    y.enqueue(reinterpret_cast<std::byte*>(outputs[i].data()), outputs[i].size() * 4, &Counter::done, &counter);
  }
  while (counter.rows.load() < 2 * total_rows) std::this_thread::yield();
  session.stop();
  loop.join();
  EXPECT_EQ(counter.errors.load(), 0u);
  EXPECT_EQ(session.batchesRun(), total_rows / kBatch);
  EXPECT_EQ(session.batchesFlushed(), 0u);
  for (size_t i = 0; i < inputs.size(); ++i) expectNear(outputs[i], affineReference(inputs[i], kFeatures));
}

// stop() with a partial batch runs it padded: every queued row is answered.
TEST_P(SessionTest, StopFlushesThePartialBatch) {
  SessionOptions options;
  options.timeout = std::chrono::seconds(30);
  Session session(reader_, device(), options);
  session.runLoadPrograms();
  QueueManager& queues = session.createQueueManager(4, 0);
  std::vector<float> in = rampRows(3, 1.0f), out(3 * kFeatures);
  Counter counter;
  queues.inputQueue("x").enqueue(reinterpret_cast<std::byte*>(in.data()), in.size() * 4);
  queues.outputQueue("y").enqueue(reinterpret_cast<std::byte*>(out.data()), out.size() * 4, &Counter::done, &counter);
  std::thread loop([&] { session.runMainPrograms(); });
  queues.flushAll();
  while (counter.rows.load() < 3) std::this_thread::yield();
  session.stop();
  loop.join();
  expectNear(out, affineReference(in, kFeatures));
  EXPECT_EQ(session.batchesFlushed(), 1u);
}

// stop() takes effect after the batch in flight even while producers keep
// every batch full (the loop only looked at it when a batch was partial, so
// it ran on for as long as the producers did). The entries left queued stay
// queued; failQueuedEntries answers them.
TEST_P(SessionTest, StopEndsTheLoopWhileProducersKeepBatchesFull) {
  Session session(reader_, device());
  session.runLoadPrograms();
  QueueManager& queues = session.createQueueManager(8, 0);
  const std::vector<float> in = rampRows(kBatch, 1.0f);
  std::vector<float> out(kBatch * kFeatures);
  Counter counter;
  std::atomic<bool> producing{true};
  std::thread producer([&] {
    try {
      while (producing.load()) {
        queues.inputQueue("x").enqueue(reinterpret_cast<std::byte*>(const_cast<float*>(in.data())), in.size() * 4);
        queues.outputQueue("y").enqueue(reinterpret_cast<std::byte*>(out.data()), out.size() * 4, &Counter::done,
                                        &counter);
      }
    } catch (const UsageError&) {  // disconnected at the end
    }
  });
  std::atomic<bool> returned{false};
  std::thread loop([&] {
    session.runMainPrograms();
    returned = true;
  });
  while (counter.rows.load() < 20 * kBatch) std::this_thread::yield();
  session.stop();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!returned.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(returned.load()) << "stop() had no effect while the batches kept coming full";
  producing = false;
  queues.disconnectAll();  // releases the producer (and the loop, if stop failed)
  producer.join();
  loop.join();
  session.failQueuedEntries(std::make_exception_ptr(UsageError("stopped")));
  EXPECT_EQ(counter.rows.load() % kBatch, 0u);
}

// Excluded from automatic binding: the user must bind the weights, and the
// model then runs with them.
TEST_P(SessionTest, ExcludedAnchorsAreBoundByTheUser) {
  SessionOptions options;
  options.exclude_from_binding.push_back([](const Anchor& anchor) { return anchor.name == "w"; });
  Session session(reader_, device(), options);
  EXPECT_EQ(session.unboundLoadAnchors(), std::vector<std::string>{"w"});
  try {
    session.runLoadPrograms();
    FAIL() << "loading without the excluded weights must fail";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("w"), std::string::npos) << e.what();
  }
  const std::vector<float> wrong(3);
  EXPECT_THROW(session.bindTensor("w", std::as_bytes(std::span(wrong))), UsageError);
  EXPECT_THROW(session.bindTensor("nope", std::as_bytes(std::span(wrong))), UsageError);
  const std::vector<float> zeros(kFeatures * kFeatures, 0.0f);
  session.bindTensor("w", std::as_bytes(std::span(zeros)));
  session.runLoadPrograms();
  QueueManager& queues = session.createQueueManager(2, 0);
  std::vector<float> in = rampRows(kBatch, 3.0f), out(kBatch * kFeatures);
  Counter counter;
  queues.inputQueue("x").enqueue(reinterpret_cast<std::byte*>(in.data()), in.size() * 4);
  queues.outputQueue("y").enqueue(reinterpret_cast<std::byte*>(out.data()), out.size() * 4, &Counter::done, &counter);
  std::thread loop([&] { session.runMainPrograms(); });
  while (counter.rows.load() < kBatch) std::this_thread::yield();
  session.stop();
  loop.join();
  // x @ 0 + b = b on every row.
  for (int64_t r = 0; r < kBatch; ++r) {
    for (int64_t j = 0; j < kFeatures; ++j) EXPECT_EQ(out[r * kFeatures + j], static_cast<float>(j));
  }
}

TEST_P(SessionTest, QueueErrorsAreClear) {
  Session session(reader_, device());
  EXPECT_THROW(session.runMainPrograms(), UsageError);  // not loaded
  session.runLoadPrograms();
  EXPECT_THROW(session.runMainPrograms(), UsageError);  // no queues
  QueueManager& queues = session.createQueueManager(2, 0);
  try {
    queues.inputQueue("z");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("x"), std::string::npos) << e.what();  // lists the queues
  }
  std::vector<float> odd(kFeatures + 1);
  EXPECT_THROW(queues.inputQueue("x").enqueue(reinterpret_cast<std::byte*>(odd.data()), odd.size() * 4), UsageError);
  // After disconnectAll, enqueue refuses and runMainPrograms returns.
  queues.disconnectAll();
  std::vector<float> row(kFeatures);
  EXPECT_THROW(queues.inputQueue("x").enqueue(reinterpret_cast<std::byte*>(row.data()), row.size() * 4), UsageError);
  session.runMainPrograms();
}

// After warm-up, running batches from the queues allocates nothing, on any
// thread (the main loop, the sim device's transfer and compute threads):
// an elementwise model, whose kernels are kiln's own (oneDNN primitives
// allocate inside every call; see tests/kernels/allocation_test.cc).
TEST_P(SessionTest, SteadyStateMakesNoHeapAllocation) {
  TempPackage package("steady");
  testing::writeMiddleBatchModel(package.path(), 2, 4, 8);
  Session session(std::make_shared<const PackageReader>(package.path()), device());
  session.runLoadPrograms();
  QueueManager& queues = session.createQueueManager(8, 1);
  std::thread loop([&] { session.runMainPrograms(); });
  std::vector<float> in(2 * 4 * 8, 1.0f), out(in.size());
  Counter counter;
  auto runBatches = [&](uint64_t batches) {
    const uint64_t target = counter.rows.load() + batches * 4;
    for (uint64_t b = 0; b < batches; ++b) {
      queues.inputQueue("x").enqueue(reinterpret_cast<std::byte*>(in.data()), in.size() * 4);
      queues.outputQueue("y").enqueue(reinterpret_cast<std::byte*>(out.data()), out.size() * 4, &Counter::done,
                                      &counter);
    }
    while (counter.rows.load() < target) std::this_thread::yield();
  };
  runBatches(20);  // warm-up
  testing::startCountingAllocations();
  runBatches(200);
  const testing::AllocationCount count = testing::stopCountingAllocations();
  session.stop();
  loop.join();
  EXPECT_EQ(count.news, 0u);
  EXPECT_EQ(count.mallocs, 0u);
  EXPECT_EQ(out[0], 2.0f);  // 1 * 3 - 1
  EXPECT_EQ(counter.errors.load(), 0u);
}

// An input the package feeds (a FeedData blob of three items) is bound
// automatically: the session has no queue for it and runs item k % 3 in
// its k-th batch; a predicate can hand it back to the user.
TEST_P(SessionTest, FeedDataInputsAreFedItemByItem) {
  TempPackage package("feed");
  std::vector<std::vector<float>> items;
  for (int k = 0; k < 3; ++k) items.push_back(rampRows(kBatch, static_cast<float>(10 * k)));
  {
    std::vector<float> all;
    for (const auto& item : items) all.insert(all.end(), item.begin(), item.end());
    testing::rewritePackage(
        PackageReader(package_.path()), package.path(), [](ExecutableSpec&) {}, [](Metadata&) {},
        [&](PackageWriter& writer) {
          writer.writeFeedData("x", TensorInfo{DType::kF32, {kBatch, kFeatures}}, 3, std::as_bytes(std::span(all)));
        });
  }
  auto reader = std::make_shared<const PackageReader>(package.path());
  {
    Session session(reader, device());
    EXPECT_TRUE(session.userInputs().empty());
    session.runLoadPrograms();
    QueueManager& queues = session.createQueueManager(8, 0);
    std::vector<std::vector<float>> outputs(5, std::vector<float>(kBatch * kFeatures));
    Counter counter;
    for (auto& out : outputs) {
      queues.outputQueue("y").enqueue(reinterpret_cast<std::byte*>(out.data()), out.size() * 4, &Counter::done, &counter);
    }
    std::thread loop([&] { session.runMainPrograms(); });
    while (counter.rows.load() < outputs.size() * kBatch) std::this_thread::yield();
    session.stop();
    loop.join();
    for (size_t k = 0; k < outputs.size(); ++k) expectNear(outputs[k], affineReference(items[k % 3], kFeatures));
  }
  SessionOptions options;
  options.exclude_from_binding.push_back([](const Anchor& anchor) { return anchor.name == "x"; });
  Session excluded(reader, device(), options);
  ASSERT_EQ(excluded.userInputs().size(), 1u);
  EXPECT_EQ(excluded.userInputs()[0].name, "x");
}

INSTANTIATE_TEST_SUITE_P(Devices, SessionTest, ::testing::Values("cpu", "sim:0"));

TEST(SimExecutable, ModelLargerThanDeviceMemoryIsAClearError) {
  TempPackage package("affine_big");
  testing::writeAffineModel(package.path(), kBatch, 256);  // 256 KiB of weights
  SimDeviceConfig sim;
  sim.memory_bytes = 64 << 10;
  DeviceManager manager(simOptions(1, sim));
  auto reader = std::make_shared<const PackageReader>(package.path());
  try {
    Session session(reader, manager.getSpecificDevice("sim:0"));
    FAIL() << "a model larger than the device must not load";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("needs"), std::string::npos) << message;
    EXPECT_NE(message.find("sim:0"), std::string::npos) << message;
  }
}

// A reset loses device memory (sim fills it with 0xCD): the main program
// refuses to run until the load programs ran again, then is correct.
TEST(SimExecutable, ResetNeedsTheLoadProgramsAgain) {
  TempPackage package("affine_reset");
  testing::writeAffineModel(package.path(), kBatch, kFeatures);
  DeviceManager manager(simOptions(1));
  auto device = manager.getSpecificDevice("sim:0");
  Executable executable(std::make_shared<const PackageReader>(package.path()), "", device);
  auto reader = PackageReader(package.path());
  auto load = [&](const Anchor& anchor) { return reader.findTensorData(anchor.name)->data(); };
  executable.runLoad(load);
  EXPECT_GT(executable.deviceBytes(), static_cast<uint64_t>(kFeatures * kFeatures * 4));
  device->reset();
  executable.invalidate();
  std::vector<const std::byte*> in{nullptr};
  std::vector<std::byte*> out{nullptr};
  EXPECT_THROW(executable.runMain(in, out), UsageError);
  executable.runLoad(load);
  EXPECT_TRUE(executable.loaded());
}

}  // namespace
}  // namespace kiln

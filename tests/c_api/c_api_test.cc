// The C API (include/kiln/c_api.h) on real packages: statuses and messages
// for bad files and bad calls (nothing changes), the executor's and the
// runner's results against the model's reference, async callbacks from
// several threads, back-pressure.
#include "kiln/c_api.h"

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/version.h"
#include "tests/runtime/runtime_test_models.h"

namespace kiln {
namespace {

using testing::kBatch;
using testing::kFeatures;
using testing::matchesAffine;
using testing::rows;
using testing::TempPackage;

constexpr float kSentinel = -7.0f;

kiln_tensor tensor(const char* name, std::vector<float>& values) {
  return kiln_tensor{name, values.data(), values.size() * sizeof(float), KILN_F32};
}

bool untouched(const std::vector<float>& y) {
  return std::all_of(y.begin(), y.end(), [](float v) { return v == kSentinel; });
}

class CApi : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::writeAffineModel(package_file_.path(), kBatch, kFeatures);
    ASSERT_EQ(kiln_package_open(package_file_.path().c_str(), &package_), KILN_OK) << kiln_last_error();
  }
  void TearDown() override { kiln_package_free(package_); }

  TempPackage package_file_{"c_api"};
  kiln_package* package_ = nullptr;
};

TEST(CApiPackages, BadFilesGetTheirStatusAndMessage) {
  kiln_package* package = reinterpret_cast<kiln_package*>(0x1);
  EXPECT_EQ(kiln_package_open("/no/such/file.kiln", &package), KILN_IO_ERROR);
  EXPECT_EQ(package, nullptr);
  EXPECT_NE(std::string(kiln_last_error()).find("/no/such/file.kiln"), std::string::npos) << kiln_last_error();

  TempPackage garbage("garbage");
  std::ofstream(garbage.path()) << "this is not a kiln package, only some text of a fair length";
  EXPECT_EQ(kiln_package_open(garbage.path().c_str(), &package), KILN_FORMAT_ERROR);
  EXPECT_STRNE(kiln_last_error(), "");

  EXPECT_EQ(kiln_package_open(nullptr, &package), KILN_INVALID_ARGUMENT);
  EXPECT_STREQ(kiln_last_error(), "path is NULL");
  EXPECT_STREQ(kiln_status_name(KILN_FORMAT_ERROR), "KILN_FORMAT_ERROR");
  EXPECT_STREQ(kiln_version(), KILN_VERSION);
  kiln_package_free(nullptr);  // a no-op, as every *_free
  kiln_executor_free(nullptr);
  kiln_runner_free(nullptr);
}

TEST_F(CApi, ExecutorDescribesAndRunsTheModel) {
  kiln_executor* executor = nullptr;
  ASSERT_EQ(kiln_executor_create(package_, nullptr, &executor), KILN_OK) << kiln_last_error();
  ASSERT_EQ(kiln_executor_input_count(executor), 1u);
  ASSERT_EQ(kiln_executor_output_count(executor), 1u);
  kiln_tensor_info info;
  ASSERT_EQ(kiln_executor_input_info(executor, 0, &info), KILN_OK);
  EXPECT_STREQ(info.name, "x");
  EXPECT_EQ(info.dtype, KILN_F32);
  ASSERT_EQ(info.rank, 2u);
  EXPECT_EQ(info.shape[0], kBatch);
  EXPECT_EQ(info.shape[1], kFeatures);
  EXPECT_EQ(info.bytes, static_cast<uint64_t>(kBatch * kFeatures * 4));
  EXPECT_EQ(kiln_executor_output_info(executor, 1, &info), KILN_INVALID_ARGUMENT);

  std::vector<float> x = rows(kBatch, 1.0f), y(x.size(), kSentinel);
  const kiln_tensor in = tensor("x", x), out = tensor("y", y);
  ASSERT_EQ(kiln_executor_run(executor, &in, 1, &out, 1), KILN_OK) << kiln_last_error();
  EXPECT_TRUE(matchesAffine(y, x));
  kiln_executor_free(executor);
}

TEST_F(CApi, ExecutorRefusesBadCallsAndWritesNothing) {
  kiln_executor* executor = nullptr;
  ASSERT_EQ(kiln_executor_create(package_, nullptr, &executor), KILN_OK);
  std::vector<float> x = rows(kBatch, 1.0f), y(x.size(), kSentinel), short_x(3);
  const kiln_tensor out = tensor("y", y);
  auto run = [&](kiln_tensor in) { return kiln_executor_run(executor, &in, 1, &out, 1); };

  EXPECT_EQ(run(tensor("z", x)), KILN_INVALID_ARGUMENT);
  EXPECT_STREQ(kiln_last_error(), "inputs 'x' is missing");
  EXPECT_EQ(run(tensor("x", short_x)), KILN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("has 12 bytes; the model wants 128"), std::string::npos);
  kiln_tensor wrong_dtype = tensor("x", x);
  wrong_dtype.dtype = KILN_I32;
  EXPECT_EQ(run(wrong_dtype), KILN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("dtype"), std::string::npos);
  EXPECT_EQ(kiln_executor_run(executor, nullptr, 1, &out, 1), KILN_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_executor_run(executor, nullptr, 0, &out, 1), KILN_INVALID_ARGUMENT);  // 0 inputs of 1
  EXPECT_EQ(kiln_executor_run(nullptr, nullptr, 0, nullptr, 0), KILN_INVALID_ARGUMENT);
  EXPECT_TRUE(untouched(y));

  kiln_executor_options options{"no-such-model", 0};
  kiln_executor* other = nullptr;
  EXPECT_NE(kiln_executor_create(package_, &options, &other), KILN_OK);
  EXPECT_EQ(other, nullptr);
  EXPECT_NE(std::string(kiln_last_error()).find("no-such-model"), std::string::npos) << kiln_last_error();
  kiln_executor_free(executor);
}

TEST_F(CApi, RunnerBatchesRequestsOfAnyRows) {
  kiln_runner_options options;
  kiln_runner_options_init(&options);
  options.batching_dim = 0;
  options.timeout_us = 1000;
  kiln_runner* runner = nullptr;
  ASSERT_EQ(kiln_runner_create(package_, &options, &runner), KILN_OK) << kiln_last_error();
  kiln_package_free(package_);  // the runner holds what it needs
  package_ = nullptr;
  kiln_tensor_info info;
  ASSERT_EQ(kiln_runner_output_info(runner, 0, &info), KILN_OK);
  EXPECT_STREQ(info.name, "y");
  for (size_t count : {1u, 3u, 9u}) {
    std::vector<float> x = rows(count, static_cast<float>(count)), y(x.size(), kSentinel);
    const kiln_tensor in = tensor("x", x), out = tensor("y", y);
    ASSERT_EQ(kiln_runner_execute(runner, &in, 1, &out, 1), KILN_OK) << kiln_last_error();
    EXPECT_TRUE(matchesAffine(y, x)) << count << " rows";
  }
  std::vector<float> x = rows(2, 0.0f), y(3 * kFeatures, kSentinel);  // 2 rows in, room for 3 out
  const kiln_tensor in = tensor("x", x), out = tensor("y", y);
  EXPECT_EQ(kiln_runner_execute(runner, &in, 1, &out, 1), KILN_INVALID_ARGUMENT);
  EXPECT_STRNE(kiln_last_error(), "");
  EXPECT_TRUE(untouched(y));
  kiln_runner_free(runner);
}

// What an async request's callback saw.
struct Answer {
  std::vector<float> x, y;
  std::atomic<int> calls{0};
  std::atomic<int> status{-1};
};

void record(void* user_data, kiln_status status, const char*) {
  auto* answer = static_cast<Answer*>(user_data);
  answer->status = status;
  ++answer->calls;
}

TEST_F(CApi, AsyncCallbacksAnswerEveryRequestOnce) {
  kiln_runner_options options;
  kiln_runner_options_init(&options);
  options.batching_dim = 0;
  options.timeout_us = 500;
  kiln_runner* runner = nullptr;
  ASSERT_EQ(kiln_runner_create(package_, &options, &runner), KILN_OK) << kiln_last_error();
  constexpr int kThreads = 4, kEach = 50;
  std::vector<Answer> answers(kThreads * kEach);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        Answer& answer = answers[t * kEach + i];
        answer.x = rows(1 + i % 3, static_cast<float>(t * 100 + i));
        answer.y.assign(answer.x.size(), kSentinel);
        const kiln_tensor in = tensor("x", answer.x), out = tensor("y", answer.y);
        // Waits for room when the queues are full: every request goes in.
        EXPECT_EQ(kiln_runner_execute_async(runner, &in, 1, &out, 1, record, &answer), KILN_OK) << kiln_last_error();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  kiln_runner_free(runner);  // waits for every request taken
  for (const Answer& answer : answers) {
    EXPECT_EQ(answer.calls.load(), 1);
    EXPECT_EQ(answer.status.load(), KILN_OK);
    EXPECT_TRUE(matchesAffine(answer.y, answer.x));
  }
  EXPECT_EQ(kiln_runner_execute_async(nullptr, nullptr, 0, nullptr, 0, record, nullptr), KILN_INVALID_ARGUMENT);
}

TEST_F(CApi, FullQueuesAnswerUnavailableWhenTryingOnly) {
  // A slow sim device (20 ms a copy; the C API takes its devices from the
  // environment) and the default queues: requests sent faster than it runs
  // them are refused, not queued without bound.
  kiln_runner_options options;
  kiln_runner_options_init(&options);
  options.device = "sim";
  kiln_runner* runner = nullptr;
  setenv("KILN_SIM_DEVICES", "1", 1);
  setenv("KILN_SIM_LATENCY_US", "20000", 1);
  setenv("KILN_DEVICE_LOCK_DIR", testing::privateLockDir().c_str(), 1);
  const kiln_status created = kiln_runner_create(package_, &options, &runner);
  unsetenv("KILN_SIM_LATENCY_US");
  unsetenv("KILN_SIM_DEVICES");
  ASSERT_EQ(created, KILN_OK) << kiln_last_error();
  std::vector<Answer> answers(64);
  int refused = 0;
  for (Answer& answer : answers) {
    answer.x = rows(kBatch, 1.0f);
    answer.y.assign(answer.x.size(), kSentinel);
    const kiln_tensor in = tensor("x", answer.x), out = tensor("y", answer.y);
    const kiln_status s = kiln_runner_try_execute_async(runner, &in, 1, &out, 1, record, &answer);
    if (s == KILN_UNAVAILABLE) {
      ++refused;
      EXPECT_NE(std::string(kiln_last_error()).find("queues are full"), std::string::npos);
    }
  }
  kiln_runner_free(runner);
  EXPECT_GT(refused, 0);
  for (const Answer& answer : answers) {
    if (answer.calls.load() == 0) continue;  // refused
    EXPECT_EQ(answer.calls.load(), 1);
    EXPECT_TRUE(matchesAffine(answer.y, answer.x));
  }
}

}  // namespace
}  // namespace kiln

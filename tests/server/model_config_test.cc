// config.json parsing and model names (server/model_config.h).
#include <gtest/gtest.h>

#include "kiln/error.h"
#include "server/model_config.h"

namespace kiln::server {
namespace {

TEST(ModelConfig, ParsesEveryKey) {
  const ModelConfig config = parseModelConfig(
      R"({"max_batch_size": 16, "batching_dim": 0, "max_queue_delay_microseconds": 500, "max_queue_rows": 64,
          "adaptive_queue_delay": 0.25, "instances": 2, "threads": 1, "device": "sim", "version_policy": "all"})",
      "config.json");
  EXPECT_EQ(config.max_batch_size, 16);
  EXPECT_EQ(config.batching_dim, 0);
  EXPECT_EQ(config.max_queue_delay.count(), 500);
  EXPECT_EQ(config.max_queue_rows, 64);
  EXPECT_EQ(config.adaptive_queue_delay, 0.25);
  EXPECT_EQ(config.instances, 2u);
  EXPECT_EQ(config.threads, 1);
  EXPECT_EQ(config.device_kind, DeviceKind::kSim);
  EXPECT_EQ(config.version_policy, VersionPolicy::kAll);
  EXPECT_FALSE(parseModelConfig("{}", "c").batching_dim.has_value());
}

TEST(ModelConfig, RefusesTyposAndBadValuesByName) {
  auto error = [](const std::string& text) {
    try {
      parseModelConfig(text, "m/config.json");
      return std::string();
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
  };
  EXPECT_NE(error(R"({"max_batch_szie": 4})").find("unknown key \"max_batch_szie\""), std::string::npos);
  EXPECT_NE(error(R"({"instances": 0})").find("\"instances\" is 0"), std::string::npos);
  EXPECT_NE(error(R"({"instances": "2"})").find("must be an integer"), std::string::npos);
  EXPECT_NE(error(R"({"device": "tpu"})").find("unknown device kind"), std::string::npos);
  EXPECT_NE(error(R"({"adaptive_queue_delay": 2})").find("in [0, 1]"), std::string::npos);
  EXPECT_NE(error(R"({"version_policy": "some"})").find("\"latest\" or \"all\""), std::string::npos);
  EXPECT_NE(error("[1]").find("JSON object"), std::string::npos);
  EXPECT_NE(error("{").find("m/config.json: not valid JSON"), std::string::npos);
}

TEST(ModelNames, StayInsideTheRepository) {
  EXPECT_TRUE(isValidModelName("resnet50"));
  EXPECT_TRUE(isValidModelName("bert-base_v1.2"));
  for (const char* name : {"", ".", "..", ".hidden", "a/b", "../x", "a\\b", "a b", "%2e%2e", "a\nb"}) {
    EXPECT_FALSE(isValidModelName(name)) << name;
  }
  EXPECT_FALSE(isValidModelName(std::string(129, 'a')));
}

}  // namespace
}  // namespace kiln::server

#include "server/model_config.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "kiln/error.h"

namespace kiln::server {
namespace {

using nlohmann::json;

[[noreturn]] void refuse(const std::string& source, const std::string& problem) {
  throw UsageError(source + ": " + problem);
}

int64_t integer(const json& value, const std::string& key, const std::string& source, int64_t lowest,
                int64_t highest) {
  if (!value.is_number_integer()) refuse(source, "\"" + key + "\" must be an integer");
  const int64_t n = value.get<int64_t>();
  if (n < lowest || n > highest) {
    refuse(source, "\"" + key + "\" is " + std::to_string(n) + "; it must be in [" + std::to_string(lowest) + ", " +
                       std::to_string(highest) + "]");
  }
  return n;
}

}  // namespace

bool isValidModelName(const std::string& name) {
  if (name.empty() || name.size() > 128 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
  });
}

ModelConfig parseModelConfig(const std::string& json_text, const std::string& source) {
  json document;
  try {
    document = json::parse(json_text);
  } catch (const json::parse_error& e) {
    refuse(source, std::string("not valid JSON: ") + e.what());
  }
  if (!document.is_object()) refuse(source, "must hold a JSON object");
  ModelConfig config;
  for (const auto& [key, value] : document.items()) {
    if (key == "max_batch_size") {
      config.max_batch_size = integer(value, key, source, 0, int64_t{1} << 30);
    } else if (key == "batching_dim") {
      config.batching_dim = integer(value, key, source, -1, 7);
    } else if (key == "max_queue_delay_microseconds") {
      config.max_queue_delay = std::chrono::microseconds(integer(value, key, source, 0, 10'000'000));
    } else if (key == "adaptive_queue_delay") {
      if (!value.is_number() || value.get<double>() < 0 || value.get<double>() > 1) {
        refuse(source, "\"adaptive_queue_delay\" must be a number in [0, 1]");
      }
      config.adaptive_queue_delay = value.get<double>();
    } else if (key == "max_queue_rows") {
      config.max_queue_rows = integer(value, key, source, 0, int64_t{1} << 24);
    } else if (key == "instances") {
      config.instances = static_cast<uint32_t>(integer(value, key, source, 1, 256));
    } else if (key == "threads") {
      config.threads = static_cast<int>(integer(value, key, source, 0, 1024));
    } else if (key == "device") {
      if (!value.is_string()) refuse(source, "\"device\" must be a string: cpu, sim or cuda");
      try {
        config.device_kind = parseDeviceKind(value.get<std::string>());
      } catch (const Error& e) {
        refuse(source, std::string("\"device\": ") + e.what());
      }
    } else if (key == "version_policy") {
      const std::string policy = value.is_string() ? value.get<std::string>() : "";
      if (policy == "latest") {
        config.version_policy = VersionPolicy::kLatest;
      } else if (policy == "all") {
        config.version_policy = VersionPolicy::kAll;
      } else {
        refuse(source, "\"version_policy\" must be \"latest\" or \"all\"");
      }
    } else {
      refuse(source,
             "unknown key \"" + key +
                 "\" (known: max_batch_size, batching_dim, max_queue_delay_microseconds, adaptive_queue_delay, "
                 "max_queue_rows, "
                 "instances, threads, device, version_policy)");
    }
  }
  return config;
}

}  // namespace kiln::server

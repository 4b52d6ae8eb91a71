#include "server/protocol_json.h"

#include "kiln/version.h"
#include "server/datatype.h"

namespace kiln::server {
namespace {

using nlohmann::json;

json duration(uint64_t count, uint64_t ns) { return {{"count", count}, {"ns", ns}}; }

json tensorsMetadata(const std::vector<TensorSpec>& tensors) {
  json list = json::array();
  for (const TensorSpec& t : tensors) list.push_back({{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape}});
  return list;
}

json tensorsConfig(const ServedModel& model, const std::vector<TensorSpec>& tensors) {
  json list = json::array();
  for (const TensorSpec& t : tensors) {
    list.push_back({{"name", t.name}, {"data_type", configDatatype(t.dtype)}, {"dims", model.configDims(t)}});
  }
  return list;
}

}  // namespace

const std::vector<std::string>& serverExtensions() {
  static const std::vector<std::string> extensions{"binary_tensor_data", "model_repository", "statistics",
                                                   "model_configuration"};
  return extensions;
}

json serverMetadataJson() {
  return {{"name", "kiln"}, {"version", std::string(kKilnVersion)}, {"extensions", serverExtensions()}};
}

json modelMetadataJson(const ServedModel& model, const std::vector<std::string>& versions) {
  return {{"name", model.name()},
          {"versions", versions},
          {"platform", "kiln"},
          {"inputs", tensorsMetadata(model.inputs())},
          {"outputs", tensorsMetadata(model.outputs())}};
}

json modelConfigJson(const ServedModel& model) {
  const ModelConfig& config = model.config();
  json document = {{"name", model.name()},
                   {"platform", "kiln"},
                   {"backend", "kiln"},
                   {"max_batch_size", model.configMaxBatchSize()},
                   {"input", tensorsConfig(model, model.inputs())},
                   {"output", tensorsConfig(model, model.outputs())},
                   {"instance_group",
                    json::array({{{"name", model.name()},
                                  {"kind", config.device_kind == DeviceKind::kCuda ? "KIND_GPU" : "KIND_CPU"},
                                  {"count", config.instances}}})}};
  if (model.batching()) {
    document["dynamic_batching"] = {{"max_queue_delay_microseconds", config.max_queue_delay.count()}};
  }
  return document;
}

json modelStatisticsJson(const std::vector<std::shared_ptr<ServedModel>>& models) {
  json list = json::array();
  for (const auto& model : models) {
    const ServedModelStatistics s = model->statistics();
    json batches = json::array();
    for (const auto& [rows, count] : s.batches_by_rows) {
      batches.push_back({{"batch_size", rows},
                         {"compute_input", duration(0, 0)},
                         {"compute_infer", duration(count, 0)},
                         {"compute_output", duration(0, 0)}});
    }
    list.push_back({{"name", model->name()},
                    {"version", model->version()},
                    {"last_inference", s.last_inference_ms},
                    {"inference_count", s.inference_count},
                    {"execution_count", s.execution_count},
                    {"inference_stats",
                     {{"success", duration(s.success_count, s.success_ns)},
                      {"fail", duration(s.fail_count, s.fail_ns)},
                      {"queue", duration(s.queue_count, s.queue_ns)},
                      {"compute_input", duration(s.compute_count, 0)},
                      {"compute_infer", duration(s.compute_count, s.compute_ns)},
                      {"compute_output", duration(s.compute_count, 0)},
                      {"cache_hit", duration(0, 0)},
                      {"cache_miss", duration(0, 0)}}},
                    {"batch_stats", std::move(batches)}});
  }
  return {{"model_stats", std::move(list)}};
}

json repositoryIndexJson(const std::vector<ModelIndexEntry>& index) {
  json list = json::array();
  for (const ModelIndexEntry& entry : index) {
    json item = {{"name", entry.name}, {"state", entry.state}};
    if (!entry.version.empty()) item["version"] = entry.version;
    if (!entry.reason.empty()) item["reason"] = entry.reason;
    list.push_back(std::move(item));
  }
  return list;
}

std::vector<std::string> loadedVersions(const ModelRepository& repository, const std::string& name) {
  std::vector<std::string> versions;
  for (const auto& model : repository.loadedModels()) {
    if (model->name() == name) versions.push_back(model->version());
  }
  return versions;
}

}  // namespace kiln::server

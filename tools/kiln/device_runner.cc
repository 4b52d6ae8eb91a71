#include "tools/kiln/device_runner.h"

#include "kiln/dynamic_executor.h"
#include "kiln/error.h"
#include "kiln/package_reader.h"

namespace kiln::cli {

std::optional<DeviceKind> deviceFor(const std::string& package, const std::string& model,
                                    const std::string& device_option) {
  if (!device_option.empty()) {
    const DeviceKind kind = parseDeviceKind(device_option);
    return kind == DeviceKind::kCpu ? std::nullopt : std::optional(kind);
  }
  if (hasRuntimeShapes(package, model)) return std::nullopt;
  PackageReader reader(package);
  const auto all = reader.metadata();
  const MetadataBlob* chosen = model.empty() ? (all.empty() ? nullptr : all.front()) : reader.findMetadata(model);
  if (chosen == nullptr || chosen->metadata().target.device_kind == "cpu") return std::nullopt;
  return parseDeviceKind(chosen->metadata().target.device_kind);
}

DeviceRunner::DeviceRunner(const std::string& package, const std::string& model, DeviceKind kind) {
  ModelRunnerConfig config;
  config.device_kind = kind;
  config.model = model;
  runner_ = std::make_unique<ModelRunner>(std::filesystem::path(package), config);
  for (const DataDesc& desc : runner_->getExecuteInputs()) inputs_.push_back({desc.name, {desc.dtype, desc.shape}});
  for (const DataDesc& desc : runner_->getExecuteOutputs()) outputs_.push_back({desc.name, {desc.dtype, desc.shape}});
}

void DeviceRunner::run(std::span<const std::byte* const> inputs, std::span<std::byte* const> outputs) {
  if (inputs.size() != inputs_.size() || outputs.size() != outputs_.size()) {
    throw UsageError("DeviceRunner::run: wrong number of buffers");
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    input_view_[inputs_[i].name] = {inputs[i], inputs_[i].info.sizeInBytes(), inputs_[i].info.dtype};
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    output_view_[outputs_[i].name] = {outputs[i], outputs_[i].info.sizeInBytes(), outputs_[i].info.dtype};
  }
  runner_->execute(input_view_, output_view_);
}

}  // namespace kiln::cli

#include "tools/kiln/device_runner.h"

#include "kiln/dynamic_executor.h"
#include "kiln/error.h"
#include "kiln/executable.h"
#include "kiln/package_reader.h"
#include "runtime/device_sync.h"

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

DeviceRunner::DeviceRunner(const std::string& package, const std::string& model, DeviceKind kind,
                           bool flush_denormals) {
  ModelRunnerConfig config;
  config.flush_denormals = flush_denormals;
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

void traceOnDevice(const std::string& package, const std::string& model, DeviceKind kind,
                   const std::vector<std::span<const std::byte>>& inputs, int runs, StepTrace& trace) {
  auto reader = std::make_shared<PackageReader>(package);
  DeviceManager manager;
  DeviceConstraints constraints;
  constraints.kind = kind;
  const MetadataBlob* chosen = model.empty() ? reader->metadata().front() : reader->findMetadata(model);
  if (chosen == nullptr) throw UsageError(package + " holds no model named '" + model + "'");
  std::shared_ptr<Device> device = manager.getDevice(chosen->metadata().target, constraints);
  Executable executable(reader, model, device);
  executable.runLoad([&](const Anchor& anchor) { return reader->findTensorData(anchor.name)->data(); });
  // Device buffers for the inputs (copied once) and the outputs.
  std::vector<DeviceBuffer> buffers;
  std::vector<const std::byte*> in;
  std::vector<std::byte*> out;
  std::vector<DeviceJob> copies;
  for (size_t i = 0; i < executable.mainInputs().size(); ++i) {
    buffers.push_back(device->allocate(executable.mainInputs()[i].info.sizeInBytes()));
    DeviceJob job;
    job.kind = DeviceJob::Kind::kCopyToDevice;
    job.destination = buffers.back().data();
    job.source = inputs.at(i).data();
    job.bytes = inputs.at(i).size();
    copies.push_back(job);
    in.push_back(buffers.back().data());
  }
  runJobsAndWait(*device, copies);
  for (const Anchor& anchor : executable.mainOutputs()) {
    buffers.push_back(device->allocate(anchor.info.sizeInBytes()));
    out.push_back(buffers.back().data());
  }
  for (int r = 0; r < runs; ++r) executable.runMainTraced(in, out, trace);
  device->synchronize();
}

}  // namespace kiln::cli

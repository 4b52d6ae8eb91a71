// DynamicExecutor on a device: the plans of a cuda graph package.
//
// Each specialization is compiled for the cuda target as `kiln compile
// --target cuda` would compile it for those shapes, and runs on the GPU the
// executor attached: its constants are uploaded when it is compiled (the
// package's own constants once, shared by every plan), the arena is device
// memory that grows like the host's, and a call copies its inputs in, runs
// the program as one compute job (replayed as a CUDA graph after the
// first call of a signature) and copies the outputs back. A stage whose
// outputs decide the next stage's shapes hands them over through host
// memory, as on the host.
//
// Device errors reach the caller in the classes of error.h (the device maps
// CUDA's errors); one that needs a reset resets the device and forgets the
// plans, so that the next call compiles again.
#include <fmt/format.h>

#include <set>

#include "runtime/device_sync.h"
#include "specialize/executor_impl.h"

#if KILN_HAVE_CUDA
#include "runtime/cuda_device.h"
#endif

namespace kiln {
namespace {

DeviceJob copyJob(DeviceJob::Kind kind, std::byte* destination, const std::byte* source, uint64_t bytes) {
  DeviceJob job;
  job.kind = kind;
  job.destination = destination;
  job.source = source;
  job.bytes = bytes;
  return job;
}

struct ComputeContext {
  Executor* executor;
  const DevicePlan* on_device;
  StepTrace* trace;
};

void runOnDevice(void* context) {
  const auto& c = *static_cast<const ComputeContext*>(context);
  if (c.trace != nullptr) {
    c.executor->runTraced(c.on_device->input_pointers, c.on_device->output_pointers, *c.trace);
  } else {
    c.executor->run(c.on_device->input_pointers, c.on_device->output_pointers);
  }
}

}  // namespace

void DynamicExecutor::Impl::prepareDeviceExecutor(Plan& plan, CompiledProgram program) {
  auto on_device = std::make_unique<DevicePlan>();
  std::map<std::string, std::span<const std::byte>> device_bytes, host_bytes;
  std::vector<DeviceJob> uploads;
  std::set<const Constant*> package_constants;
  for (const auto& [name, external] : external_constants) package_constants.insert(external.get());
  on_device->constants.reserve(program.constants.size());
  for (size_t c = 0; c < program.spec.constants.size(); ++c) {
    const ConstantPtr& constant = program.constants[c];
    const std::string& name = program.spec.constants[c];
    host_bytes[name] = constant->bytes;
    DeviceBuffer* buffer = nullptr;
    if (package_constants.contains(constant.get())) {
      auto [it, added] = device_constants.try_emplace(constant.get());
      buffer = &it->second;
      if (!added) {
        device_bytes[name] = {buffer->data(), constant->bytes.size()};
        continue;
      }
    } else {
      buffer = &on_device->constants.emplace_back();
    }
    *buffer = device->allocate(std::max<uint64_t>(constant->bytes.size(), 1));
    device_bytes[name] = {buffer->data(), constant->bytes.size()};
    if (!constant->bytes.empty()) {
      uploads.push_back(copyJob(DeviceJob::Kind::kCopyToDevice, buffer->data(), constant->bytes.data(),
                                constant->bytes.size()));
    }
  }
  runJobsAndWait(*device, uploads);

  ExecutorOptions executor_options{.threads = options.threads, .flush_denormals = options.flush_denormals,
                                   .external_arena = true};
  executor_options.cuda = true;
  executor_options.queue = device->kernelQueue();
  executor_options.host_constants = [host_bytes](const std::string& name) { return host_bytes.at(name); };
#if KILN_HAVE_CUDA
  // KILN_CUDA_GRAPHS=0 turns graphs off for every program on the device.
  if (const auto* gpu = dynamic_cast<const CudaDevice*>(device.get())) executor_options.cuda_graphs = gpu->config().graphs;
#endif
  plan.constants = program.constants;
  plan.executor = std::make_unique<Executor>(
      std::move(program.spec),
      [&device_bytes](const std::string& name) -> std::span<const std::byte> { return device_bytes.at(name); },
      executor_options);

  for (const TensorSlot& slot : plan.executor->inputs()) {
    on_device->inputs.push_back(device->allocate(std::max<uint64_t>(slot.info.sizeInBytes(), 1)));
    on_device->input_pointers.push_back(on_device->inputs.back().data());
  }
  for (const TensorSlot& slot : plan.executor->outputs()) {
    on_device->outputs.push_back(device->allocate(std::max<uint64_t>(slot.info.sizeInBytes(), 1)));
    on_device->output_pointers.push_back(on_device->outputs.back().data());
  }
  on_device->jobs.resize(std::max(on_device->inputs.size(), on_device->outputs.size()));
  plan.on_device = std::move(on_device);
}

void DynamicExecutor::Impl::runExecutor(Plan& plan, std::span<const std::byte* const> data,
                                        std::span<std::byte* const> into, StepTrace* trace) {
  if (!plan.on_device) {
    if (trace != nullptr) {
      plan.executor->runTraced(data, into, *trace);
    } else {
      plan.executor->run(data, into);
    }
    return;
  }
  DevicePlan& d = *plan.on_device;
  const std::vector<TensorSlot>& ins = plan.executor->inputs();
  const std::vector<TensorSlot>& outs = plan.executor->outputs();
  size_t count = 0;
  for (size_t i = 0; i < ins.size(); ++i) {
    const uint64_t bytes = ins[i].info.sizeInBytes();
    if (bytes > 0) d.jobs[count++] = copyJob(DeviceJob::Kind::kCopyToDevice, d.inputs[i].data(), data[i], bytes);
  }
  runJobsAndWait(*device, std::span(d.jobs.data(), count));
  ComputeContext context{plan.executor.get(), &d, trace};
  DeviceJob compute;
  compute.compute = &runOnDevice;
  compute.context = &context;
  runJobsAndWait(*device, std::span(&compute, 1));
  count = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const uint64_t bytes = outs[i].info.sizeInBytes();
    if (bytes > 0) d.jobs[count++] = copyJob(DeviceJob::Kind::kCopyToHost, into[i], d.outputs[i].data(), bytes);
  }
  runJobsAndWait(*device, std::span(d.jobs.data(), count));
}

void DynamicExecutor::Impl::recoverDevice() {
  plans.clear();
  cached = 0;
  device_constants.clear();
  device_arena = DeviceBuffer();
  arena_bytes = 0;
  arena_size = 0;
  device->reset();
}

}  // namespace kiln

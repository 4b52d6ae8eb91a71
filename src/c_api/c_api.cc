// The C API (include/kiln/c_api.h) over the C++ runtime: handles wrap the
// C++ objects, every entry point catches what the C++ side throws and turns
// it into a kiln_status plus a per-thread message.
#include "kiln/c_api.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/error.h"
#include "kiln/executor.h"
#include "kiln/model_runner.h"
#include "kiln/package_reader.h"
#include "kiln/version.h"

struct kiln_package {
  std::string path;
  std::shared_ptr<const kiln::PackageReader> reader;
};

struct kiln_executor {
  std::unique_ptr<kiln::Executor> executor;
  // Per call, sized once: the pointers run() takes, in the model's order.
  std::vector<const std::byte*> inputs;
  std::vector<std::byte*> outputs;
};

struct kiln_runner {
  std::unique_ptr<kiln::ModelRunner> runner;
  std::vector<kiln::DataDesc> inputs, outputs;
};

namespace {

thread_local std::string last_error;

kiln_status fail(kiln_status status, const std::string& message) {
  last_error = message;
  return status;
}

// The status of an exception thrown by the runtime (its classes are in
// include/kiln/error.h), with its message.
kiln_status statusOf(const std::exception_ptr& error, std::string& message) {
  try {
    std::rethrow_exception(error);
  } catch (const kiln::RequestCancelledError& e) {
    message = e.what();
    return KILN_CANCELLED;
  } catch (const kiln::DeadlineExceededError& e) {
    message = e.what();
    return KILN_DEADLINE_EXCEEDED;
  } catch (const kiln::DeviceBusyError& e) {
    message = e.what();
    return KILN_UNAVAILABLE;
  } catch (const kiln::UsageError& e) {
    message = e.what();
    return KILN_INVALID_ARGUMENT;
  } catch (const kiln::IoError& e) {
    message = e.what();
    return KILN_IO_ERROR;
  } catch (const kiln::FormatError& e) {
    message = e.what();
    return KILN_FORMAT_ERROR;
  } catch (const kiln::ApplicationRuntimeError& e) {
    message = e.what();
    return KILN_APPLICATION_ERROR;
  } catch (const kiln::DeviceError& e) {
    message = e.what();
    return KILN_DEVICE_ERROR;
  } catch (const std::bad_alloc&) {
    message = "out of memory";
    return KILN_INTERNAL;
  } catch (const std::exception& e) {
    message = e.what();
    return KILN_INTERNAL;
  } catch (...) {
    message = "an unknown exception";
    return KILN_INTERNAL;
  }
}

// Runs `body` (which returns a kiln_status), turning any exception into
// its status and this thread's message.
template <typename Body>
kiln_status guarded(Body&& body) {
  try {
    return body();
  } catch (...) {
    std::string message;
    const kiln_status status = statusOf(std::current_exception(), message);
    return fail(status, message);
  }
}

kiln_status missing(const char* what) { return fail(KILN_INVALID_ARGUMENT, std::string(what) + " is NULL"); }

std::string modelName(const char* model) { return model != nullptr ? model : ""; }

kiln_status fillInfo(const std::string& name, const kiln::TensorInfo& info, kiln_tensor_info* out) {
  if (info.shape.size() > KILN_MAX_RANK) {
    return fail(KILN_INVALID_ARGUMENT, "'" + name + "' has rank " + std::to_string(info.shape.size()) +
                                           ", more than KILN_MAX_RANK");
  }
  *out = kiln_tensor_info{};
  out->name = name.c_str();
  out->dtype = static_cast<int32_t>(info.dtype);
  out->rank = info.shape.size();
  std::copy(info.shape.begin(), info.shape.end(), out->shape);
  out->bytes = info.isStatic() ? info.sizeInBytes() : 0;
  return KILN_OK;
}

// The caller's tensor named `name`, or null.
const kiln_tensor* findTensor(const kiln_tensor* tensors, size_t count, const std::string& name) {
  for (size_t i = 0; i < count; ++i) {
    if (tensors[i].name != nullptr && name == tensors[i].name) return &tensors[i];
  }
  return nullptr;
}

// Checks that `tensors` are exactly `slots` (names, dtypes, sizes) and
// puts their pointers in the slots' order.
template <typename Pointer>
kiln_status bindExactly(const char* kind, const kiln_tensor* tensors, size_t count,
                        const std::vector<kiln::TensorSlot>& slots, std::vector<Pointer>& bound) {
  if (count > 0 && tensors == nullptr) return missing(kind);
  if (count != slots.size()) {
    return fail(KILN_INVALID_ARGUMENT, "the model has " + std::to_string(slots.size()) + " " + kind + "; " +
                                           std::to_string(count) + " were given");
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    const kiln::TensorSlot& slot = slots[i];
    const kiln_tensor* tensor = findTensor(tensors, count, slot.name);
    if (tensor == nullptr) return fail(KILN_INVALID_ARGUMENT, std::string(kind) + " '" + slot.name + "' is missing");
    if (tensor->dtype != static_cast<int32_t>(slot.info.dtype)) {
      return fail(KILN_INVALID_ARGUMENT, "'" + slot.name + "' has dtype " + std::to_string(tensor->dtype) +
                                             "; the model wants " + std::to_string(static_cast<int>(slot.info.dtype)));
    }
    if (tensor->bytes != slot.info.sizeInBytes()) {
      return fail(KILN_INVALID_ARGUMENT, "'" + slot.name + "' has " + std::to_string(tensor->bytes) +
                                             " bytes; the model wants " + std::to_string(slot.info.sizeInBytes()));
    }
    if (tensor->data == nullptr) return fail(KILN_INVALID_ARGUMENT, "'" + slot.name + "' has no data");
    bound[i] = static_cast<Pointer>(tensor->data);
  }
  return KILN_OK;
}

// The runner's memory views of the caller's tensors (it checks them).
kiln_status runnerViews(const kiln_tensor* inputs, size_t input_count, const kiln_tensor* outputs,
                        size_t output_count, kiln::InputMemoryView& in, kiln::OutputMemoryView& out) {
  if (input_count > 0 && inputs == nullptr) return missing("inputs");
  if (output_count > 0 && outputs == nullptr) return missing("outputs");
  for (size_t i = 0; i < input_count; ++i) {
    if (inputs[i].name == nullptr) return missing("an input's name");
    in.emplace(inputs[i].name, kiln::ConstTensorMemoryView{inputs[i].data, inputs[i].bytes,
                                                            static_cast<kiln::DType>(inputs[i].dtype)});
  }
  for (size_t j = 0; j < output_count; ++j) {
    if (outputs[j].name == nullptr) return missing("an output's name");
    out.emplace(outputs[j].name, kiln::TensorMemoryView{outputs[j].data, outputs[j].bytes,
                                                         static_cast<kiln::DType>(outputs[j].dtype)});
  }
  return KILN_OK;
}

kiln_status runnerInfo(const std::vector<kiln::DataDesc>& descs, size_t index, kiln_tensor_info* out) {
  if (out == nullptr) return missing("out");
  if (index >= descs.size()) return fail(KILN_INVALID_ARGUMENT, "index " + std::to_string(index) + " is out of range");
  const kiln::DataDesc& desc = descs[index];
  const kiln_status status = fillInfo(desc.name, kiln::TensorInfo{desc.dtype, desc.shape}, out);
  if (status == KILN_OK) out->bytes = desc.size_in_bytes;
  return status;
}

}  // namespace

extern "C" {

const char* kiln_version(void) { return kiln::kKilnVersion.data(); }

const char* kiln_last_error(void) { return last_error.c_str(); }

const char* kiln_status_name(kiln_status status) {
  switch (status) {
    case KILN_OK: return "KILN_OK";
    case KILN_INVALID_ARGUMENT: return "KILN_INVALID_ARGUMENT";
    case KILN_IO_ERROR: return "KILN_IO_ERROR";
    case KILN_FORMAT_ERROR: return "KILN_FORMAT_ERROR";
    case KILN_DEVICE_ERROR: return "KILN_DEVICE_ERROR";
    case KILN_APPLICATION_ERROR: return "KILN_APPLICATION_ERROR";
    case KILN_CANCELLED: return "KILN_CANCELLED";
    case KILN_DEADLINE_EXCEEDED: return "KILN_DEADLINE_EXCEEDED";
    case KILN_UNAVAILABLE: return "KILN_UNAVAILABLE";
    case KILN_INTERNAL: return "KILN_INTERNAL";
  }
  return "KILN_UNKNOWN_STATUS";
}

kiln_status kiln_package_open(const char* path, kiln_package** out) {
  if (path == nullptr) return missing("path");
  if (out == nullptr) return missing("out");
  *out = nullptr;
  return guarded([&] {
    auto package = std::make_unique<kiln_package>();
    package->path = path;
    package->reader = std::make_shared<const kiln::PackageReader>(package->path);
    *out = package.release();
    return KILN_OK;
  });
}

void kiln_package_free(kiln_package* package) { delete package; }

kiln_status kiln_executor_create(const kiln_package* package, const kiln_executor_options* options,
                                 kiln_executor** out) {
  if (package == nullptr) return missing("package");
  if (out == nullptr) return missing("out");
  *out = nullptr;
  return guarded([&] {
    kiln::ExecutorOptions executor_options;
    std::string model;
    if (options != nullptr) {
      executor_options.threads = options->threads;
      model = modelName(options->model);
    }
    auto executor = std::make_unique<kiln_executor>();
    executor->executor = std::make_unique<kiln::Executor>(package->path, model, executor_options);
    executor->inputs.resize(executor->executor->inputs().size());
    executor->outputs.resize(executor->executor->outputs().size());
    *out = executor.release();
    return KILN_OK;
  });
}

void kiln_executor_free(kiln_executor* executor) { delete executor; }

size_t kiln_executor_input_count(const kiln_executor* executor) {
  return executor != nullptr ? executor->executor->inputs().size() : 0;
}

size_t kiln_executor_output_count(const kiln_executor* executor) {
  return executor != nullptr ? executor->executor->outputs().size() : 0;
}

static kiln_status executorInfo(const std::vector<kiln::TensorSlot>& slots, size_t index, kiln_tensor_info* out) {
  if (out == nullptr) return missing("out");
  if (index >= slots.size()) return fail(KILN_INVALID_ARGUMENT, "index " + std::to_string(index) + " is out of range");
  return fillInfo(slots[index].name, slots[index].info, out);
}

kiln_status kiln_executor_input_info(const kiln_executor* executor, size_t index, kiln_tensor_info* out) {
  if (executor == nullptr) return missing("executor");
  return executorInfo(executor->executor->inputs(), index, out);
}

kiln_status kiln_executor_output_info(const kiln_executor* executor, size_t index, kiln_tensor_info* out) {
  if (executor == nullptr) return missing("executor");
  return executorInfo(executor->executor->outputs(), index, out);
}

kiln_status kiln_executor_run(kiln_executor* executor, const kiln_tensor* inputs, size_t input_count,
                              const kiln_tensor* outputs, size_t output_count) {
  if (executor == nullptr) return missing("executor");
  return guarded([&] {
    kiln::Executor& e = *executor->executor;
    if (kiln_status s = bindExactly("inputs", inputs, input_count, e.inputs(), executor->inputs); s != KILN_OK) {
      return s;
    }
    if (kiln_status s = bindExactly("outputs", outputs, output_count, e.outputs(), executor->outputs); s != KILN_OK) {
      return s;
    }
    e.run(executor->inputs, executor->outputs);
    return KILN_OK;
  });
}

void kiln_runner_options_init(kiln_runner_options* options) {
  if (options == nullptr) return;
  *options = kiln_runner_options{};
  options->batching_dim = -1;
  options->timeout_us = 5000;
  options->replicas = 1;
}

kiln_status kiln_runner_create(const kiln_package* package, const kiln_runner_options* options, kiln_runner** out) {
  if (package == nullptr) return missing("package");
  if (out == nullptr) return missing("out");
  *out = nullptr;
  kiln_runner_options o;
  kiln_runner_options_init(&o);
  if (options != nullptr) o = *options;
  if (o.batching_dim < -1 || o.timeout_us < 0) {
    return fail(KILN_INVALID_ARGUMENT, "batching_dim must be -1 or a dimension, timeout_us at least 0");
  }
  return guarded([&] {
    kiln::ModelRunnerConfig config;
    config.model = modelName(o.model);
    if (o.device != nullptr && o.device[0] != '\0') config.device_kind = kiln::parseDeviceKind(o.device);
    config.batching_dim = o.batching_dim < 0 ? kiln::kNoBatchDim : static_cast<uint32_t>(o.batching_dim);
    config.timeout_ns = std::chrono::microseconds(o.timeout_us);
    config.replication_factor = o.replicas == 0 ? 1 : o.replicas;
    config.threads = o.threads;
    auto runner = std::make_unique<kiln_runner>();
    runner->runner = std::make_unique<kiln::ModelRunner>(package->reader, config);
    runner->inputs = runner->runner->getExecuteInputs();
    runner->outputs = runner->runner->getExecuteOutputs();
    *out = runner.release();
    return KILN_OK;
  });
}

void kiln_runner_free(kiln_runner* runner) {
  if (runner == nullptr) return;
  try {
    runner->runner->drain(std::chrono::hours(24 * 365));  // every request taken runs and is answered
  } catch (...) {
    // The destructor answers whatever is left with an error.
  }
  delete runner;
}

size_t kiln_runner_input_count(const kiln_runner* runner) { return runner != nullptr ? runner->inputs.size() : 0; }

size_t kiln_runner_output_count(const kiln_runner* runner) { return runner != nullptr ? runner->outputs.size() : 0; }

kiln_status kiln_runner_input_info(const kiln_runner* runner, size_t index, kiln_tensor_info* out) {
  if (runner == nullptr) return missing("runner");
  return runnerInfo(runner->inputs, index, out);
}

kiln_status kiln_runner_output_info(const kiln_runner* runner, size_t index, kiln_tensor_info* out) {
  if (runner == nullptr) return missing("runner");
  return runnerInfo(runner->outputs, index, out);
}

kiln_status kiln_runner_execute(kiln_runner* runner, const kiln_tensor* inputs, size_t input_count,
                                const kiln_tensor* outputs, size_t output_count) {
  if (runner == nullptr) return missing("runner");
  return guarded([&] {
    kiln::InputMemoryView in;
    kiln::OutputMemoryView out;
    if (kiln_status s = runnerViews(inputs, input_count, outputs, output_count, in, out); s != KILN_OK) return s;
    runner->runner->execute(in, out);
    return KILN_OK;
  });
}

}  // extern "C"

namespace {

// Both async entry points: `wait_for_room` as executeAsync, else as
// tryExecuteAsync.
kiln_status executeAsync(kiln_runner* runner, const kiln_tensor* inputs, size_t input_count,
                         const kiln_tensor* outputs, size_t output_count, kiln_callback callback, void* user_data,
                         bool wait_for_room) {
  if (runner == nullptr) return missing("runner");
  if (callback == nullptr) return missing("callback");
  return guarded([&] {
    kiln::InputMemoryView in;
    kiln::OutputMemoryView out;
    if (kiln_status s = runnerViews(inputs, input_count, outputs, output_count, in, out); s != KILN_OK) return s;
    kiln::RequestOptions options;
    options.on_complete = [callback, user_data](const std::exception_ptr& error) {
      if (!error) {
        callback(user_data, KILN_OK, "");
        return;
      }
      std::string message;
      const kiln_status status = statusOf(error, message);
      callback(user_data, status, message.c_str());
    };
    // The request goes on when its Future is dropped; the callback answers.
    if (wait_for_room) {
      runner->runner->executeAsync(in, out, options);
    } else if (!runner->runner->tryExecuteAsync(in, out, options)) {
      return fail(KILN_UNAVAILABLE, "the runner's queues are full; retry later");
    }
    return KILN_OK;
  });
}

}  // namespace

extern "C" {

kiln_status kiln_runner_execute_async(kiln_runner* runner, const kiln_tensor* inputs, size_t input_count,
                                      const kiln_tensor* outputs, size_t output_count, kiln_callback callback,
                                      void* user_data) {
  return executeAsync(runner, inputs, input_count, outputs, output_count, callback, user_data, true);
}

kiln_status kiln_runner_try_execute_async(kiln_runner* runner, const kiln_tensor* inputs, size_t input_count,
                                          const kiln_tensor* outputs, size_t output_count, kiln_callback callback,
                                          void* user_data) {
  return executeAsync(runner, inputs, input_count, outputs, output_count, callback, user_data, false);
}

}  // extern "C"

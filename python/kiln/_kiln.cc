// The compiled half of the `kiln` Python package (nanobind). The Python half,
// python/kiln/__init__.py, wraps it into the documented API.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "kernels/evaluate_once.h"
#include "kernels/kernel.h"
#include "kiln/compiler.h"
#include "kiln/dynamic_executor.h"
#include "kiln/error.h"
#include "kiln/executor.h"
#include "kiln/model_runner.h"
#include "kiln/package_reader.h"
#include "kiln/plugins.h"
#include "kiln/onnx_import.h"
#include "kiln/step_trace.h"
#include "kiln/version.h"

namespace nb = nanobind;

namespace {

using Array = nb::ndarray<nb::c_contig, nb::device::cpu>;
// Inputs are only read, so read-only arrays (np.frombuffer, broadcast views
// made contiguous) are accepted without a copy.
using ConstArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

nb::dict compileModel(const std::string& onnx_path, const std::string& output_path,
                      const std::map<std::string, std::vector<int64_t>>& shapes, std::optional<int64_t> batch,
                      bool dynamic, const std::string& target, bool quantize_activations, bool tf32, bool fp16,
                      bool bf16, const std::vector<std::string>& variables, const std::string& gradients_of,
                      const std::vector<std::string>& gradients_wrt, const std::string& training_loss,
                      const std::vector<std::string>& trainable, const std::map<std::string, double>& optimizer,
                      const std::string& optimizer_kind, uint32_t gradient_accumulation, uint64_t seed,
                      const std::string& gradient_all_reduce) {
  kiln::OnnxImportOptions options;
  options.input_shapes = shapes;
  options.batch = batch;
  // Dimensions left unknown are fixed at run time (kiln.compile warns,
  // from "unfixed_input"); training and gradients need them fixed.
  const bool differentiates = !training_loss.empty() || !gradients_of.empty();
  options.require_static_inputs = !dynamic && differentiates;
  kiln::OnnxModel model = kiln::importOnnx(onnx_path, options);
  const std::string unfixed = dynamic ? "" : kiln::unfixedInputDimension(*model.graph);
  kiln::CompileOptions compile_options;
  compile_options.model_name = std::filesystem::path(onnx_path).stem().string();
  compile_options.has_kernel = [](const std::string& name) { return kiln::KernelRegistry::cpu().find(name) != nullptr; };
  compile_options.evaluate_kernel = &kiln::evaluateOnce;
  compile_options.target = target;
  compile_options.quantize_activations = quantize_activations;
  compile_options.tf32 = tf32;
  compile_options.fp16 = fp16;
  compile_options.bf16 = bf16;
  compile_options.variables = variables;
  compile_options.source_model = onnx_path;
  compile_options.gradients_of = gradients_of;
  compile_options.gradients_wrt = gradients_wrt;
  if (!training_loss.empty()) {
    kiln::TrainingOptions training;
    training.loss = training_loss;
    training.trainable = trainable;
    kiln::Optimizer& o = training.optimizer;
    if (optimizer_kind == "sgd") {
      o.kind = kiln::Optimizer::Kind::kSgd;
    } else if (optimizer_kind == "adam") {
      o.kind = kiln::Optimizer::Kind::kAdam;
    } else if (optimizer_kind == "adamw") {
      o.kind = kiln::Optimizer::Kind::kAdamW;
    } else {
      throw kiln::UsageError("unknown optimizer '" + optimizer_kind + "' (sgd, adam, adamw)");
    }
    const auto number = [&](const char* key, float fallback) {
      const auto found = optimizer.find(key);
      return found == optimizer.end() ? fallback : static_cast<float>(found->second);
    };
    o.learning_rate = number("learning_rate", o.learning_rate);
    o.momentum = number("momentum", o.momentum);
    o.weight_decay = number("weight_decay", o.weight_decay);
    o.beta1 = number("beta1", o.beta1);
    o.beta2 = number("beta2", o.beta2);
    o.epsilon = number("epsilon", o.epsilon);
    training.gradient_accumulation = gradient_accumulation;
    training.seed = seed;
    training.gradient_all_reduce = gradient_all_reduce;
    compile_options.training = training;
  }
  const kiln::CompileReport report = kiln::compile(*model.graph, model.opsets, output_path, compile_options);
  nb::dict result;
  result["steps"] = report.steps;
  nb::dict step_kernels;  // kernel name -> steps: what the fusions made
  for (const auto& [kernel, count] : report.step_kernels) step_kernels[kernel.c_str()] = count;
  result["step_kernels"] = step_kernels;
  result["views"] = report.views;
  result["int8_matmuls"] = report.int8_matmuls;
  result["constants"] = report.constants;
  result["constant_bytes"] = report.constant_bytes;
  result["arena_bytes"] = report.arena_bytes;
  result["lower_bound_bytes"] = report.lower_bound_bytes;
  result["naive_bytes"] = report.naive_bytes;
  result["plan"] = report.plan_summary;
  result["runtime_shapes"] = report.runtime_shapes;
  result["runtime_shapes_reason"] = report.runtime_shapes_reason;
  result["unfixed_input"] = report.runtime_shapes ? unfixed : std::string();
  return result;
}

nb::list slots(const std::vector<kiln::TensorSlot>& slots) {
  nb::list list;
  for (const kiln::TensorSlot& slot : slots) {
    list.append(nb::make_tuple(slot.name, slot.info.shape, std::string(kiln::dtypeName(slot.info.dtype))));
  }
  return list;
}

// Runs with the caller's arrays as input and output memory: no copies. The
// Python side has already checked names, shapes and dtypes; sizes are
// checked again here because a wrong size would corrupt memory.
// `trace`, when not None, receives the run's step events.
void run(kiln::Executor& executor, const std::vector<ConstArray>& inputs, const std::vector<Array>& outputs,
         kiln::StepTrace* trace) {
  if (inputs.size() != executor.inputs().size() || outputs.size() != executor.outputs().size()) {
    throw kiln::UsageError("wrong number of arrays");
  }
  std::vector<const std::byte*> in;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].nbytes() != executor.inputs()[i].info.sizeInBytes()) {
      throw kiln::UsageError(fmt::format("input '{}' has {} bytes, expected {}", executor.inputs()[i].name,
                                         inputs[i].nbytes(), executor.inputs()[i].info.sizeInBytes()));
    }
    in.push_back(static_cast<const std::byte*>(inputs[i].data()));
  }
  std::vector<std::byte*> out;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].nbytes() != executor.outputs()[i].info.sizeInBytes()) {
      throw kiln::UsageError(fmt::format("output '{}' has {} bytes, expected {}", executor.outputs()[i].name,
                                         outputs[i].nbytes(), executor.outputs()[i].info.sizeInBytes()));
    }
    out.push_back(static_cast<std::byte*>(outputs[i].data()));
  }
  nb::gil_scoped_release release;
  if (trace != nullptr) {
    executor.runTraced(in, out, *trace);
  } else {
    executor.run(in, out);
  }
}

// Pointers and TensorInfos of the caller's input arrays.
struct CallInputs {
  std::vector<kiln::TensorInfo> infos;
  std::vector<const std::byte*> data;
};

CallInputs callInputs(const kiln::DynamicExecutor& executor, const std::vector<ConstArray>& inputs,
                      const std::vector<std::string>& dtypes) {
  if (inputs.size() != executor.inputs().size() || dtypes.size() != inputs.size()) {
    throw kiln::UsageError("wrong number of arrays");
  }
  CallInputs call;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto dtype = kiln::dtypeFromName(dtypes[i]);
    if (!dtype) throw kiln::UsageError("unknown dtype " + dtypes[i]);
    kiln::TensorInfo info{*dtype, {}};
    for (size_t d = 0; d < inputs[i].ndim(); ++d) info.shape.push_back(static_cast<int64_t>(inputs[i].shape(d)));
    if (inputs[i].nbytes() != info.sizeInBytes()) throw kiln::UsageError("input array size does not match its dtype");
    call.infos.push_back(info);
    call.data.push_back(static_cast<const std::byte*>(inputs[i].data()));
  }
  return call;
}

nb::list outputsFor(kiln::DynamicExecutor& executor, const std::vector<ConstArray>& inputs,
                    const std::vector<std::string>& dtypes) {
  const CallInputs call = callInputs(executor, inputs, dtypes);
  return slots(executor.outputsFor(call.infos, call.data));
}

void runDynamic(kiln::DynamicExecutor& executor, const std::vector<ConstArray>& inputs,
                const std::vector<std::string>& dtypes, const std::vector<Array>& outputs, kiln::StepTrace* trace) {
  const CallInputs call = callInputs(executor, inputs, dtypes);
  const auto& expected = executor.outputsFor(call.infos, call.data);
  if (outputs.size() != expected.size()) throw kiln::UsageError("wrong number of output arrays");
  std::vector<std::byte*> out;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].nbytes() != expected[i].info.sizeInBytes()) {
      throw kiln::UsageError(fmt::format("output '{}' has {} bytes, expected {}", expected[i].name,
                                         outputs[i].nbytes(), expected[i].info.sizeInBytes()));
    }
    out.push_back(static_cast<std::byte*>(outputs[i].data()));
  }
  nb::gil_scoped_release release;
  executor.run(call.infos, call.data, out, trace);
}

// Runs with each output allocated when its shape is known (a model whose
// shapes depend on values it computes runs in stages): returns, per output,
// its bytes (a 1-D u8 array that owns them; the model wrote straight into
// them), its shape and its dtype name.
nb::list runAllocating(kiln::DynamicExecutor& executor, const std::vector<ConstArray>& inputs,
                       const std::vector<std::string>& dtypes, kiln::StepTrace* trace) {
  const CallInputs call = callInputs(executor, inputs, dtypes);
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<std::byte, Free>> buffers(executor.outputs().size());
  std::vector<kiln::TensorInfo> infos(executor.outputs().size());
  {
    nb::gil_scoped_release release;
    executor.run(
        call.infos, call.data,
        [&](size_t index, const kiln::TensorInfo& info) {
          buffers[index].reset(static_cast<std::byte*>(std::malloc(std::max<size_t>(info.sizeInBytes(), 1))));
          if (!buffers[index]) {
            throw kiln::UsageError(fmt::format("output '{}' of {} bytes cannot be allocated on this machine",
                                               executor.outputs()[index].name, info.sizeInBytes()));
          }
          infos[index] = info;
          return buffers[index].get();
        },
        trace);
  }
  nb::list list;
  for (size_t i = 0; i < buffers.size(); ++i) {
    std::byte* data = buffers[i].release();
    nb::capsule owner(data, [](void* p) noexcept { std::free(p); });
    const size_t bytes = infos[i].sizeInBytes();
    nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> array(data, {bytes}, owner);
    list.append(nb::make_tuple(array, infos[i].shape, std::string(kiln::dtypeName(infos[i].dtype))));
  }
  return list;
}


// A package run on a device (sim, cuda) through a ModelRunner: the caller's
// arrays are copied to the device and the results back into the caller's
// output arrays, as `kiln run --device` does.
class DeviceRunner {
 public:
  DeviceRunner(const std::string& path, const std::string& model, const std::string& device, bool flush_denormals) {
    kiln::ModelRunnerConfig config;
    config.flush_denormals = flush_denormals;
    config.device_kind = kiln::parseDeviceKind(device);
    config.model = model;
    {
      // Without the GIL: the runner's threads may call host functions
      // (kiln.register_host_op), which take it.
      nb::gil_scoped_release release;
      runner_ = std::make_unique<kiln::ModelRunner>(std::filesystem::path(path), config);
    }
    for (const kiln::DataDesc& d : runner_->getExecuteInputs()) inputs_.push_back({d.name, {d.dtype, d.shape}});
    for (const kiln::DataDesc& d : runner_->getExecuteOutputs()) outputs_.push_back({d.name, {d.dtype, d.shape}});
  }

  // The runner stops its threads without the GIL, which a thread running
  // a host function may be waiting for.
  ~DeviceRunner() {
    nb::gil_scoped_release release;
    runner_.reset();
  }
  DeviceRunner(const DeviceRunner&) = delete;
  DeviceRunner& operator=(const DeviceRunner&) = delete;

  const std::vector<kiln::TensorSlot>& inputs() const { return inputs_; }
  const std::vector<kiln::TensorSlot>& outputs() const { return outputs_; }

  void run(const std::vector<ConstArray>& inputs, const std::vector<Array>& outputs) {
    if (inputs.size() != inputs_.size() || outputs.size() != outputs_.size()) {
      throw kiln::UsageError("wrong number of arrays");
    }
    kiln::InputMemoryView in;
    for (size_t i = 0; i < inputs.size(); ++i) {
      in[inputs_[i].name] = {inputs[i].data(), inputs[i].nbytes(), inputs_[i].info.dtype};
    }
    kiln::OutputMemoryView out;
    for (size_t i = 0; i < outputs.size(); ++i) {
      out[outputs_[i].name] = {outputs[i].data(), outputs[i].nbytes(), outputs_[i].info.dtype};
    }
    nb::gil_scoped_release release;
    runner_->execute(in, out);  // validates every size against the anchors
  }

 private:
  std::unique_ptr<kiln::ModelRunner> runner_;
  std::vector<kiln::TensorSlot> inputs_;
  std::vector<kiln::TensorSlot> outputs_;
};

// The device kind a package's model targets ("cpu", "cuda", ...).
std::string packageTarget(const std::string& path, const std::string& model) {
  kiln::PackageReader reader(path);
  const auto all = reader.metadata();
  const kiln::MetadataBlob* chosen = model.empty() ? (all.empty() ? nullptr : all.front()) : reader.findMetadata(model);
  if (chosen == nullptr) throw kiln::UsageError(fmt::format("{} holds no model named '{}'", path, model));
  return chosen->metadata().target.device_kind;
}

// The ONNX model a package with variables was compiled from (the opaque
// blob kSourceModelBlob), or None when it keeps none.
nb::object sourceModel(const std::string& path) {
  kiln::PackageReader reader(path);
  const kiln::OpaqueBlob* blob = reader.findOpaque(kiln::kSourceModelBlob);
  if (blob == nullptr) return nb::none();
  const std::span<const std::byte> data = blob->data();
  return nb::bytes(reinterpret_cast<const char*>(data.data()), data.size());
}

// A loaded plugin library as a dict (kiln.load_plugin).
nb::dict pluginDict(const kiln::LoadedPlugin& plugin) {
  nb::dict d;
  d["name"] = plugin.name;
  d["path"] = plugin.path.string();
  d["api_level"] = plugin.api_level;
  d["hash"] = plugin.hash;
  d["ops"] = plugin.ops;
  return d;
}

// A Python host function as an op (kiln.register_host_op): its KilnOp's
// op_data. `call(inputs, outputs)` gets each tensor as (uint8 view, shape,
// dtype name), the views valid during the call only; `infer(types)` gets
// and returns [(dtype name, shape)], with -1 for unknown dimensions.
struct HostFunction {
  nb::object call;
  nb::object infer;
  std::string domain, name;  // kept alive: the KilnOp points at them
};

void writeError(char* error, size_t capacity, const std::string& message) {
  if (error != nullptr && capacity > 0) std::snprintf(error, capacity, "%s", message.c_str());
}

nb::list pythonTensors(const KilnTensor* tensors, int32_t count, bool writable) {
  nb::list list;
  for (int32_t i = 0; i < count; ++i) {
    const KilnTensor& t = tensors[i];
    const auto dtype = static_cast<kiln::DType>(t.dtype);
    std::vector<int64_t> shape(t.dims, t.dims + t.rank);
    uint64_t elements = 1;
    for (int64_t d : shape) elements *= static_cast<uint64_t>(d);
    const size_t bytes = static_cast<size_t>(elements * kiln::dtypeSize(dtype));
    nb::object array;
    if (writable) {
      // By reference: without an owner nanobind would hand Python a copy.
      array = nb::cast(nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(t.data, {bytes}, nb::handle()),
                       nb::rv_policy::reference);
    } else {
      array = nb::cast(nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(t.data, {bytes}, nb::handle()),
                       nb::rv_policy::reference);
    }
    list.append(nb::make_tuple(array, shape, std::string(kiln::dtypeName(dtype))));
  }
  return list;
}

// Runs `body` with the GIL taken; an exception becomes the ABI's error
// message (a Python one as its type and message, not the whole traceback).
template <typename Body>
int guardedCall(char* error, size_t capacity, Body&& body) {
  nb::gil_scoped_acquire gil;
  try {
    return body();
  } catch (const nb::python_error& e) {
    writeError(error, capacity, nb::cast<std::string>(nb::str("{}: {}").format(e.type().attr("__name__"), e.value())));
  } catch (const std::exception& e) {
    writeError(error, capacity, e.what());
  }
  return 1;
}

int hostInfer(const void* state, const KilnTensorType* inputs, int32_t input_count, KilnTensorType* outputs,
              int32_t output_count, char* error, size_t capacity) {
  const auto* function = static_cast<const HostFunction*>(state);
  return guardedCall(error, capacity, [&] {
    nb::list types;
    for (int32_t i = 0; i < input_count; ++i) {
      std::vector<int64_t> dims(inputs[i].dims, inputs[i].dims + std::max(inputs[i].rank, 0));
      types.append(nb::make_tuple(std::string(kiln::dtypeName(static_cast<kiln::DType>(inputs[i].dtype))), dims));
    }
    const nb::object result = function->infer(types, output_count);
    const auto inferred = nb::cast<std::vector<std::pair<std::string, std::vector<int64_t>>>>(result);
    if (inferred.size() != static_cast<size_t>(output_count)) {
      writeError(error, capacity, fmt::format("infer returned {} types for {} outputs", inferred.size(), output_count));
      return 1;
    }
    for (int32_t i = 0; i < output_count; ++i) {
      const auto dtype = kiln::dtypeFromName(inferred[i].first);
      if (!dtype || inferred[i].second.size() > KILN_PLUGIN_MAX_RANK) {
        writeError(error, capacity, fmt::format("infer returned the type ({}, rank {})", inferred[i].first,
                                                inferred[i].second.size()));
        return 1;
      }
      outputs[i].dtype = static_cast<int32_t>(*dtype);
      outputs[i].rank = static_cast<int32_t>(inferred[i].second.size());
      for (size_t d = 0; d < inferred[i].second.size(); ++d) outputs[i].dims[d] = inferred[i].second[d];
    }
    return 0;
  });
}

int hostCompute(const void* state, const KilnTensor* inputs, int32_t input_count, KilnTensor* outputs,
                int32_t output_count, void*, uint64_t, char* error, size_t capacity) {
  const auto* function = static_cast<const HostFunction*>(state);
  return guardedCall(error, capacity, [&] {
    function->call(pythonTensors(inputs, input_count, false), pythonTensors(outputs, output_count, true));
    return 0;
  });
}

void registerPythonHostOp(const std::string& domain, const std::string& name, int32_t min_inputs, int32_t max_inputs,
                          int32_t outputs, nb::object call, nb::object infer) {
  // Registered ops live as long as the process: so does their function.
  auto* function = new HostFunction{std::move(call), std::move(infer), domain, name};
  KilnOp op{};
  op.struct_size = sizeof(KilnOp);
  op.domain = function->domain.c_str();
  op.name = function->name.c_str();
  op.since_version = 1;
  op.min_inputs = min_inputs;
  op.max_inputs = max_inputs;
  op.min_outputs = op.max_outputs = outputs;
  op.infer = &hostInfer;
  op.compute = &hostCompute;
  op.op_data = function;
  try {
    kiln::registerHostOp(op);
  } catch (...) {
    delete function;
    throw;
  }
}

}  // namespace

void bindHostSession(nb::module_& m);  // session_binding.cc

NB_MODULE(_kiln, m) {
  m.doc() = "kiln: compile neural networks ahead of time and run them";
  m.attr("__version__") = std::string(kiln::kKilnVersion);
  nb::exception<kiln::Error>(m, "Error");
  bindHostSession(m);
  m.def("compile", &compileModel, nb::arg("onnx_path"), nb::arg("output_path"), nb::arg("shapes"), nb::arg("batch"),
        nb::arg("dynamic") = false, nb::arg("target") = "cpu", nb::arg("quantize_activations") = false,
        nb::arg("tf32") = false, nb::arg("fp16") = false, nb::arg("bf16") = false,
        nb::arg("variables") = std::vector<std::string>{}, nb::arg("gradients_of") = "",
        nb::arg("gradients_wrt") = std::vector<std::string>{}, nb::arg("training_loss") = "",
        nb::arg("trainable") = std::vector<std::string>{}, nb::arg("optimizer") = std::map<std::string, double>{},
        nb::arg("optimizer_kind") = "sgd", nb::arg("gradient_accumulation") = 1, nb::arg("seed") = 0,
        nb::arg("gradient_all_reduce") = "");
  m.def("package_target", &packageTarget, nb::arg("path"), nb::arg("model") = "");
  m.def("source_model", &sourceModel, nb::arg("path"));
  m.def("load_plugin", [](const std::string& path) { return pluginDict(kiln::loadPlugin(path)); }, nb::arg("path"));
  m.def("register_host_op", &registerPythonHostOp, nb::arg("domain"), nb::arg("name"), nb::arg("min_inputs"),
        nb::arg("max_inputs"), nb::arg("outputs"), nb::arg("call"), nb::arg("infer"));
  nb::class_<DeviceRunner>(m, "DeviceRunner")
      .def(nb::init<const std::string&, const std::string&, const std::string&, bool>(), nb::arg("path"),
           nb::arg("model"), nb::arg("device"), nb::arg("flush_denormals") = true)
      .def_prop_ro("inputs", [](const DeviceRunner& r) { return slots(r.inputs()); })
      .def_prop_ro("outputs", [](const DeviceRunner& r) { return slots(r.outputs()); })
      .def("run", &DeviceRunner::run, nb::arg("inputs"), nb::arg("outputs"));
  m.def(
      "is_graph_package", [](const std::string& path, const std::string& model) { return kiln::hasRuntimeShapes(path, model); },
      nb::arg("path"), nb::arg("model") = "");
  nb::class_<kiln::DynamicExecutor>(m, "DynamicExecutor")
      .def(
          "__init__",
          [](kiln::DynamicExecutor* self, const std::string& path, const std::string& model, int threads,
             size_t capacity, bool flush_denormals) {
            new (self) kiln::DynamicExecutor(path, model,
                                             kiln::DynamicExecutorOptions{.threads = threads,
                                                                          .plan_cache_capacity = capacity,
                                                                          .flush_denormals = flush_denormals});
          },
          nb::arg("path"), nb::arg("model") = "", nb::arg("threads") = 0, nb::arg("plan_cache_capacity") = 16,
          nb::arg("flush_denormals") = true)
      .def_prop_ro("inputs", [](const kiln::DynamicExecutor& e) { return slots(e.inputs()); })
      .def_prop_ro("outputs", [](const kiln::DynamicExecutor& e) { return slots(e.outputs()); })
      .def_prop_ro("shape_inputs", &kiln::DynamicExecutor::shapeInputs)
      .def("outputs_for", &outputsFor, nb::arg("inputs"), nb::arg("dtypes"))
      .def("run", &runDynamic, nb::arg("inputs"), nb::arg("dtypes"), nb::arg("outputs"), nb::arg("trace").none() = nb::none())
      .def("run_allocating", &runAllocating, nb::arg("inputs"), nb::arg("dtypes"), nb::arg("trace").none() = nb::none())
      .def("memory_stats",
           [](const kiln::DynamicExecutor& e) {
             const kiln::DynamicMemoryStats s = e.memoryStats();
             nb::dict d;
             d["arena_bytes"] = s.arena_bytes;
             d["plan_cache_hits"] = s.plan_cache_hits;
             d["plan_cache_misses"] = s.plan_cache_misses;
             d["plan_cache_evictions"] = s.plan_cache_evictions;
             d["cached_plans"] = s.cached_plans;
             return d;
           })
      .def("shrink", &kiln::DynamicExecutor::shrink);
  nb::class_<kiln::Executor>(m, "Executor")
      .def(
          "__init__",
          [](kiln::Executor* self, const std::string& path, const std::string& model, int threads,
             bool flush_denormals) {
            new (self) kiln::Executor(path, model,
                                      kiln::ExecutorOptions{.threads = threads, .flush_denormals = flush_denormals});
          },
          nb::arg("path"), nb::arg("model") = "", nb::arg("threads") = 0, nb::arg("flush_denormals") = true)
      .def_prop_ro("inputs", [](const kiln::Executor& e) { return slots(e.inputs()); })
      .def_prop_ro("outputs", [](const kiln::Executor& e) { return slots(e.outputs()); })
      .def_prop_ro("arena_bytes", &kiln::Executor::arenaBytes)
      .def_prop_ro("step_count", &kiln::Executor::stepCount)
      .def_prop_ro("steps_run", &kiln::Executor::stepsRun)
      .def("run", &run, nb::arg("inputs"), nb::arg("outputs"), nb::arg("trace").none() = nb::none());
  nb::class_<kiln::StepTrace>(m, "StepTrace")
      .def(nb::init<>())
      .def_prop_ro("event_count", [](const kiln::StepTrace& t) { return t.events().size(); })
      .def("to_json", &kiln::StepTrace::toJson)
      .def("write", [](const kiln::StepTrace& t, const std::string& path) { t.write(path); }, nb::arg("path"))
      .def("clear", &kiln::StepTrace::clear);
}

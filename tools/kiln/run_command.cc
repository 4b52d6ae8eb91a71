// `kiln run MODEL.kiln --input NAME=FILE.npy ... [--random-inputs]
//  [--output-dir DIR]`: runs the model once and writes its outputs as .npy.
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>

#include <fmt/format.h>

#include "kiln/error.h"
#include "kiln/dynamic_executor.h"
#include "kiln/executor.h"
#include "kiln/plugins.h"
#include "tools/kiln/commands.h"
#include "tools/kiln/device_runner.h"
#include "tools/kiln/npy.h"
#include "tools/kiln/model_inputs.h"

namespace kiln::cli {
namespace {

std::string fileNameFor(std::string name) {
  for (char& c : name) {
    if (c == '/' || c == '\\' || c == ':' || c == ' ') c = '_';
  }
  return name + ".npy";
}

void writeOutputs(const std::string& dir, const std::vector<TensorSlot>& outputs,
                  const std::vector<std::vector<std::byte>>& data) {
  std::filesystem::create_directories(dir);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const TensorSlot& slot = outputs[i];
    const auto path = std::filesystem::path(dir) / fileNameFor(slot.name);
    writeNpy(path, slot.info, data[i].data());
    std::printf("%s: %s -> %s\n", slot.name.c_str(), slot.info.toString().c_str(), path.string().c_str());
  }
}

// A device run (a cuda package, or --device): through a ModelRunner.
int runOnDevice(const std::string& package, const std::string& model, DeviceKind kind,
                const InputArguments& input_files, bool random_inputs, const std::string& output_dir) {
  DeviceRunner runner(package, model, kind);
  const std::vector<NpyArray> input_data = loadInputs(runner.inputs(), input_files, random_inputs);
  std::vector<const std::byte*> in;
  for (const NpyArray& array : input_data) in.push_back(array.bytes.data());
  std::vector<std::vector<std::byte>> output_data;
  std::vector<std::byte*> out;
  for (const TensorSlot& slot : runner.outputs()) output_data.emplace_back(slot.info.sizeInBytes());
  for (auto& data : output_data) out.push_back(data.data());
  runner.run(in, out);
  writeOutputs(output_dir, runner.outputs(), output_data);
  return 0;
}


}  // namespace

Command addRunCommand(CLI::App& app) {
  struct Args {
    std::string package;
    InputArguments inputs;
    bool random_inputs = false;
    std::string output_dir = ".";
    std::string model;
    int threads = 0;
    std::string device;
    std::vector<std::string> plugins;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("run", "Run a compiled model once on .npy inputs");
  cmd->add_option("package", args->package, "The .kiln package")->required()->check(CLI::ExistingFile);
  cmd->add_option("--input", args->inputs.files, "NAME=FILE.npy (repeatable)");
  cmd->add_option("--shape", args->inputs.shapes,
                  "NAME:DIMS (repeatable): the shape of an input's --random-inputs data, where the package leaves "
                  "dimensions to run time");
  cmd->add_flag("--random-inputs", args->random_inputs, "Fill inputs not given with random data (fixed seed)");
  cmd->add_option("--plugin", args->plugins,
                  "Load a plugin library first (repeatable): a package's libraries are otherwise found in "
                  "KILN_PLUGIN_PATH or beside it, and with KILN_PLUGIN_AUTOLOAD=0 only preloaded ones are used")
      ->check(CLI::ExistingFile);
  cmd->add_option("--output-dir", args->output_dir, "Where to write OUTPUT.npy files (default: .)");
  cmd->add_option("--model", args->model, "Model to run when the package holds several");
  cmd->add_option("--threads", args->threads, "Threads per kernel (default: OMP_NUM_THREADS, or one per core)")
      ->check(CLI::PositiveNumber);

  cmd->add_option("--device", args->device,
                  "Run on a device through a ModelRunner: cpu, sim or cuda (default: the package's target; cpu "
                  "packages run on the host executor)")
      ->check(CLI::IsMember({"cpu", "sim", "cuda"}));

  return [args]() {
    for (const std::string& plugin : args->plugins) loadPlugin(plugin);
    if (const std::optional<DeviceKind> device = deviceFor(args->package, args->model, args->device)) {
      return runOnDevice(args->package, args->model, *device, args->inputs, args->random_inputs, args->output_dir);
    }
    // Packages with run-time shapes take their shapes from the inputs given.
    const bool dynamic = hasRuntimeShapes(args->package, args->model);
    std::unique_ptr<Executor> executor;
    std::unique_ptr<DynamicExecutor> dynamic_executor;
    if (dynamic) {
      dynamic_executor = std::make_unique<DynamicExecutor>(args->package, args->model,
                                                           DynamicExecutorOptions{.threads = args->threads});
    } else {
      executor = std::make_unique<Executor>(args->package, args->model, ExecutorOptions{.threads = args->threads});
    }
    const std::vector<NpyArray> input_data =
        loadInputs(dynamic ? dynamic_executor->inputs() : executor->inputs(), args->inputs, args->random_inputs);
    std::vector<TensorInfo> input_infos;
    std::vector<const std::byte*> in;
    for (const NpyArray& array : input_data) {
      input_infos.push_back(array.info);
      in.push_back(array.bytes.data());
    }
    // Outputs are made as their shapes become known (a package with run-time
    // shapes may run in stages, its output shapes learned as it goes).
    std::vector<TensorSlot> outputs = dynamic ? dynamic_executor->outputs() : executor->outputs();
    std::vector<std::vector<std::byte>> output_data(outputs.size());
    if (dynamic) {
      dynamic_executor->run(input_infos, in, [&](size_t index, const TensorInfo& info) {
        outputs[index].info = info;
        output_data[index].resize(info.sizeInBytes());
        return output_data[index].data();
      });
    } else {
      std::vector<std::byte*> out;
      for (size_t i = 0; i < outputs.size(); ++i) {
        output_data[i].resize(outputs[i].info.sizeInBytes());
        out.push_back(output_data[i].data());
      }
      executor->run(in, out);
    }

    writeOutputs(args->output_dir, outputs, output_data);
    return 0;
  };
}

}  // namespace kiln::cli

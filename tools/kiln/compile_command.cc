// `kiln compile MODEL.onnx -o MODEL.kiln [--shape NAME:DIMS]... [--batch N]
//  [--print-ir] [--plan-report]`
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "kernels/evaluate_once.h"
#include "kernels/kernel.h"
#include "kiln/compiler.h"
#include "kiln/onnx_import.h"
#include "kiln/plugins.h"
#include "runtime/program.h"
#include "tools/kiln/commands.h"

namespace kiln::cli {
namespace {

// Steps of a cuda package whose kernel has no cuda version run on the host,
// their tensors copied across: say which, so that nobody is surprised by
// the time they take. Control flow runs on the device (its bodies' steps
// are reported by kernel like the others).
void reportHostSteps(const CompileReport& report) {
  std::string host;
  size_t count = 0, total = 0;
  for (const auto& [kernel, steps] : report.step_kernels) {
    total += steps;
    if (KernelRegistry::cuda().find(kernel) != nullptr || isControlFlowKernel(kernel)) continue;
    host += (host.empty() ? "" : ", ") + kernel + " x" + std::to_string(steps);
    count += steps;
  }
  if (count > 0) {
    std::fprintf(stderr, "notice: %zu of %zu steps have no cuda kernel in this build and run on the host: %s\n", count,
                 total, host.c_str());
  }
}

}  // namespace

Command addCompileCommand(CLI::App& app) {
  struct Args {
    std::string model;
    std::string output;
    std::vector<std::string> shapes;
    int64_t batch = 0;
    bool print_ir = false;
    bool plan_report = false;
    bool no_channels_last = false;
    bool no_attention_fusion = false;
    bool no_clip_fusion = false;
    bool keep_float16 = false;
    bool quantize_activations = false;
    bool tf32 = false;
    bool fp16 = false;
    bool bf16 = false;
    bool dynamic = false;
    std::string target = "cpu";
    std::vector<std::string> plugins;
    std::vector<std::string> variables;
    std::string gradients_of;
    std::vector<std::string> wrt;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("compile", "Compile an ONNX model into a .kiln package");
  cmd->add_option("model", args->model, "ONNX model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", args->output, "Package to write")->required();
  cmd->add_option("--shape", args->shapes, "Fix an input's shape: NAME:1x3x224x224 (repeatable)");
  cmd->add_option("--batch", args->batch, "Fix every unknown leading input dimension to N")->check(CLI::PositiveNumber);
  cmd->add_flag("--print-ir", args->print_ir, "Print the graph after type inference");
  cmd->add_flag("--plan-report", args->plan_report, "Print the memory plan against its lower bound");
  cmd->add_flag("--no-channels-last", args->no_channels_last,
                "Keep convolutions and pooling in the model's NCHW layout (slower; for comparisons)");
  cmd->add_flag("--no-attention-fusion", args->no_attention_fusion,
                "Keep attention chains as the model's MatMul, Softmax and MatMul steps rather than one fused "
                "Attention step (slower; for comparisons)");
  cmd->add_flag("--no-clip-fusion", args->no_clip_fusion,
                "Keep a Clip after a Conv, Gemm or MatMul as its own step, where NaN passes through as ONNX "
                "specifies (fused, as by default, Clip maps NaN to its min, like onnxruntime and OpenVINO)");
  cmd->add_flag("--keep-float16", args->keep_float16,
                "Compute float16 models in float16 (rounding after every operator; slower) rather than float32");
  cmd->add_flag("--quantize-activations", args->quantize_activations,
                "Compute MatMuls over int8 weights in int8, quantizing activations per row in groups of 32 at run "
                "time (about 2x faster with AVX-512 VNNI; changes results, ~5e-3 relative on a MiniLM)");
  cmd->add_option("--target", args->target, "Device kind to compile for: cpu (default; also runs on sim) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--tf32", args->tf32,
                "cuda target: let products and convolutions use TF32 tensor cores (faster; about 1e-3 relative "
                "error, as onnxruntime's use_tf32)");
  cmd->add_flag("--fp16", args->fp16,
                "cuda target: store tensors in f16 where the cuda kernels take it (f16 tensor cores, f32 sums; "
                "inputs and outputs stay f32; errors of 2e-4 to 6e-2 of an output's magnitude on real models, and "
                "f16's range)");
  cmd->add_flag("--bf16", args->bf16,
                "cuda target: as --fp16 with bf16 (f32's range, 8 bits of mantissa: larger rounding errors, no "
                "overflow); cpu target: products with constant weights multiply in bf16, summing in f32, on CPUs "
                "with AVX-512 BF16 (elsewhere f32)")
      ->excludes("--fp16");
  cmd->add_option_function<std::string>(
         "--precision", [args](const std::string& precision) { args->bf16 = precision == "bf16"; },
         "f32 (default) or bf16 (the same as --bf16)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->excludes("--fp16");
  cmd->add_option("--plugin", args->plugins,
                  "Load a plugin library of custom operators first (repeatable; docs/plugins.md); the package "
                  "records it, and loading the package finds it again in KILN_PLUGIN_PATH or beside the package")
      ->check(CLI::ExistingFile);
  cmd->add_option("--variables", args->variables,
                  "Keep these weights (initializers) as variables, comma-separated or repeated: not folded into "
                  "other constants, and readable and replaceable through a Session without recompiling "
                  "(docs/session.md)")
      ->delimiter(',');
  cmd->add_option("--gradients-of", args->gradients_of,
                  "Also output the gradient of this one-element loss value with respect to each --wrt value, as "
                  "<name>_grad (reverse-mode differentiation; docs/training.md)");
  cmd->add_option("--wrt", args->wrt, "Values (weights or inputs) to differentiate --gradients-of by, comma-separated "
                                      "or repeated")
      ->delimiter(',');
  cmd->add_flag("--dynamic", args->dynamic,
                "Keep unknown input dimensions symbolic: the package is compiled per input signature at run time "
                "(what happens anyway to the dimensions --shape and --batch leave unknown, with a notice)");

  return [args]() {
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& plugin : args->plugins) loadPlugin(plugin);
    OnnxImportOptions options;
    for (const std::string& shape : args->shapes) {
      const size_t colon = shape.rfind(':');
      if (colon == std::string::npos || colon == 0) {
        throw UsageError("--shape " + shape + ": expected NAME:DIMS, e.g. input:1x3x224x224");
      }
      options.input_shapes[shape.substr(0, colon)] = parseDims(shape.substr(colon + 1));
    }
    if (args->batch > 0) options.batch = args->batch;
    // An input dimension left unknown (no --shape, no --batch) is fixed at
    // run time, with a notice below; --dynamic asks for that on purpose.
    // Gradients keep needing them fixed (or --dynamic).
    options.require_static_inputs = !args->dynamic && !args->gradients_of.empty();
    OnnxModel model = importOnnx(args->model, options);
    const std::string unfixed = args->dynamic ? "" : unfixedInputDimension(*model.graph);

    // A progress bar on stderr, shown only for compiles that last more than a
    // second and only on a terminal.
    bool bar_shown = false;
    auto show = [&](const std::string& stage, double fraction) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (seconds < 1.0 || !isatty(STDERR_FILENO)) return;
      const int filled = static_cast<int>(fraction * 30);
      std::fprintf(stderr, "\r[%-30s] %3d%% %-20s %5.1f s", std::string(static_cast<size_t>(filled), '#').c_str(),
                   static_cast<int>(fraction * 100), stage.c_str(), seconds);
      bar_shown = true;
    };
    CompileOptions compile_options;
    compile_options.progress = show;
    compile_options.channels_last = !args->no_channels_last;
    compile_options.fuse_attention = !args->no_attention_fusion;
    compile_options.fuse_clip = !args->no_clip_fusion;
    compile_options.float16_in_float32 = !args->keep_float16;
    compile_options.quantize_activations = args->quantize_activations;
    compile_options.tf32 = args->tf32;
    compile_options.fp16 = args->fp16;
    compile_options.bf16 = args->bf16;
    compile_options.target = args->target;
    compile_options.variables = args->variables;
    compile_options.source_model = args->model;
    compile_options.gradients_of = args->gradients_of;
    compile_options.gradients_wrt = args->wrt;
    compile_options.model_name = std::filesystem::path(args->model).stem().string();
    compile_options.has_kernel = [](const std::string& name) { return KernelRegistry::cpu().find(name) != nullptr; };
    compile_options.evaluate_kernel = &evaluateOnce;
    const CompileReport report = compile(*model.graph, model.opsets, args->output, compile_options);
    if (bar_shown) std::fputc('\n', stderr);
    if (args->print_ir) std::fputs(model.graph->toString().c_str(), stdout);
    if (args->plan_report) {
      std::printf("memory plan: %s\n", report.plan_summary.c_str());
      std::printf("  arena %llu bytes, lower bound %llu bytes, naive %llu bytes\n",
                  static_cast<unsigned long long>(report.arena_bytes),
                  static_cast<unsigned long long>(report.lower_bound_bytes),
                  static_cast<unsigned long long>(report.naive_bytes));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (args->quantize_activations) {
      if (report.int8_matmuls == 0) {
        std::fprintf(stderr, "notice: --quantize-activations found no MatMul over int8 weights: nothing computes in int8\n");
      } else {
        std::printf("int8: %zu MatMuls over int8 weights compute in int8 (activations quantized per row in groups of 32)\n",
                    report.int8_matmuls);
      }
    }
    if (report.runtime_shapes) {
      if (!unfixed.empty()) {
        std::fprintf(stderr, "notice: %s is not fixed: shapes are fixed at run time, per input signature (--shape "
                     "NAME:DIMS or --batch N makes a static package, faster to load)\n", unfixed.c_str());
      } else {
        std::fprintf(stderr, "notice: shapes are fixed at run time (%s)\n", report.runtime_shapes_reason.c_str());
      }
      std::printf("compiled %s -> %s: shapes known at run time, specialized per input signature; %zu constants "
                  "(%llu bytes), %.2f s\n",
                  args->model.c_str(), args->output.c_str(), report.constants,
                  static_cast<unsigned long long>(report.constant_bytes), seconds);
      return 0;
    }
    if (args->target == "cuda") reportHostSteps(report);
    std::printf("compiled %s -> %s: %zu steps, %zu views, %zu constants (%llu bytes), arena %llu bytes, %.2f s\n",
                args->model.c_str(), args->output.c_str(), report.steps, report.views, report.constants,
                static_cast<unsigned long long>(report.constant_bytes),
                static_cast<unsigned long long>(report.arena_bytes), seconds);
    return 0;
  };
}

}  // namespace kiln::cli

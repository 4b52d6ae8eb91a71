// The compiler: a Graph (from ONNX import or built by hand) in, a .kiln
// package out.
//
//   infer types -> remove dead nodes -> schedule (topological) -> storage
//   of every value (constant, input, output, arena, or alias for views) ->
//   memory plan (greedy by size, best fit) -> steps -> package:
//   Executable (ExecutableSpec), Metadata (anchors, program flow), and one
//   TensorData blob per constant, used in place by the runtime.
//
// When every shape is known at compile time the package holds a step
// program. When some shape is only known at run time (a symbolic input
// dimension, or a shape read from an input's values such as a Reshape's
// target), it holds the graph instead, and DynamicExecutor compiles it per
// input signature (src/format/graph_package.h).
// Problems are GraphErrors: every operator without a schema, or without a
// kernel (when `has_kernel` is given), is listed at once.
//
// Thread safety: compile() mutates the graph it is given; one graph per call.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <vector>
#include <string>
#include <string_view>

#include "kiln/graph.h"
#include "kiln/training.h"

namespace kiln {

class ParamMap;

// The opaque blob in which a package with variables keeps its source model
// (CompileOptions::source_model).
inline constexpr std::string_view kSourceModelBlob = "source.onnx";

// Runs kernel `kernel` once on constant inputs and returns its outputs'
// bytes (nullopt: it cannot). kiln::evaluateOnce (src/kernels/
// evaluate_once.h) runs the CPU kernels.
using KernelEvaluator = std::function<std::optional<std::vector<std::vector<std::byte>>>(
    const std::string& kernel, const ParamMap& params, std::span<const TensorInfo> inputs,
    std::span<const std::byte* const> data, std::span<const TensorInfo> outputs)>;

struct CompileOptions {
  std::string model_name = "model";
  // Answers whether the target has a kernel of that name; when set, missing
  // kernels are a compile error rather than a load error.
  std::function<bool(const std::string& kernel)> has_kernel;
  // When set, constant folding evaluates any node whose inputs are all
  // constants (and whose outputs are small) by running its kernel once, so
  // that shape computations written with any operator become constants.
  KernelEvaluator evaluate_kernel;
  // Called as the compiler goes: a stage name and the fraction of the whole
  // compile done (0 to 1), for progress bars.
  std::function<void(const std::string& stage, double fraction)> progress;
  // Run convolutions and pooling on channels-last ([N, H, W, C]) data, where
  // the CPU kernels are fastest (src/passes/channels_last.h). Off keeps every
  // tensor in the model's own layout.
  bool channels_last = true;
  // Fuse attention chains (MatMul, scale, mask, Softmax, MatMul) into one
  // kiln.Attention step (src/passes/attention_fusion.h). Off keeps them as
  // the model wrote them (slower; for comparisons).
  bool fuse_attention = true;
  // Fuse a Clip after a Conv, Gemm or MatMul into it as oneDNN's clip
  // post-op (ReLU6 in MobileNets: one pass over memory fewer). The fused
  // Clip maps NaN to its min, as onnxruntime's fused Conv and OpenVINO do;
  // off, Clip stays a step of its own (or joins a fused elementwise step),
  // where NaN passes through as ONNX specifies.
  bool fuse_clip = true;
  // Compute float16 models in float32 (src/passes/float16_in_float32.h), as
  // onnxruntime does on CPUs; off keeps the f16 kernels (rounding to f16
  // after every operator, and slower).
  bool float16_in_float32 = true;
  // Compute MatMuls over int8 weights (weight-only quantized models) in int8,
  // quantizing their activations per row in groups of 32 as the model runs
  // (src/passes/activation_quantization.h). About twice as fast on CPUs with
  // AVX-512 VNNI; changes results (about 5e-3 relative on a MiniLM), so off
  // by default. cpu target only.
  bool quantize_activations = false;
  // cuda target: let products and convolutions use TF32 tensor cores
  // (operands rounded to 10 bits of mantissa, about 1e-3 relative error;
  // several times faster on NVIDIA GPUs since Ampere). Off: f32 throughout.
  bool tf32 = false;
  // cuda target: store activations and weights in f16 where the cuda
  // kernels take it (products and convolutions on f16 tensor cores, summing
  // in f32; src/passes/float16_storage.h). Inputs and outputs stay f32.
  // Rounds each such tensor to 11 bits (errors of 2e-4 to 6e-2 of an
  // output's magnitude on real models: docs/cuda.md), and f16's range.
  bool fp16 = false;
  // cuda target: the same with bf16 (8 bits of mantissa, f32's range: no
  // overflow where f16 would give infinities; coarser rounding). Not with
  // fp16.
  bool bf16 = false;
  // Weights (initializers of the main graph) to keep as variables: the
  // compiler does not fold them into other constants, and the package gets
  // a save program that reads them back, so that a Session can read and
  // replace them without recompiling (kiln compile --variables;
  // docs/session.md). Static-shape packages only.
  std::vector<std::string> variables;
  // Gradients (docs/training.md): when set, the name of a one-element loss
  // value; the package then also outputs d loss / d v for each value named
  // in gradients_wrt, as "<name>_grad", computed by reverse-mode
  // differentiation of the model (opset 13 or later).
  std::string gradients_of;
  std::vector<std::string> gradients_wrt;
  // Training (docs/training.md): when set, the package's main program is one
  // training step: the model, the gradient of `training->loss` with respect
  // to the trainable weights, and the optimiser's update, written over the
  // weights (which, with the optimiser's state, become variables: a
  // Session reads and writes them). Its outputs are the model's.
  std::optional<TrainingOptions> training;
  // The ONNX file the graph was imported from. A package with variables
  // (or a training package) embeds its bytes as the opaque blob
  // kSourceModelBlob, from which Session.export_onnx writes the model back
  // with the variables' values. Empty: nothing is embedded.
  std::string source_model;
  // The device kind the package is for: "cpu" (also runs on sim) or
  // "cuda". cuda keeps the model's NCHW layout (channels_last is ignored);
  // its packages with run-time shapes are specialized on the GPU.
  std::string target = "cpu";
};

struct CompileReport {
  size_t steps = 0;           // steps of the main program (a control-flow step counts once)
  std::map<std::string, size_t> step_kernels;  // steps per kernel name, sub-programs' (If, Loop, Scan) included
  size_t views = 0;           // nodes that became aliases (no work)
  size_t int8_matmuls = 0;    // MatMuls that quantize_activations computes in int8
  size_t constants = 0;
  uint64_t constant_bytes = 0;
  uint64_t arena_bytes = 0;
  uint64_t lower_bound_bytes = 0;  // peak of simultaneously live intermediates
  uint64_t naive_bytes = 0;        // sum of all intermediates
  std::string plan_summary;        // one line, for --plan-report
  // The model's shapes are only known at run time: the package holds its
  // graph, which DynamicExecutor specializes per input signature (the
  // step, view and arena figures above are then 0).
  bool runtime_shapes = false;
  std::string runtime_shapes_reason;  // the first value found whose shape is not fixed
};

CompileReport compile(Graph& graph, const std::map<std::string, int64_t>& opsets, const std::filesystem::path& output,
                      const CompileOptions& options = {});

}  // namespace kiln

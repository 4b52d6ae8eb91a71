#include "kernels/cpu/setup_helpers.h"
#include "kernels/cuda/depthwise_conv.h"

#include <string>
#include <vector>

#include <fmt/format.h>

#include <iterator>

#include "kernels/cuda/conv_launch.h"
#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/post_ops.h"
#include "kernels/cuda/program_codegen.h"
#include "kernels/cuda/runtime_compiler.h"

namespace kiln::cuda {
namespace {

using setup_helpers::present;

struct DepthwiseState final : KernelState {
  DepthwiseGeometry geometry;
  DeviceProgram post;  // post.ops == 0: none
  bool has_bias = false;
  bool has_residual = false;
  FloatStorage storage = FloatStorage::kF32;  // 16-bit (`--fp16`, `--bf16`): the specialized kernel only
  cudaKernel_t specialized = nullptr;  // kiln_depthwise, or null: the built-in kernel
  unsigned blocks = 0;
};

constexpr unsigned kBlock = 256;


// The value of a per-axis attribute of two entries (or `fallback`), or
// nullopt for any other length.
std::optional<std::vector<int64_t>> pair(const ParamMap& params, const std::string& name, int64_t fallback,
                                         size_t size = 2) {
  std::vector<int64_t> values = params.getInts(name, std::vector<int64_t>(size, fallback));
  if (values.size() != size) return std::nullopt;
  return values;
}

}  // namespace

std::optional<std::string> depthwiseSource(const DepthwiseGeometry& g, const DeviceProgram& post, bool has_bias,
                                           bool has_residual, FloatStorage storage) {
  const uint64_t outputs = static_cast<uint64_t>(g.batch * g.channels * g.out_h * g.out_w);
  const uint64_t inputs = static_cast<uint64_t>(g.batch * g.channels * g.in_h * g.in_w);
  if (outputs == 0 || outputs >= (1ull << 31) || inputs >= (1ull << 31) || !opsAreKnown(post)) return std::nullopt;
  std::string out;
  appendPrelude(out, fmt::format("a {}x{} depthwise convolution over {} channels", g.kernel_h, g.kernel_w, g.channels),
                post);
  // Elements are E; L(v) is v as a float. 16-bit tensors are unsigned
  // shorts converted in registers (the sums stay f32).
  const bool narrow = storage != FloatStorage::kF32;
  if (narrow) {
    appendHalfConversions(out);
    out += fmt::format("typedef unsigned short E;\n#define L(v) {}(v)\n", loadConversion(storage));
  } else {
    out += "typedef float E;\n#define L(v) (v)\n";
  }
  fmt::format_to(std::back_inserter(out),
                 "struct DepthwiseArgs {{ const E* x; const E* w; const E* bias; const E* residual; E* y; }};\n"
                 "extern \"C\" __global__ void __launch_bounds__({0}) kiln_depthwise(DepthwiseArgs a) {{\n"
                 "  const unsigned i = blockIdx.x * {0}u + threadIdx.x;\n"
                 "  if (i >= {1}u) return;\n"
                 "  const unsigned ox = i % {2}u, oy = (i / {2}u) % {3}u, plane = i / {4}u, c = plane % {5}u;\n"
                 "  const E* in = a.x + plane * {6}u;\n"
                 "  const E* taps = a.w + c * {7}u;\n"
                 "  float sum = {8};\n"
                 "  const int y0 = static_cast<int>(oy) * {9} - {10}, x0 = static_cast<int>(ox) * {11} - {12};\n"
                 "#pragma unroll\n"
                 "  for (int ky = 0; ky < {13}; ++ky) {{\n"
                 "    const int iy = y0 + ky * {14};\n"
                 "    if (iy < 0 || iy >= {15}) continue;\n"
                 "#pragma unroll\n"
                 "    for (int kx = 0; kx < {16}; ++kx) {{\n"
                 "      const int ix = x0 + kx * {17};\n"
                 "      if (ix < 0 || ix >= {18}) continue;\n"
                 "      sum += L(in[iy * {18} + ix]) * L(__ldg(taps + ky * {16} + kx));\n"
                 "    }}\n"
                 "  }}\n",
                 kBlock, outputs, g.out_w, g.out_h, g.out_w * g.out_h, g.channels, g.in_h * g.in_w,
                 g.kernel_h * g.kernel_w, has_bias ? "L(__ldg(a.bias + c))" : "0.0f", g.stride_h, g.pad_top, g.stride_w,
                 g.pad_left, g.kernel_h, g.dilation_h, g.in_h, g.kernel_w, g.dilation_w, g.in_w);
  std::string result = "sum";
  if (post.ops > 0) {
    if (has_residual) out += "  const float residual = L(a.residual[i]);\n";
    result = appendInstructions(out, post, "p", [](int k) { return std::string(k == 0 ? "sum" : "residual"); });
  }
  fmt::format_to(std::back_inserter(out), "  a.y[i] = {};\n}}\n",
                 narrow ? fmt::format("{}({})", storeConversion(storage), result) : result);
  return out;
}

std::unique_ptr<KernelState> prepareDepthwiseConv(std::string_view op, const KernelSetup& setup) {
  if (setup.inputs.size() < 2 || setup.outputs.size() != 1) return nullptr;
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& w = setup.inputs[1];
  const TensorInfo& y = setup.outputs[0];
  const std::optional<FloatStorage> storage = floatStorageOf(x.dtype);
  if (!storage || !setup_helpers::presentInputsAre(setup, x.dtype) || y.dtype != x.dtype) return nullptr;
  const bool narrow = *storage != FloatStorage::kF32;
  if (narrow && !runtimeCompilerEnabled()) return nullptr;  // the built-in kernel is f32 only: cuDNN's then
  if (x.shape.size() != 4 || w.shape.size() != 4 || y.shape.size() != 4) return nullptr;
  const int64_t channels = x.shape[1];
  // One filter per channel, one output channel per input channel.
  if (setup.params.getInt("group", 1) != channels || w.shape[0] != channels || w.shape[1] != 1 ||
      y.shape[1] != channels || channels == 1) {
    return nullptr;
  }
  const std::string auto_pad = setup.params.getString("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && !auto_pad.empty()) return nullptr;
  const auto strides = pair(setup.params, "strides", 1);
  const auto dilations = pair(setup.params, "dilations", 1);
  const auto pads = pair(setup.params, "pads", 0, 4);
  if (!strides || !dilations || !pads) return nullptr;
  DepthwiseGeometry g;
  g.batch = x.shape[0];
  g.channels = channels;
  g.in_h = x.shape[2];
  g.in_w = x.shape[3];
  g.out_h = y.shape[2];
  g.out_w = y.shape[3];
  g.kernel_h = static_cast<int>(w.shape[2]);
  g.kernel_w = static_cast<int>(w.shape[3]);
  g.stride_h = static_cast<int>((*strides)[0]);
  g.stride_w = static_cast<int>((*strides)[1]);
  g.dilation_h = static_cast<int>((*dilations)[0]);
  g.dilation_w = static_cast<int>((*dilations)[1]);
  g.pad_top = static_cast<int>((*pads)[0]);
  g.pad_left = static_cast<int>((*pads)[1]);
  // The output the pads give must be the step's (else let cuDNN decide).
  auto size = [](int64_t in, int64_t begin, int64_t end, int64_t kernel, int64_t dilation, int64_t stride) {
    return (in + begin + end - ((kernel - 1) * dilation + 1)) / stride + 1;
  };
  if (g.stride_h < 1 || g.stride_w < 1 || g.dilation_h < 1 || g.dilation_w < 1 ||
      size(g.in_h, (*pads)[0], (*pads)[2], g.kernel_h, g.dilation_h, g.stride_h) != g.out_h ||
      size(g.in_w, (*pads)[1], (*pads)[3], g.kernel_w, g.dilation_w, g.stride_w) != g.out_w ||
      y.numElements() >= (1ull << 31)) {
    return nullptr;
  }
  auto state = std::make_unique<DepthwiseState>();
  state->geometry = g;
  state->has_bias = present(setup, 2);
  state->storage = *storage;
  if (const std::optional<ElementwiseProgram> post = postOpProgram(op, setup.params)) {
    state->post = toDeviceProgram(op, *post);
    state->has_residual = post->input_count > 1;
    if (state->has_residual && (!present(setup, 3) || setup.inputs[3].numElements() != y.numElements())) {
      return nullptr;
    }
  }
  if (runtimeCompilerEnabled()) {
    if (const auto source = depthwiseSource(g, state->post, state->has_bias, state->has_residual, *storage)) {
      static constexpr const char* kNames[] = {"kiln_depthwise"};
      std::string error;
      const auto kernels = compileKernels(*source, kNames, queueOf(setup.queue).compute_capability, &error);
      if (!kernels.empty()) {
        state->specialized = kernels[0];
        state->blocks = static_cast<unsigned>((y.numElements() + kBlock - 1) / kBlock);
      }
    }
  }
  if (narrow && state->specialized == nullptr) return nullptr;
  return state;
}

bool isDepthwiseConv(const KernelState* state) { return dynamic_cast<const DepthwiseState*>(state) != nullptr; }

void runDepthwiseConv(const KernelCall& call) {
  const auto& s = *static_cast<const DepthwiseState*>(call.state);
  if (s.specialized != nullptr) {
    DepthwiseArgs args{call.inputs[0].as<const float>(), call.inputs[1].as<const float>(),
                       s.has_bias ? call.inputs[2].as<const float>() : nullptr,
                       s.has_residual ? call.inputs[3].as<const float>() : nullptr, call.outputs[0].as<float>()};
    void* parameters[] = {&args};
    cudaLaunchKernel(reinterpret_cast<const void*>(s.specialized), dim3(s.blocks), dim3(kBlock), parameters, 0,
                     queueOf(call.queue).stream);
    return;
  }
  launchDepthwiseConv(call.inputs[0].as<const float>(), call.inputs[1].as<const float>(),
                      s.has_bias ? call.inputs[2].as<const float>() : nullptr,
                      s.has_residual ? call.inputs[3].as<const float>() : nullptr, call.outputs[0].as<float>(),
                      s.geometry, s.post, queueOf(call.queue).stream);
}

}  // namespace kiln::cuda

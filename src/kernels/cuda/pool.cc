// MaxPool, AveragePool, GlobalMaxPool and GlobalAveragePool (ONNX) on cuda
// devices, in f32 NCHW, through cuDNN's pooling (cudnnPoolingForward).
//
// prepare reads the attributes (kernel_shape, strides, pads or auto_pad,
// dilations, ceil_mode, count_include_pad), computes the output shape as
// ONNX does, checks it against the output that inference fixed, and builds
// the pooling and tensor descriptors once. run only queues cudnnPoolingForward
// on the queue's stream: it may be captured into a CUDA graph. The global
// pools are pools whose window is the whole spatial extent.
//
// cuDNN's geometry differs from ONNX's:
//   - it needs 2 or 3 spatial axes: a 1-D pool runs as a 2-D one whose first
//     spatial axis has size 1 (window 1, stride 1, no padding);
//   - its padding is symmetric (one value per axis for both ends) and its own
//     output size is floor((in + 2 * pad - window) / stride) + 1, where ONNX
//     has begin and end pads (explicit, or auto_pad SAME_*) and ceil_mode.
//     But cuDNN places output i's window at i * stride - pad, clipped to the
//     input, for every output of the tensor it is given, whatever its size
//     (checked on an H100 with cuDNN 9.19, MaxPool and AveragePool, ceil_mode
//     and SAME_UPPER). So cuDNN pads `begin` and writes the output ONNX
//     defines: max pooling never counts the padding, and average pooling
//     without count_include_pad divides by the taps inside the input, both
//     as ONNX does;
//   - AveragePool with count_include_pad divides by the whole window, in
//     cuDNN as in ONNX, only while every window stays inside the input and
//     min(begin, end) of padding on either side; pools where one reaches
//     further (ceil_mode's extra windows, end pads larger than begin pads
//     that windows use) are refused;
//   - max pooling propagates NaN (CUDNN_PROPAGATE_NAN), as ONNX's reference.
//
// Declined in prepare (KernelUnsupported: the step then runs on the host): dtypes other than f32, f16 and bf16, dynamic shapes,
// more than 3 spatial axes, dilations other than 1, MaxPool's Indices
// output, the count_include_pad pools above, and shapes that do not fit
// cuDNN's int dimensions.
#include <cudnn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cuda/cudnn_support.h"
#include "kernels/cuda/cuda_queue.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

using CudnnInts = std::vector<int>;

enum class PoolKind { kMax, kAverage };

// ---------------------------------------------------------------- descriptors

using PoolingDescriptor =
    Descriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor>;

struct PoolState final : KernelState {
  bool empty = false;  // the output has no elements: nothing to do
  TensorDescriptor x;
  TensorDescriptor y;
  PoolingDescriptor pooling;
};

// ------------------------------------------------------------------ attributes




void checkInput(std::string_view op, const KernelSetup& setup) {
  if (setup.queue == nullptr) throw KernelUnsupported(fmt::format("{} on cuda: prepared without a cuda queue", op));
  if (setup.inputs.size() != 1) {
    throw KernelUnsupported(fmt::format("{} on cuda: expects 1 input, got {}", op, setup.inputs.size()));
  }
  if (setup.outputs.empty()) throw KernelUnsupported(fmt::format("{} on cuda: expects 1 output, got none", op));
  const TensorInfo& x = setup.inputs[0];
  if (x.dtype != DType::kF32 && x.dtype != DType::kF16 && x.dtype != DType::kBF16) {
    throw KernelUnsupported(fmt::format("{} on cuda: {} inputs are not supported yet (f32, f16 and bf16 only); input 0 is {}", op,
                                 dtypeName(x.dtype), typeString(x)));
  }
  if (!x.isStatic()) throw KernelUnsupported(fmt::format("{} on cuda: needs static shapes, input 0 is {}", op, typeString(x)));
  if (x.shape.size() < 3 || x.shape.size() > 5) {
    throw KernelUnsupported(fmt::format("{} on cuda: needs an input [N, C, spatial...] with 1 to 3 spatial axes, got {}", op,
                                 typeString(x)));
  }
}

void checkOutput(std::string_view op, const KernelSetup& setup, const Ints& shape) {
  const TensorInfo expected{setup.inputs[0].dtype, shape};
  if (setup.outputs[0] != expected) {
    throw KernelUnsupported(fmt::format("{} on cuda: the output is {} but the input and attributes give {}", op,
                                 typeString(setup.outputs[0]), typeString(expected)));
  }
}

// ------------------------------------------------------------------ geometry

// A pool as cuDNN computes it, 1-D already given its leading axis of size 1.
struct CudnnPool {
  cudnnPoolingMode_t mode = CUDNN_POOLING_MAX;
  CudnnInts x;  // [N, C, spatial...]
  CudnnInts y;
  CudnnInts window;
  CudnnInts pads;
  CudnnInts strides;

  void addAxis(std::string_view op, int64_t in, int64_t out, int64_t size, int64_t pad, int64_t stride) {
    x.push_back(toInt(op, in));
    y.push_back(toInt(op, out));
    window.push_back(toInt(op, size));
    pads.push_back(toInt(op, pad));
    strides.push_back(toInt(op, stride));
  }
};

CudnnPool startPool(std::string_view op, const Ints& x, size_t spatial, cudnnPoolingMode_t mode) {
  CudnnPool pool;
  pool.mode = mode;
  pool.x = {toInt(op, x[0]), toInt(op, x[1])};
  pool.y = pool.x;
  if (spatial == 1) pool.addAxis(op, 1, 1, 1, 0, 1);
  return pool;
}

// One axis of a windowed pool as ONNX defines it: where the windows start
// (`begin`), how many there are (`out`), and the end padding.
struct AxisWindows {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t out = 0;
};

// As ONNX (and the CPU kernel): SAME_* gives ceil(in / stride) windows;
// otherwise the padded input holds floor windows, one more with ceil_mode
// when they do not fit exactly, as long as that one starts inside the input
// or the begin padding.
AxisWindows axisWindows(std::string_view op, size_t axis, int64_t in, int64_t size, int64_t stride, const Ints& pads,
                        const std::string& auto_pad, bool ceil_mode) {
  const size_t n = pads.size() / 2;
  AxisWindows w;
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    w.out = (in + stride - 1) / stride;
    const int64_t total = std::max<int64_t>(0, (w.out - 1) * stride + size - in);
    w.begin = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    w.end = total - w.begin;
    return w;
  }
  if (auto_pad != "VALID") {
    w.begin = pads[axis];
    w.end = pads[axis + n];
  }
  const int64_t room = in + w.begin + w.end - size;
  if (room < 0) {
    throw KernelUnsupported(fmt::format("{} on cuda: spatial axis {}: the kernel spans {} elements but the padded input has "
                                 "{}",
                                 op, axis, size, in + w.begin + w.end));
  }
  w.out = room / stride + 1;
  if (ceil_mode && room % stride != 0) {
    ++w.out;
    if ((w.out - 1) * stride >= in + w.begin) --w.out;
  }
  return w;
}

void checkAutoPad(std::string_view op, const std::string& auto_pad) {
  if (auto_pad != "NOTSET" && auto_pad != "VALID" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" &&
      !auto_pad.empty()) {
    throw KernelUnsupported(fmt::format("{} on cuda: auto_pad is '{}', not NOTSET, VALID, SAME_UPPER or SAME_LOWER", op,
                                 auto_pad));
  }
}

void checkDilations(std::string_view op, const ParamMap& params, size_t spatial) {
  const Ints dilations = sizedInts(op, params, "dilations", spatial, 1, Ints(spatial, 1));
  if (std::any_of(dilations.begin(), dilations.end(), [](int64_t d) { return d != 1; })) {
    throw KernelUnsupported(fmt::format("{} on cuda: cuDNN pools have no dilations; dilations [{}] are not supported", op,
                                 fmt::join(dilations, ", ")));
  }
}

// count_include_pad: cuDNN and ONNX both divide by the window size while
// every window stays inside the input and min(begin, end) of padding (the
// padding on both of cuDNN's ends that ONNX counts too).
void checkIncludedPadding(std::string_view op, size_t axis, int64_t in, int64_t size, int64_t stride,
                          const AxisWindows& w) {
  const int64_t last_window_end = (w.out - 1) * stride - w.begin + size;
  if (last_window_end > in + std::min(w.begin, w.end)) {
    throw KernelUnsupported(fmt::format("{} on cuda: spatial axis {}: with count_include_pad the last window reaches past "
                                 "the end padding (ceil_mode or asymmetric pads), which cuDNN would count",
                                 op, axis));
  }
}

cudnnPoolingMode_t poolingMode(PoolKind kind, bool count_include_pad) {
  if (kind == PoolKind::kMax) return CUDNN_POOLING_MAX;
  return count_include_pad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
}

CudnnPool windowedPool(std::string_view op, const KernelSetup& setup, PoolKind kind) {
  const ParamMap& params = setup.params;
  const Ints& x = setup.inputs[0].shape;
  const size_t n = x.size() - 2;
  if (!params.has("kernel_shape")) throw KernelUnsupported(fmt::format("{} on cuda: needs the 'kernel_shape' attribute", op));
  const Ints kernel = sizedInts(op, params, "kernel_shape", n, 1, {});
  const Ints strides = sizedInts(op, params, "strides", n, 1, Ints(n, 1));
  const Ints pads = sizedInts(op, params, "pads", 2 * n, 0, Ints(2 * n, 0));
  checkDilations(op, params, n);
  const std::string auto_pad = params.getString("auto_pad", "NOTSET");
  checkAutoPad(op, auto_pad);
  const bool ceil_mode = params.getInt("ceil_mode", 0) != 0;
  const bool count_include_pad = kind == PoolKind::kAverage && params.getInt("count_include_pad", 0) != 0;
  CudnnPool pool = startPool(op, x, n, poolingMode(kind, count_include_pad));
  for (size_t i = 0; i < n; ++i) {
    const AxisWindows w = axisWindows(op, i, x[i + 2], kernel[i], strides[i], pads, auto_pad, ceil_mode);
    if (count_include_pad) checkIncludedPadding(op, i, x[i + 2], kernel[i], strides[i], w);
    pool.addAxis(op, x[i + 2], w.out, kernel[i], w.begin, strides[i]);
  }
  return pool;
}

CudnnPool globalPool(std::string_view op, const KernelSetup& setup, PoolKind kind) {
  const Ints& x = setup.inputs[0].shape;
  const size_t n = x.size() - 2;
  CudnnPool pool = startPool(op, x, n, poolingMode(kind, false));
  for (size_t i = 0; i < n; ++i) pool.addAxis(op, x[i + 2], 1, x[i + 2], 0, 1);
  return pool;
}

// The output shape that `pool` gives, as ONNX spells it (1-D without the
// leading axis).
Ints onnxOutputShape(const CudnnPool& pool, size_t spatial) {
  Ints shape{pool.y[0], pool.y[1]};
  shape.insert(shape.end(), pool.y.end() - static_cast<std::ptrdiff_t>(spatial), pool.y.end());
  return shape;
}

// ------------------------------------------------------------ descriptors

void setTensor(const TensorDescriptor& descriptor, DType dtype, const CudnnInts& dims) {
  check(cudnnSetTensorNdDescriptorEx(descriptor.get(), CUDNN_TENSOR_NCHW, cudnnDataType(dtype),
                                     static_cast<int>(dims.size()), dims.data()),
        "cudnnSetTensorNdDescriptorEx");
}

std::unique_ptr<KernelState> makeState(std::string_view op, const KernelSetup& setup, const CudnnPool& pool) {
  checkOutput(op, setup, onnxOutputShape(pool, setup.inputs[0].shape.size() - 2));
  auto state = std::make_unique<PoolState>();
  if (setup.outputs[0].numElements() == 0) {
    state->empty = true;
    return state;
  }
  if (setup.inputs[0].numElements() == 0) {
    throw KernelUnsupported(fmt::format("{} on cuda: no kernel for the empty input {}", op, typeString(setup.inputs[0])));
  }
  setTensor(state->x, setup.inputs[0].dtype, pool.x);
  setTensor(state->y, setup.inputs[0].dtype, pool.y);
  check(cudnnSetPoolingNdDescriptor(state->pooling.get(), pool.mode, CUDNN_PROPAGATE_NAN,
                                    static_cast<int>(pool.window.size()), pool.window.data(), pool.pads.data(),
                                    pool.strides.data()),
        "cudnnSetPoolingNdDescriptor");
  return state;
}

// ------------------------------------------------------------------ prepare

std::unique_ptr<KernelState> prepareMaxPool(const KernelSetup& setup) {
  constexpr std::string_view op = "MaxPool";
  checkInput(op, setup);
  if (setup.outputs.size() != 1) {
    throw KernelUnsupported("MaxPool on cuda: the Indices output is not supported (only Y)");
  }
  return makeState(op, setup, windowedPool(op, setup, PoolKind::kMax));
}

std::unique_ptr<KernelState> prepareAveragePool(const KernelSetup& setup) {
  constexpr std::string_view op = "AveragePool";
  checkInput(op, setup);
  if (setup.outputs.size() != 1) throw KernelUnsupported("AveragePool on cuda: expects 1 output");
  return makeState(op, setup, windowedPool(op, setup, PoolKind::kAverage));
}

std::unique_ptr<KernelState> prepareGlobal(std::string_view op, const KernelSetup& setup, PoolKind kind) {
  checkInput(op, setup);
  if (setup.outputs.size() != 1) throw KernelUnsupported(fmt::format("{} on cuda: expects 1 output", op));
  return makeState(op, setup, globalPool(op, setup, kind));
}

std::unique_ptr<KernelState> prepareGlobalMaxPool(const KernelSetup& setup) {
  return prepareGlobal("GlobalMaxPool", setup, PoolKind::kMax);
}

std::unique_ptr<KernelState> prepareGlobalAveragePool(const KernelSetup& setup) {
  return prepareGlobal("GlobalAveragePool", setup, PoolKind::kAverage);
}

// --------------------------------------------------------------------- run

// Queues the pool. run cannot report errors: a cuDNN call that fails here
// leaves the output as it was.
void runPool(const KernelCall& call) {
  const auto& state = static_cast<const PoolState&>(*call.state);
  if (state.empty) return;
  const CudaQueue& queue = queueOf(call.queue);
  const float one = 1.0f;
  const float zero = 0.0f;
  cudnnPoolingForward(queue.cudnn, state.pooling.get(), &one, state.x.get(), call.inputs[0].data, &zero,
                      state.y.get(), call.outputs[0].data);
}

}  // namespace

void registerCudaPoolKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"MaxPool", &prepareMaxPool, &runPool});
  registry.add(KernelDef{"AveragePool", &prepareAveragePool, &runPool});
  registry.add(KernelDef{"GlobalMaxPool", &prepareGlobalMaxPool, &runPool});
  registry.add(KernelDef{"GlobalAveragePool", &prepareGlobalAveragePool, &runPool});
}

}  // namespace kiln::cuda
